"""Serving an ASGI app with hypercorn on sockets llmgw bound: the admin listener, and
any listener with TLS (HTTP/2 where the client offers it by ALPN, HTTP/1.1 else).

The sockets are bound by :func:`llmgw.server.serve` (port 0 in tests, so the port is
known before serving), then handed to hypercorn's trio worker. With TLS, the
certificate and key are read into one :class:`ReloadableTls` context, which
:meth:`ReloadableTls.reload` reads again in place: connections from then on get the
new certificate, those open keep theirs (SIGHUP, :mod:`llmgw.server`).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from llmgw.http.asgi import App

__all__ = ["ReloadableTls", "TlsFiles", "cut_stalled_writes", "serve_hypercorn"]

log = logging.getLogger("llmgw.http")


@attrs.frozen
class TlsFiles:
    """A listener's certificate chain and key (PEM), and the CA its clients'
    certificates must be signed by (None: no client certificate asked for)."""

    cert: str
    key: str
    client_ca: str | None = None


class ReloadableTls:
    """One server-side TLS context for a listener, reloadable in place."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # RFC 9113 §9.2: HTTP/2 needs TLS 1.2 or later and no compression.
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_COMPRESSION
        context.set_alpn_protocols(["h2", "http/1.1"])
        if files.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
        self.context = context
        self.reload()

    def reload(self) -> None:
        """Read the files again; raises (keeping the old ones) when they do not load.
        A client CA can be added or replaced this way; dropping `client_ca`
        altogether needs a restart."""
        self.context.load_cert_chain(self.files.cert, self.files.key)
        if self.files.client_ca is not None:
            self.context.load_verify_locations(self.files.client_ca)


class _Config(HypercornConfig):
    """Hypercorn's configuration with llmgw's TLS context instead of one it builds."""

    def __init__(self, tls: ReloadableTls | None) -> None:
        super().__init__()
        self._tls = tls

    @property
    def ssl_enabled(self) -> bool:
        return self._tls is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return None if self._tls is None else self._tls.context


def cut_stalled_writes(sock: socket.socket, stall: float) -> None:
    """Connections accepted on `sock` are reset by the kernel once the client has
    taken none of what was sent for `stall` seconds (TCP_USER_TIMEOUT covers data
    held back by a zero window; accepted sockets inherit it). Hypercorn writes with
    cancellation shielded, so a deadline in the app could not stop a write to a client
    that stopped reading; this ends it, and the app sees a disconnect."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, option, max(1, round(stall * 1000)))


def _stdlib(listener: trio.SocketListener) -> socket.socket:
    # Hypercorn takes stdlib sockets; a duplicate leaves the caller's socket its own.
    return socket.socket(fileno=os.dup(listener.socket.fileno()))


async def serve_hypercorn(
    app: App,
    listeners: Sequence[trio.SocketListener],
    *,
    tls: ReloadableTls | None = None,
    keep_alive_timeout: float = 5.0,
    read_timeout: float | None = None,
    send_timeout: float | None = None,
    graceful_timeout: float = 3.0,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `listeners` until `shutdown_trigger` returns; requests in flight
    then get `graceful_timeout`. `read_timeout` bounds each wait for client bytes,
    `send_timeout` how long the client may take nothing of a response
    (:func:`cut_stalled_writes`)."""
    config = _Config(tls)
    config.keep_alive_timeout = keep_alive_timeout
    config.read_timeout = None if read_timeout is None else max(1, round(read_timeout))
    config.graceful_timeout = graceful_timeout
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = logging.getLogger("llmgw.http.hypercorn")
    # Without a lifespan protocol to speak, hypercorn's startup wait would be 60 s.
    config.startup_timeout = 10.0
    stdlib = [_stdlib(listener) for listener in listeners]
    if send_timeout is not None:
        for sock in stdlib:
            cut_stalled_writes(sock, send_timeout)
    sockets = Sockets(
        secure_sockets=stdlib if tls is not None else [],
        insecure_sockets=[] if tls is not None else stdlib,
        quic_sockets=[],
    )
    wrapped: Any = wrap_app(app, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    try:
        await worker_serve(
            wrapped,
            config,
            sockets=sockets,
            shutdown_trigger=shutdown_trigger,
            task_status=task_status,
        )
    finally:
        for sock in stdlib:
            sock.close()
