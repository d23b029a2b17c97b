"""An engine's log file under ``<state_dir>/logs`` (llmgw.agent.supervisor): its output
verbatim, flushed per chunk, rotated once to ``.1`` past ``log_max_bytes``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

__all__ = ["EngineLog"]


class EngineLog:
    """An engine's log: appended to, flushed per chunk, rotated once to ``.1``."""

    def __init__(self, path: Path, max_bytes: int, f: Any, size: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._f = f
        self._size = size

    @classmethod
    async def open(cls, path: Path, max_bytes: int) -> EngineLog:
        f = await trio.open_file(path, "ab")
        return cls(path, max_bytes, f, await f.tell())

    async def write(self, data: bytes | bytearray) -> None:
        await self._f.write(data)
        await self._f.flush()
        self._size += len(data)
        if self._size > self.max_bytes:
            await self._f.aclose()
            await trio.Path(self.path).replace(trio.Path(f"{self.path}.1"))
            self._f = await trio.open_file(self.path, "ab")
            self._size = 0

    async def aclose(self) -> None:
        await self._f.aclose()
