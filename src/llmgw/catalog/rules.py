"""The model catalog: names, aliases, fallbacks, deployment profiles and their rules.

Every rule about models lives here, once: the configuration loader, the admin API
and the control plane all validate through :func:`check_models`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence

import attrs

from llmgw import units
from llmgw.domain.catalog import DeploymentProfile, ModelConfig, gpu_name_pattern
from llmgw.domain.engines import ENGINES

# More replicas than any fleet has GPUs: a typo (replicas = 10000000) must not send the
# reconciler off placing them.
MAX_REPLICAS = 10_000


#: The longest model name or alias: each is a Prometheus label value, a path segment
#: and a log field.
MAX_NAME_CHARS = 256
#: Aliases one model may have (each is a name clients may ask for).
MAX_ALIASES = 64


def _shown(name: str) -> str:
    """`name` for a message: quoted with its control characters escaped, and cut."""
    return repr(name[:64]) + ("..." if len(name) > 64 else "")


def name_problem(name: str) -> str | None:
    """What is wrong with `name` as a model name or alias, if anything: the rule for
    the configuration file's, the admin API's and the store's alike. A name reaches
    /metrics labels, logs and URLs, so no control character (CR, LF, TAB, NUL, ...),
    no space at either end, and a bounded length."""
    if not name:
        return "must not be empty"
    if len(name) > MAX_NAME_CHARS:
        return f"must be at most {MAX_NAME_CHARS} characters, got {len(name)}"
    if not name.isprintable():
        return f"must not contain control characters (CR, LF, TAB, ...), got {_shown(name)}"
    if name != name.strip():
        return f"must not start or end with a space, got {_shown(name)}"
    return None


def replica_bound(key: str, count: int) -> list[str]:
    """The problem with asking for `count` replicas at `key` (a model's `replicas`, its
    autoscale bounds): the admin API also asks before structuring a body."""
    if count > MAX_REPLICAS:
        return [f"{key}: must be at most {MAX_REPLICAS}, got {count}"]
    return []


def _check_profile(profile: DeploymentProfile, key: str) -> list[str]:
    problems: list[str] = []
    if not profile.name:
        problems.append(f"{key}.name: must not be empty")
    engine = ENGINES.get(profile.engine)
    if engine is None:
        problems.append(
            f"{key}.engine: unknown engine {profile.engine!r} (known: {', '.join(ENGINES)})"
        )
    if not profile.weights:
        problems.append(f"{key}.weights: must name the model weights (a path or hub id)")
    if profile.api_key is not None:
        if engine is not None and engine.api_key_env is None:
            problems.append(
                f"{key}.api_key: {profile.engine} takes its key only on its command line, "
                "which other users of the node can read; give it in args if you accept that"
            )
        elif not profile.api_key or any(not "!" <= c <= "~" for c in profile.api_key):
            problems.append(f"{key}.api_key: must be printable ASCII without spaces")
        elif profile.api_key == units.HIDDEN:  # copied back from a view
            problems.append(
                f"{key}.api_key: {units.HIDDEN!r} is what llmgw shows in place of a key; "
                "give the key"
            )
    if profile.sleep_after is not None:
        if engine is not None and engine.sleeps is None:
            sleepers = (name for name, e in ENGINES.items() if e.sleeps is not None)
            problems.append(
                f"{key}.sleep_after: {profile.engine} cannot sleep here (engines that can: "
                f"{', '.join(sleepers)})"
            )
        elif not profile.sleep_after > 0:
            problems.append(f"{key}.sleep_after: must be a positive duration")
    for dim in ("tensor_parallel", "pipeline_parallel"):
        if getattr(profile, dim) < 1:
            problems.append(f"{key}.{dim}: must be at least 1, got {getattr(profile, dim)}")
    total = profile.gpus
    per_node = profile.gpus_per_node
    if per_node is not None and total >= 1:
        if per_node < 1:
            problems.append(f"{key}.gpus_per_node: must be at least 1, got {per_node}")
        elif per_node > total or total % per_node:
            problems.append(
                f"{key}.gpus_per_node: tensor_parallel x pipeline_parallel = {total} GPUs "
                f"must split into whole nodes of {per_node}"
            )
    if profile.gpu_name is not None:
        try:
            gpu_name_pattern(profile.gpu_name)
        except re.error as exc:
            problems.append(f"{key}.gpu_name: not a valid regular expression: {exc}")
    return problems


def _check_autoscale(model: ModelConfig, key: str) -> list[str]:
    a = model.autoscale
    assert a is not None
    problems: list[str] = []
    if a.min_replicas < 0:
        problems.append(f"{key}.min_replicas: must be 0 or more, got {a.min_replicas}")
    if a.max_replicas < 1:
        problems.append(f"{key}.max_replicas: must be at least 1, got {a.max_replicas}")
    elif a.min_replicas > a.max_replicas:
        problems.append(
            f"{key}.min_replicas: must not exceed max_replicas ({a.max_replicas}), "
            f"got {a.min_replicas}"
        )
    elif model.replicas > a.max_replicas:
        # With autoscale, `replicas` is the count to start with; above the bound it
        # could only be a mistake (it is raised to min_replicas, for the default 1).
        problems.append(
            f"{key[: -len('.autoscale')]}.replicas: the count to start with must not exceed "
            f"autoscale.max_replicas ({a.max_replicas}), got {model.replicas}"
        )
    for name in ("min_replicas", "max_replicas"):
        problems.extend(replica_bound(f"{key}.{name}", getattr(a, name)))
    if not 0 < a.target_saturation <= 1:
        problems.append(f"{key}.target_saturation: must be in (0, 1], got {a.target_saturation:g}")
    for name in ("idle_timeout", "scale_up_window", "scale_down_window", "cold_start_timeout"):
        value = getattr(a, name)
        if value <= 0:
            problems.append(
                f"{key}.{name}: must be greater than 0, got {units.format_duration(value)}"
            )
    return problems


def check_models(
    models: Sequence[ModelConfig], routing_profiles: Collection[str], key: str = "models"
) -> list[str]:
    """Every rule of a catalog, as ``key: problem`` lines (empty when valid)."""
    problems: list[str] = []
    owner: dict[str, str] = {}  # every name and alias -> the model that owns it
    for i, model in enumerate(models):
        mkey = f"{key}[{i}]"
        if (problem := name_problem(model.name)) is not None:
            problems.append(f"{mkey}.name: {problem}")
            continue
        if model.name in owner:
            problems.append(f"{mkey}.name: model {model.name!r} is defined twice")
        owner.setdefault(model.name, model.name)
    for i, model in enumerate(models):
        mkey = f"{key}[{i}]"
        if len(model.aliases) > MAX_ALIASES:
            problems.append(
                f"{mkey}.aliases: at most {MAX_ALIASES} aliases, got {len(model.aliases)}"
            )
        for j, alias in enumerate(model.aliases[:MAX_ALIASES]):
            if (problem := name_problem(alias)) is not None:
                problems.append(f"{mkey}.aliases[{j}]: {problem}")
            elif (alias in owner and owner[alias] != model.name) or alias == model.name:
                what = "a model name" if alias in {m.name for m in models} else "an alias"
                problems.append(
                    f"{mkey}.aliases[{j}]: {alias!r} is already {what}"
                    + (f" of {owner[alias]!r}" if what == "an alias" else "")
                )
            else:
                owner[alias] = model.name
        if model.replicas < 0:
            problems.append(f"{mkey}.replicas: must be 0 or more, got {model.replicas}")
        problems.extend(replica_bound(f"{mkey}.replicas", model.replicas))
        if model.autoscale is not None:
            problems.extend(_check_autoscale(model, f"{mkey}.autoscale"))
        if model.routing_profile is not None and model.routing_profile not in routing_profiles:
            problems.append(
                f"{mkey}.routing_profile: no routing profile named {model.routing_profile!r} "
                f"(have {', '.join(sorted(routing_profiles))})"
            )
        seen: set[str] = set()
        for j, profile in enumerate(model.profiles):
            pkey = f"{mkey}.profiles[{j}]"
            if profile.name in seen:
                problems.append(f"{pkey}.name: profile {profile.name!r} is defined twice")
            seen.add(profile.name)
            problems.extend(_check_profile(profile, pkey))

    edges: dict[str, list[str]] = {}
    for i, model in enumerate(models):
        for j, fallback in enumerate(model.fallbacks):
            target = owner.get(fallback)
            if target is None:
                problems.append(f"{key}[{i}].fallbacks[{j}]: no model named {fallback!r}")
            elif target == model.name:
                problems.append(f"{key}[{i}].fallbacks[{j}]: a model cannot fall back to itself")
            else:
                edges.setdefault(model.name, []).append(target)
    cycle = _find_cycle(edges)
    if cycle:
        index = next(i for i, m in enumerate(models) if m.name == cycle[0])
        problems.append(f"{key}[{index}].fallbacks: fallbacks form a cycle: {' -> '.join(cycle)}")
    return problems


def _find_cycle(edges: dict[str, list[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


@attrs.frozen
class Catalog:
    """An immutable, validated view of the models: lookups by name or alias.

    A live catalog swaps whole Catalog values, so a reader never sees half a change.
    """

    models: tuple[ModelConfig, ...] = ()
    _by_name: dict[str, ModelConfig] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        index: dict[str, ModelConfig] = {}
        for model in self.models:
            index[model.name] = model
            for alias in model.aliases:
                index.setdefault(alias, model)
        object.__setattr__(self, "_by_name", index)

    def resolve(self, name: str) -> ModelConfig | None:
        """The model that `name` (a name or an alias) refers to."""
        return self._by_name.get(name)

    def names(self) -> Iterable[str]:
        """Every name and alias a client may ask for."""
        return self._by_name.keys()

    def candidates(self, name: str) -> list[ModelConfig]:
        """The model for `name` followed by its fallbacks, in order, without repeats."""
        first = self.resolve(name)
        if first is None:
            return []
        chain = [first]
        for fallback in first.fallbacks:
            model = self.resolve(fallback)
            if model is not None and model not in chain:
                chain.append(model)
        return chain

    def with_model(self, model: ModelConfig) -> Catalog:
        """A new catalog with `model` added or replaced (not validated here)."""
        rest = tuple(m for m in self.models if m.name != model.name)
        return Catalog((*rest, model))

    def without(self, name: str) -> Catalog:
        return Catalog(tuple(m for m in self.models if m.name != name))
