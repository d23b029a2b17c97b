"""One connection budget for every listener of a process, whichever server runs it.

A process's file descriptors are shared by all its listeners, by the connections to
engines and by the rest (the store, logs, scrapes, agent streams). A flood of
connections on one listener must not take the descriptors another one, or an
established request, needs: so each listener serves at most its share at once, and
the shares together leave :data:`FD_RESERVE` free (nginx's ``worker_connections``,
Envoy's overload manager).

* The rule (:func:`connection_budget`): the soft open-file limit is raised to the hard
  one; the admin listener gets a sixteenth of what the reserve leaves (at least 16, at
  most :data:`ADMIN_MAX_CONNECTIONS`); the client listener half of the rest (each
  proxied request holds its client's connection and one to an engine), or
  ``router.max_connections`` when set.
* A connection past its listener's share is accepted and closed at once, with a
  one-write ``503`` where the listener speaks plain HTTP (:func:`turn_away`): no task,
  no buffer, no wait; established connections are not touched.
* Accepting retries while the process is out of descriptors (:class:`Acceptor`).

The deadlines that free a share's slots (TLS handshake, request head, body) are the
servers' own: :mod:`llmgw.http.server` and :mod:`llmgw.http.hyper`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import socket

import attrs
import trio

from llmgw.http.asgi import error_body

__all__ = [
    "ADMIN_MAX_CONNECTIONS",
    "FD_RESERVE",
    "Acceptor",
    "ConnectionBudget",
    "connection_budget",
    "turn_away",
]

log = logging.getLogger("llmgw.http")

#: File descriptors kept back from every share: the store, logs, scrapes, the agent
#: port and its streams, an operator's request to /healthz.
FD_RESERVE = 128
#: The admin listener's share at most: operators, scrapers and dashboards, not clients.
ADMIN_MAX_CONNECTIONS = 256
#: No share is smaller than this, however low the limit (a few must still be served).
_FLOOR = 16
#: accept() errors that mean "out of resources for now": wait and retry.
_ACCEPT_RETRY = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
#: At most one accept-failure line per this many seconds (EMFILE comes in storms).
_ACCEPT_LOG_EVERY = 10.0
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
)


@attrs.frozen
class ConnectionBudget:
    """Connections served at once, per listener."""

    #: The client listener (plain or TLS; each of a process's workers has its own).
    client: int
    #: The admin listener.
    admin: int


def connection_budget(configured: int = 0) -> ConnectionBudget:
    """The shares of this process's open-file limit (the module's rule); `configured`
    (router.max_connections), when not 0, is the client listener's, and the limit is
    then left as it is."""
    soft = _open_file_limit(raise_soft=not configured)
    if soft is None:  # not POSIX
        return ConnectionBudget(client=configured or 1024, admin=ADMIN_MAX_CONNECTIONS)
    left = max(0, soft - FD_RESERVE)
    admin = max(_FLOOR, min(ADMIN_MAX_CONNECTIONS, left // 16))
    client = configured or max(_FLOOR, (left - admin) // 2)
    return ConnectionBudget(client=client, admin=admin)


def _open_file_limit(*, raise_soft: bool) -> int | None:
    """The soft open-file limit, first raised to the hard one with `raise_soft`
    (systemd's default soft limit is 1024, far below what a proxy needs; the hard one is
    usually far higher)."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if raise_soft and (hard == resource.RLIM_INFINITY or hard > soft):
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return int(soft)


class Acceptor:
    """One listener's accepts: out of descriptors (or memory), wait and retry, logging
    the failures at most once per :data:`_ACCEPT_LOG_EVERY`."""

    __slots__ = ("_failed", "_logged_at", "listener")

    def __init__(self, listener: trio.SocketListener) -> None:
        self.listener = listener
        self._failed = 0
        self._logged_at = -math.inf

    async def accept(self) -> trio.SocketStream:
        while True:
            try:
                return await self.listener.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_RETRY:
                    raise
                self._failed += 1
                now = trio.current_time()
                if now - self._logged_at >= _ACCEPT_LOG_EVERY:
                    log.error(
                        "accept failed %d time(s) (%s): out of file descriptors or memory;"
                        " retrying every 100 ms",
                        self._failed,
                        exc,
                    )
                    self._logged_at, self._failed = now, 0
                await trio.sleep(0.1)  # the resource frees as connections end: retry then


def detach(stream: trio.SocketStream) -> socket.socket:
    """The stdlib socket under `stream`, non-blocking, `stream` left without it."""
    trio_sock = stream.socket
    sock = socket.socket(trio_sock.family, trio_sock.type, fileno=trio_sock.detach())
    sock.setblocking(False)
    return sock


def turn_away(sock: socket.socket, cap: int, *, plain: bool = True) -> None:
    """Close a connection past its listener's share at once; with `plain`, after a
    ``503`` in one non-blocking write (a TLS client gets no HTTP before its handshake,
    so just the close)."""
    if plain:
        body = error_body(
            f"the server is at its connection limit ({cap}); retry shortly",
            "server_error",
            "service_unavailable",
        )
        with contextlib.suppress(OSError):
            sock.send(_BUSY % (len(body), body))
    sock.close()
