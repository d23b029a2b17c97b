"""Scheduler plugins by name: what a routing profile's ``filters``, ``scorers`` and
``picker`` name in the configuration (docs/scheduling.md, "Plugins by name").

A name resolves, in this order, to a built-in plugin (:data:`BUILT_IN`), one a program
registered with :func:`register` before its gateway was assembled, or one an installed
package offers through the entry-point groups ``llmgw.filters``, ``llmgw.scorers`` and
``llmgw.pickers`` (``name = "package.module:factory"``). Entry points are found in
every process, so they are what worker processes can use; a plugin registered in one
process exists only there. A name that resolves to nothing is a configuration error
(:func:`problems` lists them, :func:`build` raises them), never a silent default.

A factory takes the :class:`Settings` and returns the plugin: an object with the one
method of :class:`~.scheduler.Filter`, :class:`~.scheduler.Scorer` or
:class:`~.scheduler.Picker`, and any of the hooks of :mod:`.hooks` when it keeps state
of its own. A name makes one object however many profiles name it.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import attrs

from llmgw.config import ConfigError, RoutingProfile, ScoringConfig
from llmgw.router.scheduling import plugins as p
from llmgw.router.scheduling.scheduler import Filter, Picker, Scheduler, Scorer
from llmgw.router.scheduling.state import Saturation

__all__ = [
    "BUILT_IN",
    "GROUPS",
    "Kind",
    "Settings",
    "build",
    "default_scheduler",
    "names",
    "problems",
    "register",
]

Kind = Literal["filter", "scorer", "picker"]
KINDS: tuple[Kind, ...] = ("filter", "scorer", "picker")
#: The entry-point group of each kind.
GROUPS: dict[Kind, str] = {
    "filter": "llmgw.filters",
    "scorer": "llmgw.scorers",
    "picker": "llmgw.pickers",
}


@attrs.frozen
class Settings:
    """What a plugin factory is given: the router's scoring knobs and staleness."""

    scoring: ScoringConfig
    stale_after: float


Factory = Callable[[Settings], Any]

#: The built-in plugins by kind and name (llmgw.router.scheduling.plugins).
BUILT_IN: dict[Kind, dict[str, Factory]] = {
    "filter": {
        "fresh": lambda s: p.Fresh(),
        "session-affinity": lambda s: p.SessionAffinity(),
        "prefix-affinity": lambda s: p.PrefixAffinity(),
        "room": lambda s: p.Room(),
        "rendezvous": lambda s: p.Rendezvous(),
        "cache-aware": lambda s: p.CacheAware(),
    },
    # Named as the profile's weight fields, so a profile's scorers are all names.
    "scorer": {
        "queue": lambda s: p.Queue(s.scoring.target_waiting),
        "inflight": lambda s: p.Load(),
        "prefill": lambda s: p.Prefill(),
        "kv": lambda s: p.KvCache(s.scoring.kv_ceiling),
        "staleness": lambda s: p.Staleness(s.stale_after),
        "unknown": lambda s: p.Unknown(),
        "stale": lambda s: p.Stale(),
        "throttle": lambda s: p.Throttle(),
        "prefix": lambda s: p.PrefixBonus(),
    },
    "picker": {"lowest-cost": lambda s: p.LowestCost()},
}

#: The filters each rule runs, before those a profile names.
RULE_FILTERS: dict[str, tuple[str, ...]] = {
    "work": ("fresh", "session-affinity", "prefix-affinity", "room", "rendezvous"),
    "cache_aware": ("fresh", "cache-aware"),
    "none": (),
}
#: Scorers every profile has at weight 1: they rank replicas the engines say nothing
#: of, stale ones and those that answered 429 (llmgw.router.scheduling.plugins).
ALWAYS = ("unknown", "stale", "throttle")
#: The built-in scorers a profile weighs with its fields of the same names.
WEIGHTED = ("queue", "inflight", "prefill", "kv", "staleness", "prefix")

_registered: dict[Kind, dict[str, Factory]] = {kind: {} for kind in KINDS}


def register(kind: Kind, name: str, factory: Factory) -> None:
    """Make `factory` the `kind` plugin named `name` in this process (before the gateway
    is assembled). A name taken already (built in, registered) is a ValueError."""
    if kind not in KINDS:
        raise ValueError(f"a plugin is one of {', '.join(KINDS)}, not {kind!r}")
    if name in BUILT_IN[kind] or name in _registered[kind]:
        raise ValueError(f"a {kind} named {name!r} exists already")
    _registered[kind][name] = factory


def unregister(kind: Kind, name: str) -> None:
    """Forget a plugin :func:`register` made (tests)."""
    _registered[kind].pop(name, None)


def _entry_points(kind: Kind) -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUPS[kind])}


def names(kind: Kind) -> list[str]:
    """Every `kind` plugin a profile can name here, sorted."""
    return sorted({*BUILT_IN[kind], *_registered[kind], *_entry_points(kind)})


