"""Whether the gateway, and each model, can take requests now: what ``/health`` (client
port), ``/readyz`` (admin) and the models list say.

A gateway is ready when it can accept and hold requests: an engine it routes to has
been scraped, or a model it serves starts on request (wake on request: a model scaled
to zero is the gateway working as configured, not down). A load balancer that dropped
it then would keep the waking request from ever arriving.

A model is ``ready`` (a replica serves it, scraped yet or not), ``waking`` (none yet;
requests wait for the first, which is starting), ``scaled_to_zero`` (none; the next
request starts one) or ``unavailable`` (none, and nothing will start one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from llmgw.catalog.rules import Catalog
    from llmgw.domain.catalog import ModelConfig
    from llmgw.router.coldstart import ColdStarts
    from llmgw.router.endpoints import EndpointRegistry

__all__ = ["ModelState", "Readiness"]

ModelState = Literal["ready", "waking", "scaled_to_zero", "unavailable"]


class Readiness:
    """Reads the router's endpoints, cold starts and catalog; decides nothing else."""

    def __init__(
        self, endpoints: EndpointRegistry, cold: ColdStarts, catalog: Callable[[], Catalog]
    ) -> None:
        self.endpoints = endpoints
        self.cold = cold
        self.catalog = catalog

    def model(self, model: ModelConfig) -> ModelState:
        if self.endpoints.serving(model.name):
            return "ready"
        if self.cold.model_for([model]) is not None:
            return "waking" if self.cold.waiting(model.name) else "scaled_to_zero"
        return "unavailable"

    def listed(self) -> list[tuple[ModelConfig, ModelState]]:
        """The models a client may ask for now: those with a replica, and those that
        start on request."""
        states = ((m, self.model(m)) for m in self.catalog().models)
        return [(m, state) for m, state in states if state != "unavailable"]

    def gateway(self) -> bool:
        """Able to accept and hold requests (the module docstring)."""
        if any(s.sample is not None for s in self.endpoints.all()):
            return True
        return any(self.cold.model_for([m]) is not None for m in self.catalog().models)
