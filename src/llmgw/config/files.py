"""Configuration as files: reading TOML, writing the effective configuration back as
TOML (``--print-config``) with its secrets hidden, and laying one layer over another.
"""

from __future__ import annotations

import os
import tomllib
from typing import TYPE_CHECKING, Any

import tomli_w

from llmgw.config.structure import ConfigError, unstructure
from llmgw.units import HIDDEN

if TYPE_CHECKING:
    from llmgw.config.schema import Config

__all__ = ["dump_toml", "hide_profile_keys", "merge", "read_toml"]


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML file at `path`; ConfigError naming the file when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError([f"config file {os.fspath(path)}: not found"]) from None
    except OSError as exc:
        raise ConfigError([f"config file {os.fspath(path)}: {exc.strerror}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"config file {os.fspath(path)}: invalid TOML: {exc}"]) from None


def merge(base: Any, over: Any) -> Any:
    """`over` laid over `base`, as configuration layers are: tables merge key by key,
    anything else (arrays too) replaces; neither argument is changed."""
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = merge(base[key], value) if key in base else value
        return merged
    return over


def hide_profile_keys(models: Any) -> None:
    """Replace every deployment profile's `api_key` in unstructured `models` by HIDDEN."""
    for model in models:
        for profile in model.get("profiles", ()):
            if profile.get("api_key") is not None:
                profile["api_key"] = HIDDEN


def dump_toml(config: Config) -> str:
    """The effective configuration as TOML that :func:`llmgw.config.load` reads back
    unchanged, but for secrets (endpoints' `api_key` and `headers` values, the tracing
    exporter's `headers` values, deployment profiles' `api_key`): shown as HIDDEN."""
    data = unstructure(config)
    hide_profile_keys(data.get("models", ()))
    for holder in (*data.get("endpoints", ()), data["tracing"]):
        if "api_key" in holder:
            holder["api_key"] = HIDDEN
        holder["headers"] = dict.fromkeys(holder.get("headers", {}), HIDDEN)
        if not holder["headers"]:
            del holder["headers"]
    return tomli_w.dumps(data)
