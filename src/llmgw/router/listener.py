"""The client listener's settings: llmgw's own HTTP server in front of a router.

Shared by llmgw-server and its worker processes; kept apart from llmgw.server so a
worker does not import the control plane to read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.config import Config
from llmgw.http.budget import FD_RESERVE as FD_RESERVE
from llmgw.http.budget import connection_budget
from llmgw.http.server import HttpServerConfig
from llmgw.router.core import Router

if TYPE_CHECKING:
    from llmgw.http.hyper import HyperConfig


def connection_cap(configured: int) -> int:
    """Connections the client listener serves at once: `configured`
    (router.max_connections), or with 0 its share of the open-file limit
    (:func:`llmgw.http.budget.connection_budget`, the one rule for every listener)."""
    return connection_budget(configured).client


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
        max_body_bytes=config.router.max_body_bytes,
        graceful_timeout=config.router.drain_timeout,
        on_header_timeout=timed_out.labels(name, "header").inc,
        on_body_timeout=timed_out.labels(name, "body").inc,
    )


def hypercorn_listener_config(config: Config, *, admin: bool) -> HyperConfig:
    """Hypercorn's settings for the admin listener (`admin`) or a TLS client listener:
    the same deadlines as the plain client port's, and the listener's share of the
    connection budget."""
    from llmgw.http.hyper import HyperConfig  # hypercorn only where a listener needs it

    timeouts = config.router.timeouts
    budget = connection_budget(config.router.max_connections)
    return HyperConfig(
        header_timeout=timeouts.client_header,
        body_timeout=timeouts.client_body,
        send_timeout=timeouts.idle,
        handshake_timeout=timeouts.tls_handshake,
        max_connections=budget.admin if admin else budget.client,
        graceful_timeout=config.router.drain_timeout,
    )
