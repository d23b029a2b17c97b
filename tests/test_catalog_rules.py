"""Rules about models written once (issue #18): a profile's GPU arithmetic, the bound
on replica counts (for a TOML file as for the admin API) and the GPU-name pattern."""

from __future__ import annotations

import pytest

from llmgw import config as cfg
from llmgw.catalog.rules import MAX_REPLICAS
from llmgw.domain.catalog import DeploymentProfile, gpu_name_pattern


@pytest.mark.parametrize(
    ("tp", "pp", "per_node", "gpus", "shard", "nodes"),
    [(1, 1, None, 1, 1, 1), (8, 2, 8, 16, 8, 2), (4, 1, None, 4, 4, 1), (2, 1, 0, 2, 2, 1)],
)
def test_a_profile_says_its_gpus_and_nodes(
    tp: int, pp: int, per_node: int | None, gpus: int, shard: int, nodes: int
) -> None:
    p = DeploymentProfile("p", "vllm", "w", tp, pp, per_node)
    assert (p.gpus, p.shard_gpus, p.node_count) == (gpus, shard, nodes)


def test_a_configuration_file_cannot_ask_for_more_replicas_than_the_bound() -> None:
    profile = {"name": "p", "engine": "sim", "weights": "w"}
    model = {"name": "m", "replicas": MAX_REPLICAS + 1, "profiles": [profile]}
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(data={"models": [model]}, environ={})
    assert info.value.problems == (
        f"models[0].replicas: must be at most {MAX_REPLICAS}, got {MAX_REPLICAS + 1}",
    )
    autoscaled = {"name": "m", "autoscale": {"min_replicas": 0, "max_replicas": 10**9}}
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(data={"models": [autoscaled]}, environ={})
    assert info.value.problems == (
        f"models[0].autoscale.max_replicas: must be at most {MAX_REPLICAS}, got {10**9}",
    )


def test_a_gpu_name_is_compiled_once() -> None:
    assert gpu_name_pattern("H100|A100") is gpu_name_pattern("H100|A100")


def test_a_configuration_file_names_models_by_the_same_rule_as_the_admin_api() -> None:
    """One rule (catalog.name_problem) for names and aliases wherever they come from:
    no control characters (a raw CR reached a /metrics label), bounded lengths and
    alias counts."""
    from llmgw.catalog.rules import MAX_ALIASES, MAX_NAME_CHARS

    cases = [
        ({"name": "m\r"}, "models[0].name: must not contain control characters"),
        ({"name": "a\nb"}, "models[0].name: must not contain control characters"),
        ({"name": " m"}, "models[0].name: must not start or end with a space"),
        ({"name": "m" * (MAX_NAME_CHARS + 1)}, "models[0].name: must be at most 256 characters"),
        ({"name": "m", "aliases": ["ok", "x\ty"]}, "models[0].aliases[1]: must not contain"),
        ({"name": "m", "aliases": ["a" * 5000]}, "models[0].aliases[0]: must be at most 256"),
        (
            {"name": "m", "aliases": [f"a{i}" for i in range(20_000)]},
            f"models[0].aliases: at most {MAX_ALIASES} aliases, got 20000",
        ),
    ]
    for model, message in cases:
        with pytest.raises(cfg.ConfigError) as info:
            cfg.load(data={"models": [model]}, environ={})
        assert info.value.problems[0].startswith(message), (model, info.value.problems)
        assert len(info.value.problems[0]) < 300  # a 5,000-character name is not echoed
    # What the rule lets through: hub ids, tags, dots, non-ASCII letters.
    names = ["meta-llama/Llama-3.1-8B-Instruct", "qwen2.5:7b", "modèle", "a b"]
    loaded = cfg.load(data={"models": [{"name": n} for n in names]}, environ={})
    assert [m.name for m in loaded.models] == names
