"""What every route of one simulator shares: its configuration, the engine with its
driver and metrics recorder, the faults in force, and the ids it hands out."""

from __future__ import annotations

import time
import uuid

from llmgw.sim.config import SimConfig
from llmgw.sim.driver import EngineDriver
from llmgw.sim.faults import FaultInjector
from llmgw.sim.metrics import Recorder
from llmgw.sim.model import Engine


class SimState:
    """One simulator's shared parts; `driver.run()` must be running in the same trio run."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine = Engine(config.engine)
        self.recorder = Recorder()
        self.driver = EngineDriver(self.engine, self.recorder)
        self.faults = FaultInjector(config.faults, seed=config.engine.seed ^ 0x5EED)
        self.started = int(time.time())
        self._ids = 0
        self._id_prefix = uuid.uuid4().hex[:12]

    def next_id(self, prefix: str, sep: str = "-") -> str:
        self._ids += 1
        return f"{prefix}{sep}{self._id_prefix}{self._ids:08x}"
