"""llmgw: an OpenAI-compatible LLM gateway and GPU-fleet control plane on trio.

The public names below are imported on first use (PEP 562), so that importing one
submodule (a worker process imports ``llmgw.workers.worker``) loads only what that
submodule needs, not the control plane, the admin app and their libraries.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from llmgw.version import __version__

if TYPE_CHECKING:
    from llmgw.assembly import Gateway, assemble
    from llmgw.catalog.rules import Catalog
    from llmgw.config import Config, ConfigError
    from llmgw.config import load as load_config
    from llmgw.control.controller import Controller
    from llmgw.control.inventory import Inventory
    from llmgw.control.reconciler import Reconciler
    from llmgw.domain.endpoints import Endpoint, EndpointSink
    from llmgw.domain.usage import Usage, UsageRecord, UsageSink
    from llmgw.router.core import Router
    from llmgw.router.scheduling import Candidate, Decision, Scheduler
    from llmgw.server import serve
    from llmgw.transport.base import AgentConnection, AgentConnector, AgentListener

# The in-memory stub transport (llmgw.transport.stub.StubNetwork) and the gRPC one are
# imported from their modules: both pull in protobuf, which `import llmgw` does not need.

# public name -> (module, name in it)
_HOMES = {
    "AgentConnection": ("llmgw.transport.base", "AgentConnection"),
    "AgentConnector": ("llmgw.transport.base", "AgentConnector"),
    "AgentListener": ("llmgw.transport.base", "AgentListener"),
    "Candidate": ("llmgw.router.scheduling", "Candidate"),
    "Catalog": ("llmgw.catalog.rules", "Catalog"),
    "Config": ("llmgw.config", "Config"),
    "ConfigError": ("llmgw.config", "ConfigError"),
    "Controller": ("llmgw.control.controller", "Controller"),
    "Decision": ("llmgw.router.scheduling", "Decision"),
    "Endpoint": ("llmgw.domain.endpoints", "Endpoint"),
    "Gateway": ("llmgw.assembly", "Gateway"),
    "EndpointSink": ("llmgw.domain.endpoints", "EndpointSink"),
    "Inventory": ("llmgw.control.inventory", "Inventory"),
    "Reconciler": ("llmgw.control.reconciler", "Reconciler"),
    "Router": ("llmgw.router.core", "Router"),
    "Scheduler": ("llmgw.router.scheduling", "Scheduler"),
    "Usage": ("llmgw.domain.usage", "Usage"),
    "UsageRecord": ("llmgw.domain.usage", "UsageRecord"),
    "UsageSink": ("llmgw.domain.usage", "UsageSink"),
    "assemble": ("llmgw.assembly", "assemble"),
    "load_config": ("llmgw.config", "load"),
    "serve": ("llmgw.server", "serve"),
}

__all__ = [
    "AgentConnection",
    "AgentConnector",
    "AgentListener",
    "Candidate",
    "Catalog",
    "Config",
    "ConfigError",
    "Controller",
    "Decision",
    "Endpoint",
    "EndpointSink",
    "Gateway",
    "Inventory",
    "Reconciler",
    "Router",
    "Scheduler",
    "Usage",
    "UsageRecord",
    "UsageSink",
    "__version__",
    "assemble",
    "load_config",
    "serve",
]


def __getattr__(name: str) -> object:
    try:
        module, attribute = _HOMES[name]
    except KeyError:
        raise AttributeError(f"module 'llmgw' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
