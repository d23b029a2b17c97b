"""Configuration: defaults, layering, validation messages, round-trip."""

from __future__ import annotations

import ctypes
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from llmgw import config as cfg
from llmgw import units

from .procs import BIN


def problems_of(data: dict[str, object], environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(data=data, environ=environ or {})
    return list(info.value.problems)


def test_defaults_match_the_design_table() -> None:
    c = cfg.load(environ={})
    assert (c.listen, c.admin_listen, c.agent_listen) == (
        ":8080",
        "127.0.0.1:9090",
        "127.0.0.1:7443",
    )
    assert not c.allow_insecure_agents and c.insecure_agents_warning() is None
    assert c.control.interval == 5
    assert (c.control.base_backoff, c.control.max_backoff) == (10, 600)
    assert (c.control.unreachable_after, c.control.lost_after) == (15, 60)
    assert c.control.port_range == (20000, 20999)
    assert c.control.mgmt_interface == "eth0"
    r = c.router
    assert (r.scrape_interval, r.scrape_timeout, r.stale_after) == (1, 1, 10)
    assert (r.retries, r.cooldown, r.failure_threshold) == (2, 15, 3)
    assert (r.default_profile, r.session_header, r.inject_usage) == ("chat", "x-session-id", True)
    assert r.max_body_bytes == 32 * 1024 * 1024
    assert (r.max_response_bytes, r.max_event_bytes) == (64 * 1024 * 1024, 1024 * 1024)
    t = r.timeouts
    assert (t.dial, t.response_header, t.first_token, t.idle, t.total) == (5, 60, 120, 60, 1800)
    assert (t.client_header, t.client_body) == (10, 30)
    s = r.scoring
    assert (s.target_waiting, s.kv_ceiling) == (4, 0.9)
    a = r.admission
    assert (a.enabled, a.band_header, a.default_band) == (True, "x-llmgw-band", "gold")
    assert (a.queue_ttl, a.queue_capacity_per_band, a.interval) == (30, 2000, 0.01)
    assert [(b.name, b.priority, b.saturation_ceiling) for b in a.bands] == [
        ("platinum", 400, 1.0),
        ("gold", 300, 0.85),
        ("silver", 200, 0.6),
        ("bronze", 100, 0.3),
    ]
    assert set(r.profiles) == {"chat", "batch", "cache_aware"}
    assert c.endpoints == () and c.models == ()
    assert c.store.url == "sqlite://llmgw.db"  # the embedded default (DESIGN §8), in the cwd
    assert c.auth.session_ttl == 8 * 3600


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("5s", 5), ("10m", 600), ("1h", 3600), ("1h30m", 5400), ("2.5", 2.5), (7, 7)],
)
def test_durations_parse(text: object, seconds: float) -> None:
    assert units.parse_duration(text) == seconds


@pytest.mark.parametrize("seconds", [0.01, 0.25, 1, 5, 59, 60, 90, 600, 3600, 5400, 1.5])
def test_durations_round_trip(seconds: float) -> None:
    assert units.parse_duration(units.format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "size"), [("40GB", 40 * 10**9), ("32MiB", 32 * 2**20), (1024, 1024), ("1.5KB", 1500)]
)
def test_sizes_parse(text: object, size: int) -> None:
    assert units.parse_size(text) == size


def test_env_overrides_nested_list_and_duration_fields() -> None:
    c = cfg.load(
        environ={
            "LLMGW_ROUTER__RETRIES": "3",
            "LLMGW_ROUTER__TIMEOUTS__DIAL": "250ms",
            "LLMGW_ROUTER__INJECT_USAGE": "false",
            "LLMGW_ROUTER__ADMISSION__BANDS__2__SATURATION_CEILING": "0.5",
            "LLMGW_CONTROL__PORT_RANGE": "[30000, 30099]",
            "LLMGW_LISTEN": "127.0.0.1:18080",
            "UNRELATED": "x",
        }
    )
    assert c.router.retries == 3
    assert c.router.timeouts.dial == 0.25
    assert c.router.inject_usage is False
    assert c.router.admission.bands[2].saturation_ceiling == 0.5
    assert c.router.admission.bands[1].saturation_ceiling == 0.85
    assert c.control.port_range == (30000, 30099)
    assert c.listen == "127.0.0.1:18080"


