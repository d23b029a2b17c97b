"""llmgw: an OpenAI-compatible LLM gateway and GPU-fleet control plane on trio."""

from llmgw.catalog import Catalog
from llmgw.config import Config, ConfigError
from llmgw.config import load as load_config
from llmgw.control.controller import Controller
from llmgw.control.inventory import Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.domain.endpoints import Endpoint, EndpointSink
from llmgw.domain.usage import Usage, UsageRecord, UsageSink
from llmgw.router.core import Router
from llmgw.router.scheduling import Candidate, Decision, Scheduler
from llmgw.transport.base import AgentConnection, AgentConnector, AgentListener
from llmgw.version import __version__

# The in-memory stub transport (llmgw.transport.stub.StubNetwork) and the gRPC one are
# imported from their modules: both pull in protobuf, which `import llmgw` does not need.

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
    "Inventory",
    "Reconciler",
    "Router",
    "Scheduler",
    "Usage",
    "UsageRecord",
    "UsageSink",
    "__version__",
    "load_config",
]
