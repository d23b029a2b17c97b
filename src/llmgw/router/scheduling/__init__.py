"""Which replica serves a request: the engine-account saturation model
(:mod:`.state`), the filter/scorer/picker pipeline (:mod:`.pipeline`) and the
built-in plugins the routing profiles are made of (:mod:`.plugins`)."""

from llmgw.router.scheduling.pipeline import Context, Decision, Filter, Picker, Scheduler, Scorer
from llmgw.router.scheduling.plugins import default_scheduler
from llmgw.router.scheduling.state import Candidate, Estimate, Prior, Saturation

__all__ = [
    "Candidate",
    "Context",
    "Decision",
    "Estimate",
    "Filter",
    "Picker",
    "Prior",
    "Saturation",
    "Scheduler",
    "Scorer",
    "default_scheduler",
]