def test_env_beats_file_and_overrides_beat_env(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[router]\nretries = 1\ncooldown = '3s'\n")
    c = cfg.load(path, environ={"LLMGW_ROUTER__RETRIES": "4"}, overrides={"listen": ":1"})
    assert (c.router.retries, c.router.cooldown, c.listen) == (4, 3, ":1")


def test_routing_profiles_merge_with_the_builtins() -> None:
    c = cfg.load(data={"router": {"profiles": {"fast": {"queue": 2.0}, "chat": {"kv": 0.0}}}})
    assert set(c.router.profiles) == {"chat", "batch", "cache_aware", "fast"}
    assert c.router.profiles["fast"].queue == 2.0
    assert c.router.profiles["chat"].kv == 0.0 and c.router.profiles["chat"].queue == 1.0
    # A table set whole from the environment merges the same way.
    c = cfg.load(environ={"LLMGW_ROUTER__PROFILES": "{ fast = { queue = 2.0 } }"})
    assert set(c.router.profiles) == {"chat", "batch", "cache_aware", "fast"}
    assert cfg.load(environ={"LLMGW_ROUTER__PROFILES": "{}"}).router.profiles.keys() == {
        "chat",
        "batch",
        "cache_aware",
    }


def deploy(*fields: str) -> str:
    """Model `a` with one valid deployment profile, `fields` (``key = value``) replacing its own."""
    profile = {"name": '"p"', "engine": '"vllm"', "weights": '"w"'}
    for field in fields:
        key, value = field.split(" = ", 1)
        profile[key] = value
    inner = ", ".join(f"{k} = {v}" for k, v in profile.items())
    return f'models = [{{ name = "a", profiles = [{{ {inner} }}] }}]'


EP = 'id = "a", url = "http://127.0.0.1:1", models = ["m"]'
BAND = "priority = 1, saturation_ceiling = 0.5"

# Every rule of config.check() and catalog.check_models(), in their order, then the
# structuring and environment errors: a TOML snippet (or one `LLMGW_...=value`
# variable) over the defaults, and the start of the problem it must produce.
RULES: list[tuple[str, str]] = [
    ('listen = "localhost"', "listen: expected HOST:PORT or :PORT, got 'localhost'"),
    (
        'admin_listen = ":99999"',
        "admin_listen: port must be a number in 0..65535, got '99999' in ':99999'",
    ),
    ('agent_listen = "nowhere"', "agent_listen: expected HOST:PORT or :PORT, got 'nowhere'"),
    *(
        (f"router.{key} = 0", f"router.{key}: must be greater than 0, got 0")
        for key in ("scrape_interval", "scrape_timeout", "stale_after", "cooldown", "drain_timeout")
    ),
    (
        'router.scrape_timeout = "3s"',
        "router.scrape_timeout: must not exceed router.scrape_interval (1s), got 3s",
    ),
    ("router.retries = -1", "router.retries: must be 0 or more, got -1"),
    ("router.failure_threshold = 0", "router.failure_threshold: must be at least 1, got 0"),
    *(
        (f"router.{key} = 0", f"router.{key}: must be greater than 0, got 0")
        for key in ("max_body_bytes", "max_response_bytes", "max_event_bytes")
    ),
    *(
        (f"router.timeouts.{key} = 0", f"router.timeouts.{key}: must be greater than 0, got 0")
        for key in (
            "dial",
            "response_header",
            "first_token",
            "idle",
            "total",
            "client_header",
            "client_body",
        )
    ),
    *(
        (f"router.scoring.{key} = 0", f"router.scoring.{key}: must be greater than 0, got 0")
        for key in ("target_waiting",)
    ),
    (
        "router.scoring.target_inflight = 8",
        "router.scoring.target_inflight: unknown key (removed: a replica is full when its "
        "engine says so",
    ),
    (
        "[[endpoints]]\nid='a'\nurl='http://a'\nmodels=['m']\ncapacity=0",
        "endpoints[0].capacity: must be at least 1, got 0",
    ),
    ("router.scoring.kv_ceiling = 0", "router.scoring.kv_ceiling: must be in (0, 1], got 0"),
    (
        "router.scoring.session_load_factor = 1.25",
        "router.scoring.session_load_factor: unknown key (removed: a session stays on its",
    ),
    *(
        (f"router.affinity.{key} = 0", f"router.affinity.{key}: must be greater than 0, got 0")
        for key in ("session_ttl", "prefix_ttl")
    ),
    *(
        (f"router.affinity.{key} = 0", f"router.affinity.{key}: must be at least 1, got 0")
        for key in ("session_table_size", "prefix_block_chars", "prefix_max_blocks")
    ),
    (
        "router.affinity.prefix_table_size = -1",
        "router.affinity.prefix_table_size: must be 0 or more (0 turns it off), got -1",
    ),
    (
        "router.profiles.chat.queue = -1",
        "router.profiles.chat.queue: weights must be 0 or more, got -1",
    ),
    (
        'router.default_profile = "fast"',
        "router.default_profile: no routing profile named 'fast' (have batch, cache_aware, chat)",
    ),
    *(
        (f"router.admission.{key} = 0", f"router.admission.{key}: must be greater than 0, got 0")
        for key in ("queue_ttl", "interval")
    ),
    (
        "router.admission.queue_capacity_per_band = -1",
        "router.admission.queue_capacity_per_band: must be 0 or more, got -1",
    ),
    ("router.admission.bands = []", "router.admission.bands: at least one band is needed"),
    (
        f'router.admission.bands = [{{ name = "", {BAND} }}]',
        "router.admission.bands[0].name: must not be empty",
    ),
    (
        f'router.admission.bands = [{{ name = "gold", {BAND} }}, {{ name = "gold", {BAND} }}]',
        "router.admission.bands[1].name: band 'gold' is defined twice",
    ),
    (
        "LLMGW_ROUTER__ADMISSION__BANDS__2__SATURATION_CEILING=1.5",
        "router.admission.bands[2].saturation_ceiling: must be in (0, 1], got 1.5",
    ),
    (
        'router.admission.default_band = "iron"',
        "router.admission.default_band: no band named 'iron' (have platinum, gold, silver, bronze)",
    ),
    *(
        (f"control.{key} = 0", f"control.{key}: must be greater than 0, got 0")
        for key in (
            "interval",
            "base_backoff",
            "max_backoff",
            "unreachable_after",
            "lost_after",
            "start_timeout",
        )
    ),
    (
        'control.base_backoff = "1h"',
        "control.base_backoff: must not exceed control.max_backoff (10m), got 1h",
    ),
    (
        'control.unreachable_after = "2m"',
        "control.unreachable_after: must be shorter than control.lost_after (1m), got 2m",
    ),
    (
        "control.port_range = [2000, 1000]",
        "control.port_range: must be [low, high] within 1..65535, got [2000, 1000]",
    ),
    (
        'endpoints = [{ id = "", url = "http://127.0.0.1:1", models = ["m"] }]',
        "endpoints[0].id: must not be empty",
    ),
    (f"endpoints = [{{ {EP} }}, {{ {EP} }}]", "endpoints[1].id: endpoint id 'a' is used twice"),
    (
        'endpoints = [{ id = "a", url = "127.0.0.1:1", models = ["m"] }]',
        "endpoints[0].url: must start with http:// or https://, got '127.0.0.1:1'",
    ),
    (
        'endpoints = [{ id = "a", url = "http://127.0.0.1:1", models = [] }]',
        "endpoints[0].models: must name at least one model",
    ),
    (f"endpoints = [{{ {EP}, weight = 0 }}]", "endpoints[0].weight: must be greater than 0, got 0"),
    (
        f"endpoints = [{{ {EP}, priority = -1 }}]",
        "endpoints[0].priority: must be 0 or more, got -1",
    ),
    (
        'agent_listen = ":7443"',
        "agent_listen: :7443 is off loopback and agent_tls is not set: any host that reaches "
        "it could register as a node",
    ),
    (
        'agent_tls = { cert = "/nonexistent/c.pem", key = "/nonexistent/k.pem" }',
        "agent_tls.client_ca: required: with TLS the agent port requires client "
        "certificates; name the CA that signs the nodes' certificates",
    ),
    *(
        (
            'agent_tls = { cert = "/nonexistent/cert", key = "/nonexistent/key", '
            'client_ca = "/nonexistent/client_ca" }',
            f"agent_tls.{key}: no such file: /nonexistent/{key}",
        )
        for key in ("cert", "key", "client_ca")
    ),
    *(
        (f"auth.{key} = 0", f"auth.{key}: must be greater than 0, got 0")
        for key in ("cache_ttl", "session_ttl")
    ),
    (
        'auth.required = true\nstore.url = ""',
        "auth.required: API keys live in the store; set store.url",
    ),
    (
        'store.url = "mysql://x"',
        "store.url: must start with sqlite:// or postgresql:// (or be empty for no store), "
        "got 'mysql://x'",
    ),
    # catalog.check_models
    ('models = [{ name = "" }]', "models[0].name: must not be empty"),
    ('models = [{ name = "a" }, { name = "a" }]', "models[1].name: model 'a' is defined twice"),
    (
        'models = [{ name = "a", aliases = ["b"] }, { name = "b" }]',
        "models[0].aliases[0]: 'b' is already a model name",
    ),
    (
        'models = [{ name = "a", aliases = ["x"] }, { name = "b", aliases = ["x"] }]',
        "models[1].aliases[0]: 'x' is already an alias of 'a'",
    ),
    ('models = [{ name = "a", replicas = -1 }]', "models[0].replicas: must be 0 or more, got -1"),
    (
        'models = [{ name = "a", autoscale = { max_replicas = 2 } }]',
        "models[0].autoscale.min_replicas: required key is missing",
    ),
    (
        'models = [{ name = "a", autoscale = { min_replicas = 3, max_replicas = 2 } }]',
        "models[0].autoscale.min_replicas: must not exceed max_replicas (2), got 3",
    ),
    (
        'models = [{ name = "a", autoscale = { min_replicas = -1, max_replicas = 0 } }]',
        "models[0].autoscale.min_replicas: must be 0 or more, got -1",
    ),
    (
        'models = [{ name = "a", autoscale = { min_replicas = 0, max_replicas = 0 } }]',
        "models[0].autoscale.max_replicas: must be at least 1, got 0",
    ),
    (
        'models = [{ name = "a", replicas = 4, autoscale = { min_replicas = 0, '
        "max_replicas = 2 } }]",
        "models[0].replicas: the count to start with must not exceed autoscale.max_replicas (2), "
        "got 4",
    ),
    (
        'models = [{ name = "a", autoscale = { min_replicas = 0, max_replicas = 2, '
        "target_saturation = 1.5 } }]",
        "models[0].autoscale.target_saturation: must be in (0, 1], got 1.5",
    ),
    (
        'models = [{ name = "a", autoscale = { min_replicas = 0, max_replicas = 2, '
        'idle_timeout = "0s" } }]',
        "models[0].autoscale.idle_timeout: must be greater than 0, got 0ms",
    ),
    (
        'models = [{ name = "a", autoscale = { min_replicas = 0, max_replicas = 2, '
        'scale_up_window = "soon" } }]',
        "models[0].autoscale.scale_up_window: expected a duration",
    ),
    (
        'models = [{ name = "a", routing_profile = "fast" }]',
        "models[0].routing_profile: no routing profile named 'fast' "
        "(have batch, cache_aware, chat)",
    ),
    (
        'models = [{ name = "a", profiles = [{ name = "p", engine = "vllm", weights = "w" }, '
        '{ name = "p", engine = "vllm", weights = "w" }] }]',
        "models[0].profiles[1].name: profile 'p' is defined twice",
    ),
    (deploy('name = ""'), "models[0].profiles[0].name: must not be empty"),
    (
        deploy('engine = "tgi"'),
        "models[0].profiles[0].engine: unknown engine 'tgi' (known: vllm, sglang, sim, llamacpp)",
    ),
    (
        deploy('weights = ""'),
        "models[0].profiles[0].weights: must name the model weights (a path or hub id)",
    ),
    (
        deploy('engine = "sglang"', 'sleep_after = "5m"'),
        "models[0].profiles[0].sleep_after: sglang cannot sleep here (engines that can: vllm, "
        "sim, llamacpp)",
    ),
    (
        deploy('sleep_after = "0s"'),
        "models[0].profiles[0].sleep_after: must be a positive duration",
    ),
    *(
        (deploy(f"{key} = 0"), f"models[0].profiles[0].{key}: must be at least 1, got 0")
        for key in ("tensor_parallel", "pipeline_parallel", "gpus_per_node")
    ),
    (
        deploy("tensor_parallel = 4", "gpus_per_node = 3"),
        "models[0].profiles[0].gpus_per_node: tensor_parallel x pipeline_parallel = 4 GPUs "
        "must split into whole nodes of 3",
    ),
    (
        deploy('gpu_name = "H100("'),
        "models[0].profiles[0].gpu_name: not a valid regular expression",
    ),
    (
        'models = [{ name = "a", fallbacks = ["zz"] }]',
        "models[0].fallbacks[0]: no model named 'zz'",
    ),
    (
        'models = [{ name = "a", fallbacks = ["a"] }]',
        "models[0].fallbacks[0]: a model cannot fall back to itself",
    ),
    (
        'models = [{ name = "a", fallbacks = ["b"] }, { name = "b", fallbacks = ["c"] }, '
        '{ name = "c", fallbacks = ["a"] }]',
        "models[0].fallbacks: fallbacks form a cycle: a -> b -> c -> a",
    ),
    # structuring: unknown keys, types, shapes, units
    ("router.retrys = 3", "router.retrys: unknown key (did you mean 'retries'?)"),
    ("routr = {}", "routr: unknown key (did you mean 'router'?)"),
    ('router.retries = "3"', "router.retries: expected int, got '3'"),
    ('router = "fast"', "router: must be a table, got a string"),
    ("router.profiles.chat = 1", "router.profiles.chat: must be a table, got an integer"),
    ('router.admission.bands = "gold"', "router.admission.bands: must be an array, got a string"),
    ("control.port_range = [1]", "control.port_range: must be an array of 2 values, got 1"),
    (
        'endpoints = [{ id = "a", url = "http://127.0.0.1:1", models = "m" }]',
        "endpoints[0].models: must be an array, got a string",
    ),
    (
        'router.admission.bands = [{ name = "gold", priority = 1 }]',
        "router.admission.bands[0].saturation_ceiling: required key is missing",
    ),
    (
        'router.timeouts.dial = "5 parsecs"',
        "router.timeouts.dial: expected a duration such as '5s', '250ms', '10m' or '1h', "
        "got '5 parsecs'",
    ),
    (
        deploy('min_gpu_memory = "lots"'),
        "models[0].profiles[0].min_gpu_memory: expected a size such as '40GB' or '32MiB', "
        "got 'lots'",
    ),
    # environment variables, named as the operator wrote them
    ("LLMGW_ROUTER__RETRIES=many", "LLMGW_ROUTER__RETRIES: expected an integer, got 'many'"),
    (
        "LLMGW_ROUTER__INJECT_USAGE=maybe",
        "LLMGW_ROUTER__INJECT_USAGE: expected true or false, got 'maybe'",
    ),
    (
        "LLMGW_ROUTER__SCORING__KV_CEILING=high",
        "LLMGW_ROUTER__SCORING__KV_CEILING: expected a number, got 'high'",
    ),
    (
        "LLMGW_ROUTER__ADMISSION__BANDS__9__PRIORITY=1",
        "LLMGW_ROUTER__ADMISSION__BANDS__9__PRIORITY: no array element '9' to set",
    ),
    ("LLMGW_ROUTER__PROFILES={", "LLMGW_ROUTER__PROFILES: cannot parse '{' as a TOML value"),
    ("LLMGW_ROUTER=1", "router: must be a table, got an integer"),
]


@pytest.mark.parametrize(("case", "message"), RULES, ids=[m.split(":")[0] for _, m in RULES])
def test_each_rule_names_its_key(case: str, message: str) -> None:
    if case.startswith(cfg.ENV_PREFIX):
        name, _, value = case.partition("=")
        problems = problems_of({}, {name: value})
    else:
        problems = problems_of(tomllib.loads(case))
    assert any(p.startswith(message) for p in problems), problems


@pytest.mark.parametrize(
    "listen", [":7443", "0.0.0.0:7443", "10.0.0.5:7443", "[::]:7443", "ctl:7443"]
)
def test_plaintext_agents_off_loopback_need_allow_insecure_agents_and_are_warned_of(
    listen: str,
) -> None:
    (problem,) = problems_of({"agent_listen": listen})
    assert problem.startswith(f"agent_listen: {listen} is off loopback and agent_tls is not set")
    assert "allow_insecure_agents = true" in problem and "agent_tls" in problem
    c = cfg.load(data={"agent_listen": listen, "allow_insecure_agents": True}, environ={})
    warning = c.insecure_agents_warning()
    assert warning is not None and "PLAINTEXT" in warning and listen in warning


@pytest.mark.parametrize(
    "listen", ["127.0.0.1:7443", "127.0.0.9:0", "[::1]:7443", "localhost:7443"]
)
def test_plaintext_agents_on_loopback_need_nothing(listen: str) -> None:
    c = cfg.load(data={"agent_listen": listen}, environ={})
    assert c.insecure_agents_warning() is None


def test_agents_with_tls_may_listen_anywhere(tmp_path: Path) -> None:
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("")
    tls = {"cert": str(tmp_path / "c.pem"), "key": str(tmp_path / "k.pem")}
    c = cfg.load(
        data={"agent_listen": ":7443", "agent_tls": {**tls, "client_ca": str(tmp_path / "ca.pem")}},
        environ={},
    )
    assert c.insecure_agents_warning() is None


def test_a_deployable_model_turns_on_the_control_plane() -> None:
    c = cfg.load(
        data={
            "models": [
                {
                    "name": "m",
                    "profiles": [
                        {
                            "name": "tp2",
                            "engine": "vllm",
                            "weights": "w",
                            "tensor_parallel": 2,
                            "min_gpu_memory": "40GB",
                            "env": {"A": "1"},
                        }
                    ],
                }
            ]
        },
        environ={},
    )
    assert c.control_plane
    assert c.models[0].profiles[0].min_gpu_memory == 40 * 10**9
    assert not cfg.load(data={"models": [{"name": "m"}]}, environ={}).control_plane


def test_print_config_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        """
listen = "127.0.0.1:18080"
[router]
retries = 5
cooldown = "1m30s"
[router.profiles.fast]
queue = 3.0
[[endpoints]]
id = "e1"
url = "http://127.0.0.1:9"
models = ["m"]
weight = 2.0
[[models]]
name = "m"
aliases = ["mm"]
[[models.profiles]]
name = "p"
engine = "sim"
weights = "x"
min_gpu_memory = "8GiB"
[models.autoscale]
min_replicas = 0
max_replicas = 3
scale_down_window = "90s"
"""
    )
    done = run_server("--config", str(path), "--print-config")
    assert done.returncode == 0, done.stderr
    printed = tomllib.loads(done.stdout)
    assert printed["router"]["cooldown"] == "90s"
    assert printed["models"][0]["autoscale"]["scale_down_window"] == "90s"
    assert cfg.load(data=printed, environ={}) == cfg.load(path, environ={})


