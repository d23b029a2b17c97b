"""Loading a configuration: its layers in order, structured, then checked.

A configuration is built in layers, each a nested dict merged over the one before
(tables merge key by key, arrays replace whole):

1. the built-in defaults (the schema's attrs defaults, DESIGN §3),
2. the TOML file,
3. ``LLMGW_`` environment variables, ``__`` for nesting (:mod:`.env`),
4. command-line flags.

The merged dict is structured (:func:`.structure.structure_as`: types, shapes,
unknown keys) and then checked (:func:`.rules.check`: every rule, each stated next to
its fields), and every problem is named with the exact key that has it. Anything that
would fail confusingly at request time fails here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from llmgw.config.env import env_overlay
from llmgw.config.files import merge, read_toml
from llmgw.config.rules import check
from llmgw.config.schema import Config
from llmgw.config.structure import ConfigError, structure_as, unstructure

__all__ = ["load", "structure"]


def structure(data: Mapping[str, Any]) -> Config:
    """A Config from a merged dict, not yet checked; raises ConfigError naming every
    bad key."""
    return structure_as(data, Config)


def load(
    path: str | os.PathLike[str] | None = None,
    *,
    data: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults, then the file (or `data`), then `LLMGW_` variables, then `overrides`.

    Raises ConfigError listing every problem with the key that has it.
    """
    merged: Any = unstructure(Config())
    if path is not None:
        merged = merge(merged, read_toml(path))
    if data is not None:
        merged = merge(merged, dict(data))
    merged = env_overlay(os.environ if environ is None else environ, merged)
    if overrides:
        merged = merge(merged, dict(overrides))
    config = structure(merged)
    problems = check(config)
    if problems:
        raise ConfigError(problems)
    return config
