"""The client listener's settings: llmgw's own HTTP server in front of a router.

Shared by llmgw-server and its worker processes; kept apart from llmgw.server so a
worker does not import the control plane to read them.
"""

from __future__ import annotations

from llmgw.config import Config
from llmgw.http.server import HttpServerConfig
from llmgw.router.core import Router

#: File descriptors kept back from the connection cap: the store, logs, scrapes, the
#: agent port and its streams.
FD_RESERVE = 128


def connection_cap(configured: int) -> int:
    """Connections each listener serves at once: `configured` (router.max_connections),
    or with 0 what the open-file limit allows.

    The soft limit is first raised to the hard one (systemd's default soft limit is
    1024, far below what a proxy needs; the hard one is usually far higher). Each
    proxied request holds its client's connection and one to an engine, so the cap
    is half of what the reserve leaves."""
    if configured:
        return configured
    try:
        import resource
    except ImportError:  # not POSIX
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(16, (soft - FD_RESERVE) // 2)


def client_listener_config(config: Config, router: Router, name: str) -> HttpServerConfig:
    """llmgw's own HTTP server's settings for the listener `name` of `router`."""
    timeouts = config.router.timeouts
    # Streams last minutes: a response may take as long as the proxy's phases let it;
    # but a client that takes none of it for `idle` is cut, like an engine that sends
    # nothing for that long.
    timed_out = router.metrics.client_timeouts
    return HttpServerConfig(
        header_timeout=timeouts.client_header,
        body_timeout=timeouts.client_body,
        body_timeout_key="router.timeouts.client_body",
        send_timeout=timeouts.idle,
        max_connections=connection_cap(config.router.max_connections),
        graceful_timeout=config.router.drain_timeout,
        on_header_timeout=timed_out.labels(name, "header").inc,
        on_body_timeout=timed_out.labels(name, "body").inc,
    )
