"""File discovery: endpoints listed in a file another program writes (a deployment
tool, a sidecar watching a scheduler), read again whenever it changes.

The file is TOML with the configuration file's own ``[[endpoints]]`` tables (an entry
moves between the two verbatim), or JSON (``{"endpoints": [...]}``) when its name ends
in ``.json``, for programs that write JSON more easily. Both parsers come with Python;
YAML would be a new dependency.

Every `interval` the file's identity, size and modification time are looked at; when
they changed its content is read and hashed, and a new content is structured by the
configuration's one path and applied as a diff (llmgw.endpoint_sources). A file that
does not parse, breaks a rule, is missing, or lacks the ``endpoints`` key (a file
truncated to nothing on its way to being rewritten; ``endpoints = []`` lists none) is
logged with the reason and the last good set is kept: a half-written file never
empties the fleet. Writers should still replace the file by a rename.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tomllib

import attrs
import trio

from llmgw.config import (
    JSON_WORDING,
    TOML_WORDING,
    ConfigError,
    EndpointConfig,
    check,
    structure_as,
)
from llmgw.endpoint_sources import EndpointSources, outside_config_problems

__all__ = ["DiscoveryFile", "FileDiscovery", "parse_discovery"]

log = logging.getLogger("llmgw.discovery")


@attrs.frozen
class DiscoveryFile:
    """What a discovery file holds."""

    endpoints: tuple[EndpointConfig, ...]

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        seen: set[str] = set()
        for i, endpoint in enumerate(self.endpoints):
            if endpoint.id in seen:
                found.append(f"endpoints[{i}].id: endpoint id {endpoint.id!r} is used twice")
            seen.add(endpoint.id)
            found.extend(outside_config_problems(endpoint, f"endpoints[{i}]"))
        return found


def parse_discovery(text: str, *, as_json: bool) -> tuple[EndpointConfig, ...]:
    """The endpoints of a discovery file's content; ConfigError says what is wrong."""
    try:
        data = json.loads(text) if as_json else tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, TOMLDecodeError
        raise ConfigError([f"not valid {'JSON' if as_json else 'TOML'}: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"expected an object with 'endpoints', got {type(data).__name__}"])
    if "endpoints" not in data:
        raise ConfigError(
            ["endpoints: missing (an empty or truncated file?); endpoints = [] lists none"]
        )
    parsed = structure_as(data, DiscoveryFile, JSON_WORDING if as_json else TOML_WORDING)
    problems = check(parsed)
    if problems:
        raise ConfigError(problems)
    return parsed.endpoints


@attrs.define
class _Look:
    """What one look at the file found: its identity, and its content when read."""

    signature: tuple[int, int, int] | None
    text: str | None = None
    error: str | None = None


class FileDiscovery:
    """Watches `path` every `interval` seconds and gives `sources` its endpoints."""

    def __init__(self, path: str, interval: float, sources: EndpointSources) -> None:
        self.path = path
        self.interval = interval
        self.sources = sources
        self.as_json = path.lower().endswith(".json")
        self._signature: tuple[int, int, int] | None = None
        self._digest: bytes | None = None
        self._error: str | None = None  # the last one logged, said once
        # The last good set, and how many times one was applied (a view and tests).
        self.endpoints: tuple[EndpointConfig, ...] = ()
        self.applied = 0

    def _look(self, known: tuple[int, int, int] | None) -> _Look:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            return _Look(None, error=f"cannot read it: {exc.strerror or exc}")
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if signature == known:
            return _Look(signature)
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
            return _Look(signature, raw.decode("utf-8"))
        except OSError as exc:
            return _Look(None, error=f"cannot read it: {exc.strerror or exc}")
        except UnicodeDecodeError as exc:
            return _Look(signature, error=f"not UTF-8: {exc}")

    def _take(self, look: _Look) -> bool:
        """Apply what a look found; whether a new set was applied."""
        if look.error is not None:
            self._signature = look.signature
            self._refuse(look.error)
            return False
        if look.text is None:  # unchanged
            return False
        self._signature = look.signature
        digest = hashlib.sha256(look.text.encode()).digest()
        if digest == self._digest:  # touched, same content
            return False
        try:
            endpoints = parse_discovery(look.text, as_json=self.as_json)
        except ConfigError as exc:
            self._refuse("; ".join(exc.problems))
            return False
        self._digest = digest
        self._error = None
        self.endpoints = endpoints
        self.applied += 1
        for refused in self.sources.set_discovered(endpoints):
            log.error("discovery %s: %s", self.path, refused)
        log.info(
            "discovery %s: %d endpoints (%s)",
            self.path,
            len(endpoints),
            ", ".join(e.id for e in endpoints) or "none",
        )
        return True

    def _refuse(self, reason: str) -> None:
        if reason != self._error:
            self._error = reason
            kept = ", ".join(e.id for e in self.endpoints) or "none"
            log.error("discovery %s: %s; keeping the last good set (%s)", self.path, reason, kept)
        # Read again at the next look even if unchanged: the reason may be gone.
        self._signature = None

    def poll(self) -> bool:
        """One look, now (at start: the set is there before the first request)."""
        return self._take(self._look(self._signature))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Look every `interval` until cancelled."""
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            look = await trio.to_thread.run_sync(self._look, self._signature)
            self._take(look)