def _known(kind: Kind, name: str) -> bool:
    # Entry points are read (every installed distribution's metadata) only for a name
    # that is neither built in nor registered: not at every start for the defaults.
    return name in BUILT_IN[kind] or name in _registered[kind] or name in _entry_points(kind)


def _factory(kind: Kind, name: str) -> Factory | None:
    found = BUILT_IN[kind].get(name) or _registered[kind].get(name)
    if found is not None:
        return found
    ep = _entry_points(kind).get(name)
    return None if ep is None else ep.load()


def _named(profile: RoutingProfile) -> list[tuple[Kind, str, str]]:
    """(kind, name, the key naming it) for every plugin `profile` names itself."""
    return [
        *(("filter", n, f"filters[{i}]") for i, n in enumerate(profile.filters)),
        *(("scorer", n, f"scorers.{n}") for n in profile.scorers),
        ("picker", profile.picker, "picker"),
    ]


def problems(profiles: Mapping[str, RoutingProfile], *, portable: bool = False) -> list[str]:
    """What is wrong with the plugin names `profiles` give, a line per key; with
    `portable` (worker processes will build them too) a plugin only :func:`register`
    made is one as well."""
    found: list[str] = []
    for profile_name, profile in profiles.items():
        for kind, name, key in _named(profile):
            at = f"router.profiles.{profile_name}.{key}"
            if kind == "scorer" and name in BUILT_IN["scorer"]:
                found.append(
                    f"{at}: {name!r} is built in: its weight is the profile's "
                    f"`{name}`" + ("" if name in WEIGHTED else " (always 1)")
                )
            elif not _known(kind, name):
                found.append(f"{at}: no {kind} named {name!r} (have: {', '.join(names(kind))})")
            elif portable and name in _registered[kind]:
                found.append(
                    f"{at}: {kind} {name!r} is registered in this process only, and worker "
                    f"processes build the profiles too: offer it as entry point "
                    f"{GROUPS[kind]!r} of an installed package, or run one worker"
                )
    return found


def build(
    scoring: ScoringConfig, profiles: Mapping[str, RoutingProfile], stale_after: float
) -> dict[str, Scheduler]:
    """A scheduler per profile: its rule's filters then those it names, the built-in
    scorers at its weights plus those it names, and its picker. ConfigError names
    every plugin that does not resolve."""
    wrong = problems(profiles)
    if wrong:
        raise ConfigError(wrong)
    settings = Settings(scoring, stale_after)
    # One object per plugin name, whichever profiles name it: a plugin that keeps state
    # through its hooks (llmgw.router.scheduling.hooks) keeps one table, as llm-d's do.
    made: dict[tuple[Kind, str], Any] = {}
    return {name: _scheduler(profile, settings, made) for name, profile in profiles.items()}


def _make(
    kind: Kind, names_: Iterable[str], settings: Settings, made: dict[tuple[Kind, str], Any]
) -> list[Any]:
    plugins = []
    for name in names_:
        if (kind, name) not in made:
            factory = _factory(kind, name)
            assert factory is not None, name  # problems() found none missing
            made[kind, name] = factory(settings)
        plugins.append(made[kind, name])
    return plugins


def _scheduler(
    profile: RoutingProfile, settings: Settings, made: dict[tuple[Kind, str], Any]
) -> Scheduler:
    filters = (*RULE_FILTERS[profile.rule], *profile.filters)
    # The built-in terms in a fixed order (a sum's rounding decides exact ties), then
    # the profile's own.
    weights = {n: 1.0 if n in ALWAYS else float(getattr(profile, n)) for n in BUILT_IN["scorer"]}
    weights |= dict(profile.scorers)
    scorers = _make("scorer", weights, settings, made)
    (picker,) = _make("picker", [profile.picker], settings, made)
    return Scheduler(
        saturation=Saturation(settings.scoring, settings.stale_after),
        filters=tuple(_make("filter", filters, settings, made)),
        scorers=tuple(zip(scorers, weights.values(), strict=True)),
        picker=picker,
    )


def default_scheduler(
    scoring: ScoringConfig,
    profile: RoutingProfile,
    stale_after: float,
    *,
    filters: tuple[Filter, ...] = (),
    scorers: tuple[tuple[Scorer, float], ...] = (),
    picker: Picker | None = None,
) -> Scheduler:
    """`profile`'s scheduler with plugin objects of the caller's: `filters` run after
    the profile's, `scorers` add to its terms, `picker` replaces its picker."""
    wrong = problems({"profile": profile})
    if wrong:
        raise ConfigError(wrong)
    built = _scheduler(profile, Settings(scoring, stale_after), {})
    return attrs.evolve(
        built,
        filters=(*built.filters, *filters),
        scorers=(*built.scorers, *scorers),
        picker=picker or built.picker,
    )
