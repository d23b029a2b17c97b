"""File discovery ([discovery] file): endpoints another program lists in a file, read
again when it changes. Real llmgw-server and llmgw-sim processes, the openai client."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from llmgw.config import ConfigError
from llmgw.discovery import parse_discovery

from .procs import server, sim, wait_for
from .test_runtime_endpoints_e2e import FAST, Load, delete, error, post


def write(path: Path, text: str) -> None:
    """As a discovery file's writer should: a new file renamed over the old."""
    new = path.with_suffix(".new")
    new.write_text(text)
    os.replace(new, path)


def table(ident: str, url: str, model: str = "m", extra: str = "") -> str:
    return f'[[endpoints]]\nid = "{ident}"\nurl = "{url}"\nmodels = ["{model}"]\n{extra}\n'


def test_the_file_is_followed_while_traffic_flows(tmp_path: Path) -> None:
    listed = tmp_path / "endpoints.toml"
    with sim(model="m") as (_, a), sim(model="m") as (_, b), sim(model="m") as (_, c):
        write(listed, table("a", a))
        config = (
            f'{FAST}\n[store]\nurl = "sqlite:///{tmp_path / "llmgw.db"}"\n'
            f'[discovery]\nfile = "{listed}"\ninterval = "100ms"\n'
        )
        with server("--endpoint", f"c={c}=m", config=config) as srv:
            # Listed at start: there before the first request.
            assert srv.endpoints()["a"]["source"] == "discovery"
            srv.wait_scraped()
            with Load(srv).running() as load:
                wait_for(lambda: load.count("a") >= 5, "requests served by a")
                write(listed, table("a", a) + table("b", b))
                wait_for(lambda: load.count("b") >= 5, "requests served by the listed b")
                # Changed in place: the same endpoint, its new weight.
                write(listed, table("a", a) + table("b", b, extra="weight = 3.0"))
                wait_for(lambda: srv.endpoints()["b"]["weight"] == 3.0, "b's new weight")

                # Invalid, truncated and missing files keep the last good set.
                for broken, why in (
                    (table("a", a) + '[[endpoints]]\nid = "b"\nurl = "', "not valid TOML"),
                    (table("a", a) + table("b", "ftp://x"), "url: must start with http"),
                    ("", "endpoints: missing"),
                ):
                    write(listed, broken)
                    wait_for(lambda why=why: why in srv.proc.output(), f"logged: {why}")
                    assert {"a", "b"} <= set(srv.endpoints())
                listed.unlink()
                wait_for(lambda: "cannot read it" in srv.proc.output(), "a missing file logged")
                assert {"a", "b", "c"} == set(srv.endpoints())
                assert "keeping the last good set (a, b)" in srv.proc.output()

                # Gone from the file: drained, then removed.
                write(listed, table("b", b))
                wait_for(lambda: "a" not in srv.endpoints(), "a removed")
                mark = load.count("b")
                wait_for(lambda: load.count("b") >= mark + 10, "requests served after")
            assert not load.failures, load.failures[:5]

            # Ids are one source's: the file's are not the API's to change, and an id
            # the configuration has is refused from the file, logged.
            refused = delete(srv, "b")
            assert refused.status_code == 409, refused.text
            assert error(refused)["code"] == "endpoint_discovered"
            taken = post(srv, {"id": "b", "url": b, "models": ["m"]})
            assert taken.status_code == 409 and error(taken)["code"] == "endpoint_exists"
            write(listed, table("b", b) + table("c", a, model="other"))
            wait_for(
                lambda: (
                    "discovered endpoint 'c' refused: the configuration file has that id"
                    in srv.proc.output()
                ),
                "the collision logged",
            )
            assert srv.endpoints()["c"]["url"] == c and srv.endpoints()["c"]["source"] == "config"
            # An empty list is a choice, not a truncation.
            write(listed, "endpoints = []\n")
            wait_for(lambda: set(srv.endpoints()) == {"c"}, "the file's endpoints removed")
            httpx.get(f"{srv.admin}/healthz", timeout=5).raise_for_status()


def test_a_server_starts_on_a_discovery_file_alone(tmp_path: Path) -> None:
    listed = tmp_path / "endpoints.json"
    with sim(model="m") as (_, a):
        listed.write_text(f'{{"endpoints": [{{"id": "a", "url": "{a}", "models": ["m"]}}]}}')
        config = f'{FAST}\n[store]\nurl = ""\n[discovery]\nfile = "{listed}"\n'
        with server(config=config) as srv:
            assert set(srv.endpoints()) == {"a"}
            srv.wait_scraped()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('endpoints = []\ncolour = "red"\n', "colour"),
        (
            '[[endpoints]]\nid = "a"\nurl = "http://h"\nmodels = ["m"]\n'
            '[[endpoints]]\nid = "a"\nurl = "http://h"\nmodels = ["m"]\n',
            "endpoints[1].id: endpoint id 'a' is used twice",
        ),
        (
            '[[endpoints]]\nid = "a"\nurl = "http://h"\nmodels = ["m"]\nkv_events = "tcp://h:1"\n',
            "endpoints[0].kv_events: KV-cache events are subscribed to at start",
        ),
        ('[[endpoints]]\nid = "a"\nurl = "http://h"\nmodels = []\n', "endpoints[0].models"),
        ("endpoints = 3\n", "endpoints"),
    ],
)
def test_a_discovery_file_is_checked_by_the_configurations_rules(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_discovery(text, as_json=False)
    assert any(problem in p for p in raised.value.problems), raised.value.problems
