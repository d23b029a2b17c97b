"""A follower instance's control-plane API: the leader's.

Instances on one store (llmgw.control.leadership) each serve the admin API, but only
the leader knows the fleet: on the others the routes that read or change it (nodes,
replicas, placement, models; the dashboard's overview, fleet and models pages) are
passed on to the leader's admin listener as they came (its admin key or login checks:
sessions live in the shared store; its answer), so ``llmgw-ctl``, scripts and the
dashboard work against any instance. What is each instance's own (its metrics, health,
endpoints, admission queues, keys and usage in the shared store, the profiler) stays
local.

With ``[admin_tls]`` the leader is reached over https, as every admin listener then
speaks it: its certificate is checked against ``admin_tls.client_ca`` (else the
system's CAs), and with a ``client_ca`` (the leader asks for a client certificate)
this instance presents its own admin certificate, which must then allow client
authentication (``scripts/make_certs.sh``'s does).

With no leader known (an election under way), or a leader that does not answer within
:data:`FORWARD_SHARE` of the lease (killed, paused, partitioned), those routes answer
503 with Retry-After: never a long hang or a 502 while the lease passes to another.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import ssl

from llmgw.control.leadership import Leadership
from llmgw.http.asgi import App, Receive, Scope, Send
from llmgw.http.forward import Forward

__all__ = ["CONTROL_PATHS", "FORWARD_SHARE", "LeaderTls", "ToLeader", "leader_tls"]

log = logging.getLogger("llmgw.admin")

#: The admin paths (and those under them) that belong to the leader: the API's and the
#: dashboard's fleet and models pages and their actions.
CONTROL_PATHS = (
    "/api/v1/nodes",
    "/api/v1/replicas",
    "/api/v1/placement",
    "/api/v1/models",
    "/fleet",
    "/models",
    "/nodes",
)
#: ...and these exactly: the dashboard's overview (the fleet's summary is on it).
CONTROL_PAGES = ("/",)
#: The one rule for how long a follower waits for the leader: this share of the lease.
#: The leader renews every third of it, so one that has not answered by half of it
#: has most likely missed a renewal; the client hears 503 well within the lease, and
#: a retry after the rest of it reaches whoever leads then.
FORWARD_SHARE = 0.5
#: Seconds between lines about one leader not answering.
LOG_EVERY = 30.0


def _control(path: str) -> bool:
    return path in CONTROL_PAGES or any(
        path == p or path.startswith(p + "/") for p in CONTROL_PATHS
    )


def leader_tls(cert: str, key: str, ca: str | None) -> ssl.SSLContext:
    """The context a follower reaches the leader's https admin listener with (module
    docstring): trusting `ca` (else the system's CAs), presenting `cert` with one."""
    context = ssl.create_default_context(cafile=ca)
    if ca is not None:
        context.load_cert_chain(cert, key)
    return context


class LeaderTls:
    """:func:`leader_tls` of the admin listener's files, made again when they change:
    the listener takes renewed files on SIGHUP, and so does what presents them to the
    leader (checked per fleet call, off the hot path: a few stat calls)."""

    def __init__(self, cert: str, key: str, ca: str | None) -> None:
        self.files = tuple(f for f in (cert, key, ca) if f is not None)
        self.cert, self.key, self.ca = cert, key, ca
        self._seen = self._stamps()
        self.context = leader_tls(cert, key, ca)

    def _stamps(self) -> tuple[float, ...]:
        return tuple(os.stat(f).st_mtime for f in self.files)

    def renewed(self) -> bool:
        """Whether the files changed since the context was made (then it is made
        again; a failure keeps the old one, logged)."""
        try:
            stamps = self._stamps()
            if stamps == self._seen:
                return False
            self.context = leader_tls(self.cert, self.key, self.ca)
        except (OSError, ssl.SSLError) as exc:
            log.warning("admin_tls: the renewed files were not taken for the leader: %s", exc)
            return False
        finally:
            with contextlib.suppress(OSError):
                self._seen = self._stamps()  # one warning per change, not per call
        return True


class ToLeader:
    """`app`, but for the control-plane routes while this instance does not lead."""

    def __init__(self, app: App, leadership: Leadership, *, tls: LeaderTls | None = None) -> None:
        self.app = app
        self.leadership = leadership
        self.tls = tls
        self._forwards: dict[str, Forward] = {}
        self._said: dict[str, float] = {}  # leader -> when its silence was last logged

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _control(scope["path"]) or self.leadership.leading():
            await self.app(scope, receive, send)
            return
        leader = self.leadership.current_leader()
        if leader is None or not leader.admin_address:
            await self._unavailable(send, "no instance leads the control plane now")
            return
        address = leader.admin_address
        if self.tls is not None and self.tls.renewed():
            # New clients present the new certificate; the old ones' pooled connections
            # go with them (requests under way finish on them).
            self._forwards = {}
        forward = self._forwards.get(address)
        if forward is None:

            async def unanswered(send: Send, error: Exception | None) -> None:
                now = self.leadership.clock()
                if now - self._said.get(address, -math.inf) >= LOG_EVERY:  # not per request
                    self._said[address] = now
                    log.warning(
                        "the leader's admin listener %s did not answer: %s",
                        address,
                        error or f"nothing within {forward_timeout:g}s",
                    )
                await self._unavailable(
                    send, "the instance leading the control plane did not answer"
                )

            forward_timeout = self.leadership.ttl * FORWARD_SHARE
            forward = self._forwards[address] = Forward(
                f"{'https' if self.tls is not None else 'http'}://{address}",
                host=address,
                timeout=forward_timeout,
                deadline=forward_timeout,
                verify=self.tls.context if self.tls is not None else True,
                unanswered=unanswered,
            )
        await forward(scope, receive, send)

    async def _unavailable(self, send: Send, why: str) -> None:
        # Retry once the lease as last read has run out (another instance may lead by
        # then), at least a second from now.
        leader = self.leadership.current_leader()
        wait = 1.0 if leader is None else leader.until - self.leadership.clock()
        body = json.dumps(
            {
                "error": {
                    "message": f"{why}; retry shortly",
                    "type": "server_error",
                    "param": None,
                    "code": "no_leader",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"retry-after", b"%d" % max(1, math.ceil(wait))),
                    (b"content-length", b"%d" % len(body)),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def aclose(self) -> None:
        for forward in self._forwards.values():
            await forward.aclose()
