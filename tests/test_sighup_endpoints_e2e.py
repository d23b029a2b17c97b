"""SIGHUP reads the configuration file's [[endpoints]] again (llmgw.server): real
llmgw-server and llmgw-sim processes, the openai client."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from llmgw import config as cfg
from llmgw.server import changed_keys

from .procs import server, sim, wait_for
from .test_discovery_e2e import table
from .test_runtime_endpoints_e2e import FAST, Load


def test_sighup_applies_the_files_endpoints(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    store = f'[store]\nurl = "sqlite:///{tmp_path / "llmgw.db"}"\n'
    with sim(model="m") as (_, a), sim(model="m") as (_, b):
        path.write_text(FAST + store + table("a", a))
        with server("--config", str(path)) as srv:
            srv.wait_scraped()
            with Load(srv).running() as load:
                wait_for(lambda: load.count("a") >= 5, "requests served by a")
                # b added, and a key only a restart applies.
                path.write_text(
                    FAST.replace('"200ms"', '"300ms"', 1) + store + table("a", a) + table("b", b)
                )
                os.kill(srv.proc.pid, signal.SIGHUP)
                wait_for(lambda: load.count("b") >= 5, "requests served by b after SIGHUP")
                assert srv.endpoints()["b"]["source"] == "config"
                assert (
                    "SIGHUP: these changed keys take a restart to apply: router.scrape_interval"
                    in srv.proc.output()
                )
                # A configuration that does not load changes nothing.
                path.write_text(FAST + store + table("a", a) + table("b", "ftp://b"))
                os.kill(srv.proc.pid, signal.SIGHUP)
                wait_for(
                    lambda: "SIGHUP: the configuration not reloaded" in srv.proc.output(),
                    "the bad file logged",
                )
                assert "endpoints[1].url" in srv.proc.output()
                assert set(srv.endpoints()) == {"a", "b"}
                # a gone from the file: drained, then removed.
                path.write_text(FAST + store + table("b", b))
                os.kill(srv.proc.pid, signal.SIGHUP)
                wait_for(lambda: "a" not in srv.endpoints(), "a removed")
                mark = load.count("b")
                wait_for(lambda: load.count("b") >= mark + 10, "requests served after")
            assert not load.failures, load.failures[:5]


def test_changed_keys_name_each_table_key() -> None:
    old = cfg.load(data={}, environ={})
    new = cfg.load(
        data={"router": {"retries": 1, "admission": {"queue_ttl": "3s"}}, "workers": 3},
        environ={},
    )
    assert changed_keys(old, new) == {"router.retries", "router.admission.queue_ttl", "workers"}
    assert changed_keys(old, old) == set()
