"""The client port shared by workers: SO_REUSEPORT sockets.

The control process binds each client address once without listening
(:func:`reserve`): that fixes the port (the kernel's pick for port 0) and holds it
while workers come and go, and a socket that does not listen is given no
connections. Each worker binds the same addresses with SO_REUSEPORT and listens
(:func:`listen`); the kernel spreads new connections over the listening sockets.
"""

from __future__ import annotations

import socket

import trio

from llmgw import units

__all__ = ["addresses", "addresses_of", "listen", "reserve"]

#: The accept backlog of each worker's socket (trio's default for its listeners).
BACKLOG = 0xFFFF


def _socket(family: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            # As trio's listeners: one socket per family, so v6 takes only v6.
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def reserve(address: str) -> list[socket.socket]:
    """Bound, not listening, SO_REUSEPORT sockets for `address` (a `listen` value:
    every interface's address family when it names no host). Raises OSError."""
    parsed = units.parse_address(address)
    infos = socket.getaddrinfo(
        parsed.bind_host, parsed.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    seen: set[tuple[int, object]] = set()
    out: list[socket.socket] = []
    try:
        for family, _, _, _, sockaddr in infos:
            if (family, sockaddr) in seen:
                continue
            seen.add((family, sockaddr))
            sock = _socket(family)
            out.append(sock)
            sock.bind(sockaddr)
    except BaseException:
        for sock in out:
            sock.close()
        raise
    return out


def addresses(sockets: list[socket.socket]) -> list[str]:
    """The bound addresses as HOST:PORT (``[HOST]:PORT`` for IPv6)."""
    return [str(units.Address(*s.getsockname()[:2])) for s in sockets]


def addresses_of(listeners: list[trio.SocketListener]) -> list[str]:
    return [str(units.Address(*lst.socket.getsockname()[:2])) for lst in listeners]


def listen(bound: list[str]) -> list[trio.SocketListener]:
    """Listening SO_REUSEPORT sockets on exactly the addresses `bound` names (what
    :func:`addresses` gave for the reserved ones). Raises OSError."""
    out: list[trio.SocketListener] = []
    try:
        for address in bound:
            parsed = units.parse_address(address)
            family = socket.AF_INET6 if ":" in parsed.host else socket.AF_INET
            sock = _socket(family)
            try:
                sock.bind((parsed.host, parsed.port))
                sock.listen(BACKLOG)
            except BaseException:
                sock.close()
                raise
            out.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
    except BaseException:
        for listener in out:
            listener.socket.close()
        raise
    return out
