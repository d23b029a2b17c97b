"""A follower instance's control-plane API: the leader's.

Instances on one store (llmgw.control.leadership) each serve the admin API, but only
the leader knows the fleet: on the others the routes that read or change it (nodes,
replicas, placement, models; the dashboard's fleet and models pages) are passed on to
the leader's admin listener as they came (its admin key or login checks: sessions
live in the shared store; its answer), so ``llmgw-ctl``, scripts and the dashboard
work against any instance. What is each instance's own (its metrics, health, endpoints, admission
queues, keys and usage in the shared store, the profiler) stays local. With no leader
known (an election under way) those routes answer 503 with Retry-After.
"""

from __future__ import annotations

import json

from llmgw.control.leadership import Leadership
from llmgw.http.asgi import App, Receive, Scope, Send
from llmgw.http.forward import Forward

__all__ = ["CONTROL_PATHS", "ToLeader"]

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


def _control(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in CONTROL_PATHS)


class ToLeader:
    """`app`, but for the control-plane routes while this instance does not lead."""

    def __init__(self, app: App, leadership: Leadership) -> None:
        self.app = app
        self.leadership = leadership
        self._forwards: dict[str, Forward] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _control(scope["path"]) or self.leadership.leading():
            await self.app(scope, receive, send)
            return
        leader = self.leadership.current_leader()
        if leader is None or not leader.admin_address:
            body = json.dumps(
                {
                    "error": {
                        "message": "no instance leads the control plane now; retry shortly",
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
                        (b"retry-after", b"1"),
                        (b"content-length", b"%d" % len(body)),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        address = leader.admin_address
        forward = self._forwards.get(address)
        if forward is None:
            forward = self._forwards[address] = Forward(f"http://{address}", host=address)
        await forward(scope, receive, send)
