"""The operator's cordons and drains, kept in the store.

A cordon is applied to the inventory at once; its store write is queued and made in
order by one task (a drain from a synchronous caller cannot await the write), and a
caller that must know it is stored awaits :meth:`Cordons.persisted`. What is still
queued at shutdown is written then (within FLUSH_TIMEOUT). The stored cordons are read
back into a fresh inventory before the first agent is accepted, so a node cordoned
before a restart is cordoned when its agent reconnects. Without a store they live in
memory only.
"""

from __future__ import annotations

import logging
import math
from typing import Protocol

import attrs
import trio

from llmgw.control.inventory import Inventory
from llmgw.store.base import StoredCordon, StoreError

__all__ = ["FLUSH_TIMEOUT", "CordonChange", "CordonStore", "Cordons"]

log = logging.getLogger("llmgw.control")

# How long a shutdown waits for cordon changes still queued for the store.
FLUSH_TIMEOUT = 5.0


class CordonStore(Protocol):
    """Where cordons persist (a :class:`~llmgw.store.base.Store` is one)."""

    async def put_cordon(self, node_id: str, *, drain: bool) -> None: ...

    async def delete_cordon(self, node_id: str) -> bool: ...

    async def list_cordons(self) -> list[StoredCordon]: ...


@attrs.define
class CordonChange:
    """One cordon change for the store: `drain` None removes the node's row."""

    node_id: str
    drain: bool | None
    done: trio.Event = attrs.field(factory=trio.Event)
    error: StoreError | None = None


class Cordons:
    """Cordon changes on their way to `store`, and the stored ones read back."""

    def __init__(self, store: CordonStore | None) -> None:
        self.store = store
        self._persist, self._persisting = trio.open_memory_channel[CordonChange](math.inf)

    def queue(self, node_id: str, drain: bool | None) -> CordonChange:
        """The store write of a change already made (nothing to write without a store)."""
        change = CordonChange(node_id, drain)
        if self.store is not None:
            self._persist.send_nowait(change)
        return change

    async def persisted(self, change: CordonChange) -> StoreError | None:
        """Wait until `change` is in the store (at once without one); the
        :class:`~llmgw.store.base.StoreError` it failed with, else None. The change is
        made either way: only a restart would undo a failed one."""
        if self.store is None:
            return None
        await change.done.wait()
        return change.error

    async def run(self) -> None:
        """Write the queued changes in order, until cancelled (then flush what is left)."""
        current: CordonChange | None = None
        try:
            async for change in self._persisting:
                current = change
                await self._write(change)
                current = None
        finally:
            # At shutdown, what is queued (or was cut off mid-write) is still written:
            # a drain's caller does not wait for it, and a restart would undo it.
            with trio.CancelScope(shield=True), trio.move_on_after(FLUSH_TIMEOUT):
                if current is not None:
                    await self._write(current)
                while True:
                    try:
                        change = self._persisting.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                        break
                    await self._write(change)

    async def _write(self, change: CordonChange) -> None:
        assert self.store is not None
        try:
            if change.drain is None:
                await self.store.delete_cordon(change.node_id)
            else:
                await self.store.put_cordon(change.node_id, drain=change.drain)
        except StoreError as exc:
            log.error("node %s: cordon not stored (lost at a restart): %s", change.node_id, exc)
            change.error = exc
        finally:
            change.done.set()  # whoever waits is told, even when cancelled

    async def restore(self, inventory: Inventory) -> None:
        """Apply the stored cordons to `inventory` (before any agent registers)."""
        assert self.store is not None
        try:
            stored = await self.store.list_cordons()
        except StoreError as exc:
            log.error("cordons not read from the store (nodes start uncordoned): %s", exc)
            return
        for cordon in stored:
            log.info(
                "node %s: %s (from the store)",
                cordon.node_id,
                "draining" if cordon.drain else "cordoned",
            )
            inventory.restore_cordon(cordon.node_id, drain=cordon.drain)
