"""The control plane's routes: nodes (list, one, drain, cordon, uncordon, forget),
replicas and placement.

They answer 404 with a clear message (code ``no_control_plane``) when the server runs
in router-only mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio
from quart import Response

from llmgw.admin.contract import ApiError, json_reply
from llmgw.control import views

if TYPE_CHECKING:
    from llmgw.admin.context import AdminContext
    from llmgw.control.controller import Controller

ROUTER_ONLY = "no control plane: this server runs in router-only mode"


def _controller(app: AdminContext) -> Controller:
    if app.controller is None:
        raise ApiError(404, ROUTER_ONLY, "no_control_plane")
    return app.controller


async def nodes(app: AdminContext) -> Response:
    """Every node with its GPUs, engines and shards."""
    return json_reply(200, views.nodes_json(_controller(app)))


async def node(app: AdminContext, id: str) -> Response:
    """One node, by id."""
    controller = _controller(app)
    node_id = id
    body = views.node_json(controller, node_id)
    if body is None:
        raise ApiError(404, f"no node {node_id!r}", "node_not_found")
    return json_reply(200, body)


async def replicas(app: AdminContext) -> Response:
    """Every replica, and per model desired against actual counts."""
    return json_reply(200, views.replicas_json(_controller(app)))


async def placement(app: AdminContext) -> Response:
    """Why replicas of each model that misses some could not be placed."""
    return json_reply(200, views.placement_json(_controller(app)))


#: Seconds a drain request waits for the reconciler's next pass (none runs while the
#: controller settles after a start: then the answer says only that the drain began).
DRAIN_VIEW_WAIT = 5.0


async def drain_node(app: AdminContext, id: str) -> Response:
    """Cordon the node and move its replicas elsewhere, make before break."""
    controller = _controller(app)
    node_id = id
    if controller.inventory.get(node_id) is None:
        raise ApiError(404, f"no node {node_id!r}", "node_not_found")
    controller.drain_node(node_id)
    # Answered after the pass that tries to place the replacements, bounded: the view
    # then says whether the drain can proceed (drain_blocked), not only that it began.
    with trio.move_on_after(DRAIN_VIEW_WAIT):
        await controller.next_pass()
    return json_reply(202, views.node_json(controller, node_id))


async def cordon_node(app: AdminContext, id: str) -> Response:
    """Cordon the node without moving its replicas; a drain in progress stops."""
    return await _set_cordon(app, id, on=True)


async def uncordon_node(app: AdminContext, id: str) -> Response:
    """Let placement use the node again; a drain in progress stops."""
    return await _set_cordon(app, id, on=False)


async def _set_cordon(app: AdminContext, node_id: str, *, on: bool) -> Response:
    controller = _controller(app)
    if controller.inventory.get(node_id) is None:
        raise ApiError(404, f"no node {node_id!r}", "node_not_found")
    change = controller.cordon_node(node_id, on)
    body = views.node_json(controller, node_id)  # before the await: it may go meanwhile
    failure = await controller.persisted(change)
    if failure is not None:
        done = "cordoned" if on else "uncordoned"
        raise ApiError(
            503,
            f"node {node_id!r} is {done} now, but the store failed (a restart would "
            f"undo it): {failure}",
            "store_unavailable",
        )
    return json_reply(200, body)


async def forget_node(app: AdminContext, id: str) -> Response:
    """Remove a node that is gone from the inventory; refused (409) while its agent
    is connected or replicas are placed on it."""
    controller = _controller(app)
    node_id = id
    last = views.node_json(controller, node_id)
    # A cordon read back from the store for a node that never came back: only
    # forgetting it removes the row.
    stored_only = last is None and controller.inventory.stored_cordon(node_id) is not None
    if last is None and not stored_only:
        raise ApiError(404, f"no node {node_id!r}", "node_not_found")
    refusal = None if stored_only else controller.forget_refusal(node_id)
    if refusal is not None:
        raise ApiError(409, refusal, "node_in_use")
    failure = await controller.persisted(controller.forget_node(node_id))
    if failure is not None:
        raise ApiError(
            503,
            f"node {node_id!r} is forgotten now, but the store failed to drop its cordon "
            f"(a restart would bring the cordon back): {failure}",
            "store_unavailable",
        )
    return json_reply(200, last) if last is not None else Response("", 204)
