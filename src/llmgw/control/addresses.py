"""Where the server believes a node and its engines are (docs/transport.md, "Trusting
agents"): pure decisions, no I/O.

* A node's *registered address* is the one it declares at Register, held against the
  address its connection comes from (:func:`registered_address`).
* An engine's URL is the server's own: the registered address of the replica's head
  node and the port the server assigned it (:func:`engine_url`). The URL an agent
  reports is only checked against it (:func:`same_url`); a report that disagrees is
  refused (:meth:`llmgw.control.reconciler.Reconciler.shard_reported`).
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

__all__ = ["AddressRefused", "engine_url", "registered_address", "same_url"]

# A DNS name: labels of letters, digits and hyphens (RFC 1123), 253 characters at most.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?")


class AddressRefused(ValueError):
    """The address a node declares cannot be its registered address; says why."""


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def registered_address(declared: str, peer: str | None, identity: str | None) -> str:
    """The address the server takes for a node that declares `declared`, connecting from
    `peer` (an IP address; None without a network, as on the in-memory stub), with the
    verified certificate identity `identity` (None without TLS).

    * Declared nothing: the peer address.
    * Declared the peer address, or a loopback address while connecting over loopback
      (the same machine: nodes there bind addresses of 127/8 of their own): taken.
    * Declared another address: taken only from a node with a verified certificate (a
      node whose management network is not its route to the server; the operator who
      issued the certificate vouches for it). Without TLS anyone can claim any node
      id, so an address the connection does not show is refused: a node could
      otherwise have the router send client prompts to a host of its choosing.

    Raises :class:`AddressRefused`."""
    declared = declared.strip()
    if not declared:
        if peer is None:
            raise AddressRefused("the node declares no address and its connection shows none")
        return peer
    ip = _ip(declared)
    if ip is None and not _HOSTNAME.fullmatch(declared):
        raise AddressRefused(f"address {declared!r} is neither an IP address nor a host name")
    if ip is not None and (ip.is_unspecified or ip.is_multicast):
        raise AddressRefused(f"address {declared!r} is not one an engine can be reached at")
    if peer is None:
        return declared
    peer_ip = _ip(peer)
    if (
        ip is not None
        and peer_ip is not None
        and (ip == peer_ip or (ip.is_loopback and peer_ip.is_loopback))
    ):
        return str(ip)
    if identity is not None:
        return declared
    raise AddressRefused(
        f"the node declares address {declared!r} but connects from {peer}: without agent_tls "
        "a node's address is the one it connects from (declare that one, or none; with "
        "agent_tls a node with a certificate may declare another)"
    )


def engine_url(address: str, port: int) -> str:
    """The URL of the engine on `port` of the node at `address` (what the router uses)."""
    host = address.strip("[]")
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def same_url(reported: str, expected: str) -> bool:
    """Whether an agent's `reported` engine URL names `expected` (engine_url's): the
    same scheme, host (an IP address compared as one, a name without case) and port,
    with no path, query or credentials besides."""
    try:
        got, want = urllib.parse.urlsplit(reported), urllib.parse.urlsplit(expected)
        got_port, want_port = got.port, want.port
    except ValueError:
        return False
    if (
        got.scheme.lower() != want.scheme
        or got.username is not None
        or got.password is not None
        or got.path not in ("", "/")
        or got.query
        or got.fragment
        or got_port != want_port
        or got.hostname is None
        or want.hostname is None
    ):
        return False
    got_ip, want_ip = _ip(got.hostname), _ip(want.hostname)
    if got_ip is not None or want_ip is not None:
        return got_ip == want_ip
    return got.hostname.lower().rstrip(".") == want.hostname.lower().rstrip(".")
