"""The engine registry (llmgw.domain.engines) is the one list of engines: each entry's
adapter is the agent's adapter for it, and every reader agrees with it."""

from __future__ import annotations

from llmgw.agent.adapters import BaseAdapter, default_adapters
from llmgw.control.placement import CPU_ENGINES
from llmgw.domain.engine_metrics import parse_metrics
from llmgw.domain.engines import DIALECTS, ENGINES, cpu_engines


def test_each_entry_names_its_adapter() -> None:
    for name, engine in ENGINES.items():
        adapter = engine.adapter_class()
        assert issubclass(adapter, BaseAdapter) and adapter.name == name
    assert list(default_adapters()) == list(ENGINES)


def test_the_adapters_need_gpus_where_placement_gives_them() -> None:
    assert CPU_ENGINES == cpu_engines() == {"sim", "llamacpp"}
    for name, adapter in default_adapters().items():
        assert isinstance(adapter, BaseAdapter)
        assert adapter.needs_gpus == (name not in CPU_ENGINES)


def test_every_dialect_is_recognised_on_a_page() -> None:
    assert DIALECTS == ("vllm", "sglang", "llamacpp")
    gauges = {"vllm": "num_requests_waiting", "sglang": "num_queue_reqs"}
    for dialect in DIALECTS:
        page = f"{dialect}:{gauges.get(dialect, 'requests_deferred')} 3\n"
        assert parse_metrics(page).engine == dialect
