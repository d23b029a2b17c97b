"""`llmgw-ctl` against a live fleet's admin API (an in-process fleet, the CLI as a process)."""

from __future__ import annotations

import json
import os

import trio

from llmgw.testing import SIM_PROFILE, fleet, until

from .procs import BIN


async def ctl(admin: str, *args: str) -> tuple[int, str]:
    done = await trio.run_process(
        [str(BIN / "llmgw-ctl"), "--admin", admin, *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        # PYTHONPATH passes on: the CLI runs the code under test, not whatever is installed.
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"}
        | {k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
    )
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def test_nodes_replicas_placement_and_drain() -> None:
    big = {"name": "big", "engine": "sim", "weights": "w", "tensor_parallel": 8}
    models = [
        {"name": "m", "replicas": 1, "profiles": [SIM_PROFILE]},
        {"name": "huge", "profiles": [big]},
    ]
    async with fleet(models, nodes=2, gpus="2x80GB") as f:
        with trio.fail_after(20):
            await f.wait_ready("m", 1)
            await until(lambda: "huge" in f.controller.reconciler.unplaced)
        admin = str(f.admin.base_url).rstrip("/")

        code, out = await ctl(admin, "nodes")
        assert code == 0, out
        assert "node-0" in out and "node-1" in out and "ready" in out

        code, out = await ctl(admin, "replicas")
        assert code == 0, out
        (replica,) = f.controller.reconciler.replicas
        assert replica in out and "ready" in out

        code, out = await ctl(admin, "placement")
        assert code == 0, out
        assert "huge:" in out and "has 2 GPUs, needs 8" in out

        code, out = await ctl(admin, "--json", "replicas")
        assert code == 0 and json.loads(out)["replicas"][0]["id"] == replica

        node = f.controller.reconciler.replicas[replica].placement.nodes[0]
        code, out = await ctl(admin, "drain", node)
        assert code == 0, out
        record = f.controller.inventory.get(node)
        assert record is not None and record.cordoned and record.draining
        # What it did, in words: the node, what moves, how to undo it.
        assert out.splitlines() == [
            f"node {node}: ready, connected, draining (cordoned: no new shards, its "
            "replicas move elsewhere)",
            "moving 1 replica elsewhere, each drained once its replacement is ready:",
            f"  {replica} (model m)",
            f"undo: llmgw-ctl nodes uncordon {node}",
        ]
        code, out = await ctl(admin, "nodes", "uncordon", node)
        assert code == 0, out
        assert out.splitlines() == [
            f"node {node}: ready, connected, not cordoned",
            "placement may put new shards on it again",
        ]
        record = f.controller.inventory.get(node)
        assert record is not None and not record.cordoned

        code, out = await ctl(admin, "drain", "no-such-node")
        assert code == 1 and "no node 'no-such-node'" in out
