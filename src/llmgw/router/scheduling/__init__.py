"""Which replica serves a request: the engine-account saturation model
(:mod:`.state`), the filter/scorer/picker pipeline (:mod:`.scheduler`), the built-in
plugins (:mod:`.plugins`) and the names routing profiles give plugins by
(:mod:`.registry`)."""

from llmgw.router.scheduling.registry import default_scheduler, register
from llmgw.router.scheduling.scheduler import Context, Decision, Filter, Picker, Scheduler, Scorer
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
    "register",
]
