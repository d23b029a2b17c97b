"""The agent's configuration: an optional TOML file, overridden by command-line flags.

::

    server = "ctl.example.com:7443"
    node_id = "gpu-1"
    fabrics = ["ib-a"]
    heartbeat = "5s"

    [labels]
    rack = "r7"

    [tls]
    cert = "/etc/llmgw/pki/gpu-1.pem"
    key = "/etc/llmgw/pki/gpu-1.key"
    ca = "/etc/llmgw/pki/ca.pem"

Every key has a flag of the same name (``node_id`` is ``--node-id``, ``labels`` is
``--label``, ``fabrics`` ``--fabric``, ``tls.cert`` ``--tls-cert``). Layered like the
server's configuration: a flag replaces the file's value, except that ``--label``
flags merge into the file's labels key by key (tables merge, arrays replace).

The file is structured by the configuration's one structuring path
(llmgw.config.structure_as: strict types, durations, unknown keys named with a "did you
mean"), then :func:`check` names every bad value by its key;
the command line checks its flags with the same rules under the flags' names.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from llmgw import units
from llmgw.agent.discovery import fake_gpus
from llmgw.config import ConfigError, read_toml, structure_as
from llmgw.logs import FORMATS, LEVELS
from llmgw.units import Seconds

__all__ = [
    "FLAGS",
    "LOG_LEVELS",
    "AgentConfig",
    "AgentTlsFiles",
    "check",
    "load_file",
    "overlay",
    "structure",
]

LOG_LEVELS = LEVELS


@attrs.frozen
class AgentTlsFiles:
    """The agent's own certificate and key, and the CA that signed the server's
    certificate (None: the system's roots). Cert and key go together; each may come
    from the file or a flag, so the pair is checked once both are merged."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None


@attrs.frozen
class AgentConfig:
    """What the operator says about the agent; None where the agent finds out itself
    (node id: the hostname; address: the interface that routes to the server)."""

    server: str | None = None
    node_id: str | None = None
    address: str | None = None
    labels: dict[str, str] = attrs.field(factory=dict)
    fabrics: tuple[str, ...] = ()
    fake_gpus: str | None = None
    state_dir: str | None = None
    heartbeat: Seconds = attrs.field(default=Seconds(5.0))
    max_backoff: Seconds = attrs.field(default=Seconds(30.0))
    shutdown_grace: Seconds = attrs.field(default=Seconds(15.0))
    log_level: str = "info"
    log_format: str = "text"
    tls: AgentTlsFiles = AgentTlsFiles()


#: The flag that sets each key, for messages about flags.
FLAGS = {
    "server": "--server",
    "node_id": "--node-id",
    "address": "--address",
    "labels": "--label",
    "fabrics": "--fabric",
    "fake_gpus": "--fake-gpus",
    "state_dir": "--state-dir",
    "heartbeat": "--heartbeat",
    "max_backoff": "--max-backoff",
    "shutdown_grace": "--shutdown-grace",
    "log_level": "--log-level",
    "log_format": "--log-format",
    "tls.cert": "--tls-cert",
    "tls.key": "--tls-key",
    "tls.ca": "--tls-ca",
}


# -- rules: each returns what is wrong with one value, or None ----------------------------


def servers(value: str) -> list[str]:
    """The addresses of a `server` value: one, or several separated by commas."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _server(value: str | None) -> str | None:
    if value is None:
        return None
    if not servers(value):
        return f"a server address is needed (e.g. 127.0.0.1:7443), got {value!r}"
    for part in servers(value):
        try:
            address = units.parse_address(part)
        except ValueError as exc:
            return str(exc)
        if not address.port:
            return f"a port is needed, got {part!r}"
        if not address.host:
            return f"a host is needed (e.g. 127.0.0.1:7443), got {part!r}"
    return None


def _node_id(value: str | None) -> str | None:
    return "must not be empty" if value is not None and not value.strip() else None


def _address(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        ipaddress.ip_address(value.strip("[]"))
    except ValueError as exc:
        return str(exc)
    return None


def _labels(value: Mapping[str, str]) -> str | None:
    if any(not k.strip() for k in value):
        return "a label needs a non-empty key"
    return None


def _fabrics(value: Iterable[str]) -> str | None:
    return "a fabric name must not be empty" if any(not f.strip() for f in value) else None


def _fake_gpus(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        fake_gpus(value)
    except ValueError as exc:
        return str(exc)
    return None


def _at_least(minimum: float) -> Callable[[float], str | None]:
    def rule(value: float) -> str | None:
        if value < minimum:
            return f"must be at least {minimum:g}s, got {units.format_duration(value)}"
        return None

    return rule


def _log_level(value: str) -> str | None:
    return None if value in LOG_LEVELS else f"must be one of {', '.join(LOG_LEVELS)}"


def _log_format(value: str) -> str | None:
    return None if value in FORMATS else f"must be one of {', '.join(FORMATS)}"


def _file(value: str | None) -> str | None:
    return f"no such file: {value}" if value is not None and not Path(value).is_file() else None


# The flags' bounds: a heartbeat below 50 ms floods the server, a backoff cap below
# 100 ms turns a server restart into a reconnect storm.
_RULES: dict[str, Callable[[Any], str | None]] = {
    "server": _server,
    "node_id": _node_id,
    "address": _address,
    "labels": _labels,
    "fabrics": _fabrics,
    "fake_gpus": _fake_gpus,
    "heartbeat": _at_least(0.05),
    "max_backoff": _at_least(0.1),
    "shutdown_grace": _at_least(0.0),
    "log_level": _log_level,
    "log_format": _log_format,
    "tls.cert": _file,
    "tls.key": _file,
    "tls.ca": _file,
}


def _get(config: AgentConfig, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def check(
    config: AgentConfig,
    keys: Iterable[str] | None = None,
    *,
    name: Callable[[str], str] = str,
) -> list[str]:
    """What is wrong with `config` (only `keys`, when given), as ``name(key): problem``
    lines: file keys by default, ``name=FLAGS.__getitem__`` to speak of flags."""
    problems = []
    for key in _RULES if keys is None else keys:
        rule = _RULES.get(key)  # state_dir has none: created, or refused, at start
        problem = rule(_get(config, key)) if rule is not None else None
        if problem is not None:
            problems.append(f"{name(key)}: {problem}")
    return problems


# -- loading and layering -----------------------------------------------------------------


def structure(data: Mapping[str, Any]) -> AgentConfig:
    """An AgentConfig from a parsed file; raises ConfigError naming every bad key, with
    a "did you mean" for an unknown one."""
    return structure_as(data, AgentConfig)


def load_file(path: str | os.PathLike[str]) -> AgentConfig:
    """The agent configuration in the TOML file at `path`, checked; raises ConfigError
    whose problems each start with ``config file PATH:`` and name the key."""
    data = read_toml(path)  # its errors already name the file
    try:
        config = structure(data)
    except ConfigError as exc:
        problems = list(exc.problems)
    else:
        problems = check(config)
    if problems:
        raise ConfigError([f"config file {os.fspath(path)}: {p}" for p in problems])
    return config


def overlay(config: AgentConfig, flags: Mapping[str, Any]) -> AgentConfig:
    """`config` with the values of `flags` (keys as in the file, ``tls.cert`` for the
    TLS files): each replaces the file's value, except labels, merged key by key."""
    changes: dict[str, Any] = {}
    tls: dict[str, Any] = {}
    for key, value in flags.items():
        if key.startswith("tls."):
            tls[key.removeprefix("tls.")] = value
        elif key == "labels":
            changes[key] = {**config.labels, **value}
        else:
            changes[key] = value
    if tls:
        changes["tls"] = attrs.evolve(config.tls, **tls)
    return attrs.evolve(config, **changes)
