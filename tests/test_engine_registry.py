"""The engine registry (llmgw.domain.engines) is the one list of engines: the agent has
an adapter for each entry and for nothing else, and every reader agrees with it."""

from __future__ import annotations

import json
import subprocess
import sys

from llmgw.agent.adapters import ADAPTERS, BaseAdapter, default_adapters
from llmgw.control.placement import CPU_ENGINES
from llmgw.domain.engine_metrics import parse_metrics
from llmgw.domain.engines import DIALECTS, ENGINES, cpu_engines


def test_every_engine_has_an_adapter_and_every_adapter_an_engine() -> None:
    # The registry names no adapter (it sits below the agent): the agent's table is an
    # engine's other half, and the two must list the same engines.
    assert sorted(ADAPTERS) == sorted(ENGINES)
    for name, adapter in ADAPTERS.items():
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


NEW_DIALECT = """
import json
from llmgw.domain import engines as e

# A new engine's dialect is one entry, added before anything reads the registry.
e.DIALECT_ENTRIES["trtllm"] = e.DialectEntry(
    e.MetricNames("trtllm:queued_requests", "trtllm:active_requests"),
    e.Api(
        "TensorRT-LLM",
        frozenset({"/v1/chat/completions", "/v1/completions"}),
        messages="none",
        tokenize_messages=False,
        capacity=("/info", "max_batch_size"),
    ),
)
e.DIALECTS = tuple(e.DIALECT_ENTRIES)

from llmgw.domain.engine_metrics import parse_metrics
from llmgw.router import paths

sample = parse_metrics("trtllm:queued_requests 3\\ntrtllm:active_requests 5\\n")
print(json.dumps({
    "engine": sample.engine,
    "waiting": sample.waiting,
    "running": sample.running,
    "chat": sorted(paths.PATHS["/v1/chat/completions"].engines),
    "responses": sorted(paths.PATHS["/v1/responses"].engines),
    "named": paths.engine_names(["trtllm", "vllm"]),
}))
"""


def test_a_new_dialect_is_one_entry_every_reader_follows() -> None:
    """The metrics parser and the router's paths read the dialect entries, nothing of
    their own: a new entry is recognised on a page and routed its paths."""
    done = subprocess.run(
        [sys.executable, "-c", NEW_DIALECT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "engine": "trtllm",
        "waiting": 3.0,
        "running": 5.0,
        "chat": ["llamacpp", "sglang", "trtllm", "vllm"],
        "responses": ["sglang", "vllm"],
        "named": "vLLM, TensorRT-LLM",
    }
