"""What every route of one simulator shares: its configuration, the engine with its
driver and metrics recorder, the faults in force, and the ids it hands out."""

from __future__ import annotations

import time
import uuid

from llmgw.sim.config import SimConfig
from llmgw.sim.driver import EngineDriver
from llmgw.sim.faults import FaultInjector
from llmgw.sim.kv_publisher import KVPublisher
from llmgw.sim.metrics import Recorder
from llmgw.sim.model import Engine


class SimState:
    """One simulator's shared parts; `driver.run()` must be running in the same trio run."""

    def __init__(self, config: SimConfig, kv_publisher: KVPublisher | None = None) -> None:
        self.config = config
        self.engine = Engine(config.engine)
        self.recorder = Recorder()
        self.driver = EngineDriver(self.engine, self.recorder)
        self.kv_publisher = kv_publisher
        if kv_publisher is not None:
            self.engine.record_kv_events()
            self.driver.after_step = self.flush_kv_events
        self.faults = FaultInjector(config.faults, seed=config.engine.seed ^ 0x5EED)
        self.started = int(time.time())
        self._ids = 0
        self._id_prefix = uuid.uuid4().hex[:12]

    def flush_kv_events(self) -> None:
        """Publish what the cache did since the last flush (after a step, a reset)."""
        if self.kv_publisher is not None:
            self.kv_publisher.paused = self.faults.current.kv_events_paused
            self.kv_publisher.publish(self.engine.take_kv_events())

    def next_id(self, prefix: str, sep: str = "-") -> str:
        self._ids += 1
        return f"{prefix}{sep}{self._id_prefix}{self._ids:08x}"
