"""Configuration: the schema with its defaults and rules, loading, overlays and checks.

One idea per module:

* :mod:`.schema`: the tables as attrs classes, their defaults, what each key means,
  and the rules about their values, each next to its fields.
* :mod:`.structure`: the one structuring path (shape check, strict converter, every
  problem named by its key in llmgw's words) for configuration files, stored models,
  the workers' catalog and the admin API's bodies.
* :mod:`.rules`: how a rule is worded, and :func:`check`, the one walk that asks each
  table for its problems.
* :mod:`.env`: the ``LLMGW_A__B`` layer.
* :mod:`.files`: TOML in and out (``--print-config``, secrets hidden), and how one
  layer merges over another.
* :mod:`.loading`: :func:`load`, the layers in order.
* :mod:`.annotations`: what an annotation is, for every walker over the schema.

Every name is importable from ``llmgw.config`` itself.
"""

from __future__ import annotations

from llmgw.config.env import ENV_PREFIX, env_overlay
from llmgw.config.files import dump_toml, hide_profile_keys, merge, read_toml
from llmgw.config.loading import load, structure
from llmgw.config.rules import check
from llmgw.config.schema import (
    DEFAULT_STORE_URL,
    PLACEMENT_POLICIES,
    AdmissionConfig,
    AffinityConfig,
    AuthConfig,
    Band,
    Config,
    ControlConfig,
    DiscoveryConfig,
    EndpointConfig,
    LogConfig,
    RouterConfig,
    RoutingProfile,
    ScoringConfig,
    StoreConfig,
    Timeouts,
    TlsConfig,
    TracingConfig,
)
from llmgw.config.structure import (
    JSON_WORDING,
    REMOVED_KEYS,
    TOML_WORDING,
    ConfigError,
    Wording,
    converter,
    shape_problems,
    structure_as,
)
from llmgw.domain.catalog import AutoscaleConfig, DeploymentProfile, ModelConfig
from llmgw.units import HIDDEN, Bytes, Seconds

__all__ = [
    "DEFAULT_STORE_URL",
    "ENV_PREFIX",
    "HIDDEN",
    "JSON_WORDING",
    "PLACEMENT_POLICIES",
    "REMOVED_KEYS",
    "TOML_WORDING",
    "AdmissionConfig",
    "AffinityConfig",
    "AuthConfig",
    "AutoscaleConfig",
    "Band",
    "Bytes",
    "Config",
    "ConfigError",
    "ControlConfig",
    "DeploymentProfile",
    "DiscoveryConfig",
    "EndpointConfig",
    "LogConfig",
    "ModelConfig",
    "RouterConfig",
    "RoutingProfile",
    "ScoringConfig",
    "Seconds",
    "StoreConfig",
    "Timeouts",
    "TlsConfig",
    "TracingConfig",
    "Wording",
    "check",
    "convert",
    "converter",
    "dump_toml",
    "env_overlay",
    "hide_profile_keys",
    "load",
    "merge",
    "read_toml",
    "shape_problems",
    "structure",
    "structure_as",
]

#: The older name of :func:`structure_as` (it once skipped the shape check; nothing
#: does now).
convert = structure_as
