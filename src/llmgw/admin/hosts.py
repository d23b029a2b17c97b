"""The Host names the admin listener answers to; any other Host is 421 (issue #17).

DNS rebinding: a page at attacker.example whose name is made to resolve to the
listener's address reaches it from the operator's browser, but its requests still
carry ``Host: attacker.example``. The listener answers only to names no outside page
can point at it: the loopback names, the address it was configured with and the
addresses it is bound to, ``admin_hosts``, and off loopback the machine's own names
(its host name and FQDN: what Prometheus or an operator types to reach it). A
wildcard bind (``0.0.0.0``, ``::``, ``:PORT``) names no address of its own, so it
answers to the addresses of the machine's interfaces instead. Anything else an
operator reaches it by (a DNS alias, a load balancer's name) goes in ``admin_hosts``.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable, Sequence

import trio

from llmgw import units
from llmgw.admin.web import LOOPBACK_HOSTS

__all__ = ["allowed_hosts", "interface_addresses", "machine_names", "wildcard"]

log = logging.getLogger("llmgw.admin")

#: How long the resolver may take to give the machine's FQDN before the listener
#: starts without it (a broken resolver would otherwise hold up the start).
RESOLVER_TIMEOUT = 2.0


def wildcard(address: str) -> bool:
    """Whether a listen address (``HOST:PORT``) binds every interface."""
    host = units.parse_address(address).host
    ip = _ip(host)
    return not host or (ip is not None and ip.is_unspecified)


def allowed_hosts(
    admin_hosts: Iterable[str],
    configured: str,
    bound: Sequence[str],
    machine: Iterable[str] = (),
) -> frozenset[str]:
    """The names for the admin listener's Host allowlist, lower case: the loopback
    names, `admin_hosts`, the host of the `configured` listen address and of each
    `bound` one (wildcards left out: they name no address), and `machine`'s names
    (:func:`machine_names`; none for a loopback listener)."""
    names = set(LOOPBACK_HOSTS) | {h.lower() for h in admin_hosts}
    for address in (configured, *bound):
        if not wildcard(address):
            names.add(units.parse_address(address).host.lower())
    names |= {n.lower() for n in machine if n}
    return frozenset(names)


async def machine_names(wildcard_bind: bool) -> set[str]:
    """The machine's host name and FQDN, and with `wildcard_bind` its interfaces'
    addresses. The FQDN (and, where /proc does not list the interfaces, the host
    name's addresses) come from the resolver: asked in a thread, for RESOLVER_TIMEOUT."""
    names = {socket.gethostname()}
    local = interface_addresses() if wildcard_bind else set()
    names |= local

    def resolve() -> set[str]:
        found = {socket.getfqdn()}
        if wildcard_bind and not local:  # not Linux: what the host name resolves to
            try:
                infos = socket.getaddrinfo(socket.gethostname(), None)
            except OSError:
                infos = []
            found |= {str(info[4][0]) for info in infos}
        return found

    with trio.move_on_after(RESOLVER_TIMEOUT):
        return names | await trio.to_thread.run_sync(resolve, abandon_on_cancel=True)
    log.warning(
        "the resolver gave no FQDN for this machine within %ss: the admin listener "
        "answers to its host name %r and the names in admin_hosts",
        RESOLVER_TIMEOUT,
        socket.gethostname(),
    )
    return names


def interface_addresses() -> set[str]:
    """The addresses of this machine's interfaces, as Linux lists them in /proc (the
    local IPv4 routes and the IPv6 addresses); empty elsewhere."""
    found: set[str] = set()
    try:
        with open("/proc/net/fib_trie") as f:
            trie = f.read().splitlines()
    except OSError:
        trie = []
    previous = ""
    for line in trie:
        text = line.strip()
        if text.startswith("|--"):
            previous = text[3:].strip()
        elif text == "/32 host LOCAL" and _ip(previous) is not None:
            found.add(previous)  # a /32 LOCAL route is an address of this machine
    try:
        with open("/proc/net/if_inet6") as f:
            inet6 = f.read().splitlines()
    except OSError:
        inet6 = []
    for line in inet6:
        fields = line.split()
        if fields and len(fields[0]) == 32:
            found.add(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
