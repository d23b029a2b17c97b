"""The servers an agent may dial, and which one next.

An agent is given one server or several (``--server a:7443,b:7443``: instances on one
store, of which one leads the control plane, llmgw.control.leadership). It dials the
current one; a connection that fails, or a server that falls silent or is a deposed
leader, moves it to the next in turn; a server that does not lead names the one that
does, and the agent dials that one next, whether or not it was in its list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

from llmgw.transport.base import AgentConnector, ServerConnection

__all__ = ["Servers"]


class Servers:
    """An AgentConnector over several addresses (see the module docstring)."""

    def __init__(self, addresses: Sequence[str], make: Callable[[str], AgentConnector]) -> None:
        if not addresses:
            raise ValueError("at least one server address is needed")
        self.addresses = list(addresses)
        self._make = make
        self._current = 0

    @property
    def current(self) -> str:
        return self.addresses[self._current]

    def connect(self) -> AbstractAsyncContextManager[ServerConnection]:
        return self._make(self.current).connect()

    def failed(self) -> None:
        """The current server did not do: the next one in turn."""
        self._current = (self._current + 1) % len(self.addresses)

    def prefer(self, address: str) -> bool:
        """Dial `address` next (added when it is new); False when it is the current one
        already (a server naming itself: nothing to move to)."""
        if address == self.current:
            return False
        if address not in self.addresses:
            self.addresses.append(address)
        self._current = self.addresses.index(address)
        return True
