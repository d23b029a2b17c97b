"""A whole llmgw fleet in one process, for tests of code built on llmgw.

The router, the controller and the agents are the real ones (:func:`run_agent`): the
agents on the in-memory stub transport, with pretended GPUs, their shards simulated
engines (:mod:`llmgw.sim`) that :mod:`llmgw.testing.launcher` runs in the same process
on loopback. The client and admin listeners are bound on port 0, and every fleet's
nodes have loopback addresses of their own, so fleets run side by side without
contending for a port (an engine whose port is taken all the same takes a free one,
and the server, which publishes only the port it assigned, stops it and places the
replica again).
The README's example
(tests/test_readme_example.py runs it and checks it matches this one)::

    import trio

    import llmgw.testing


    async def main() -> None:
        models = [{"name": "m", "replicas": 2, "profiles": [llmgw.testing.SIM_PROFILE]}]
        async with llmgw.testing.fleet(models) as f:
            with trio.fail_after(30):
                await f.wait_ready("m", 2)
            r = await f.client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
            r.raise_for_status()
            print(r.json()["choices"][0]["text"])


    trio.run(main)

Everything runs in the caller's trio run and is cancelled when the block ends.

The package also holds what tests and benchmarks run outside one process:
:mod:`llmgw.testing.procs` (programs as real processes on loopback) and
:mod:`llmgw.testing.gguf` (a tiny model for a real llama.cpp server). Importing either
costs no more than its own imports: the names above (:func:`fleet` and the rest,
defined in :mod:`llmgw.testing._fleet`, which imports the whole server) are loaded on
first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.testing._fleet import SIM_PROFILE, Fleet, fleet, run_agent, until

__all__ = ["SIM_PROFILE", "Fleet", "fleet", "run_agent", "until"]


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'llmgw.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module("llmgw.testing._fleet"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