def run_server(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "llmgw-server"), *args],
        capture_output=True,
        text=True,
        # No LLMGW_* of the caller's; PYTHONPATH kept, so a worktree's code is what runs.
        env={
            "PATH": "/usr/bin:/bin",
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
            **(env or {}),
        },
        timeout=30,
    )


def test_missing_config_file_is_one_line_exit_2(tmp_path: Path) -> None:
    done = run_server("--config", str(tmp_path / "nope.toml"))
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"llmgw-server: error: config file {tmp_path / 'nope.toml'}: not found"
    )


def _without_root_file_access() -> None:
    """Drop the capabilities that let root read any file (runs in the child before exec),
    so an unreadable file is unreadable here too; other users lack them anyway."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: from the bounding set
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_unreadable_config_file_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "secret.toml"
    path.write_text("[router]\nretries = 1\n")
    path.chmod(0)
    done = subprocess.run(
        [str(BIN / "llmgw-server"), "--config", str(path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=30,
        preexec_fn=_without_root_file_access,
    )
    assert done.returncode == 2
    assert done.stderr == f"llmgw-server: error: config file {path}: Permission denied\n"


def test_invalid_toml_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[router\nretries = 1\n")
    done = run_server("--config", str(path))
    assert done.returncode == 2
    assert "invalid TOML" in done.stderr and "Traceback" not in done.stderr


def test_bad_values_list_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[router]\nretries = -1\nfailure_threshold = 0\n")
    done = run_server("--config", str(path))
    assert done.returncode == 2
    assert "router.retries: must be 0 or more, got -1" in done.stderr
    assert "router.failure_threshold: must be at least 1, got 0" in done.stderr


def test_nothing_to_serve_exits_2() -> None:
    done = run_server()
    assert done.returncode == 2
    assert "nothing to serve" in done.stderr


def test_bad_endpoint_flag_exits_2() -> None:
    done = run_server("--endpoint", "just-a-name")
    assert done.returncode == 2
    assert "expected id=URL=model[,model]" in done.stderr


def test_env_reaches_the_server_process() -> None:
    done = run_server("--print-config", env={"LLMGW_ROUTER__RETRIES": "7"})
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(done.stdout)["router"]["retries"] == 7


@pytest.mark.parametrize("program", ["llmgw-server", "llmgw-agent", "llmgw-ctl", "llmgw-sim"])
def test_every_cli_has_help_and_version(program: str) -> None:
    for flag in ("--help", "--version"):
        done = subprocess.run(
            [str(BIN / program), flag], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip()


def test_a_hidden_secret_copied_back_is_refused() -> None:
    # --print-config writes <hidden> for secrets; loading that back must not send it.
    data = {"endpoints": [{"id": "e", "url": "http://127.0.0.1:9", "models": ["m"]}]}
    data["endpoints"][0]["api_key"] = "<hidden>"
    with pytest.raises(cfg.ConfigError, match="what --print-config writes in place of a secret"):
        cfg.load(data=data, environ={})
    profile = {"name": "p", "engine": "vllm", "weights": "w", "api_key": "<hidden>"}
    with pytest.raises(cfg.ConfigError, match="what llmgw shows in place of a key"):
        cfg.load(data={"models": [{"name": "m", "profiles": [profile]}]}, environ={})
    text = cfg.dump_toml(
        cfg.load(
            data={
                "endpoints": [{**data["endpoints"][0], "api_key": "sk-x", "headers": {"x-o": "y"}}],
                "models": [{"name": "m", "profiles": [{**profile, "api_key": "sk-y"}]}],
            },
            environ={},
        )
    )
    assert "sk-x" not in text and "sk-y" not in text and '"y"' not in text
