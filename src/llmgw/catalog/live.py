"""The live model catalog: the configuration's models plus those added at runtime.

Runtime models (admin API) are validated by the catalog's one set of rules against
the whole catalog, persisted in the store, and only then swapped in: the router and
the controller see a new :class:`~llmgw.catalog.rules.Catalog` value at once, never half a
change. Without a store, changes are refused instead of vanishing on restart.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from llmgw.catalog import rules as cat
from llmgw.config import JSON_WORDING, ConfigError, structure_as
from llmgw.domain.catalog import ModelConfig
from llmgw.store.base import Store, model_from_dict, model_to_dict

# The log topic, as the other loggers' (not the module): kept for operators' filters.
log = logging.getLogger("llmgw.models")


class ModelChangeError(Exception):
    """A runtime change was refused; `status` is the HTTP status that fits, `code` a
    machine-readable reason when the status alone does not say it."""

    def __init__(
        self, status: int, message: str, problems: Sequence[str] = (), *, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.problems = tuple(problems)
        self.code = code


def no_control_plane(name: str) -> ModelChangeError:
    return ModelChangeError(
        409,
        f"no control plane: this server runs as a router only (no model had deployment "
        f"profiles when it started), so no agent would ever start model {name!r}; add it "
        "without profiles (served by the endpoints that name it), or put it in the "
        "configuration file and restart the server, which then runs the control plane",
        code="no_control_plane",
    )


def parse_model(data: Mapping[str, Any]) -> ModelConfig:
    """A catalog entry from a JSON body in the configuration's shape; ConfigError names
    keys, in JSON's words. The catalog's rules are :meth:`ModelRegistry.put`'s."""
    return structure_as(data, ModelConfig, JSON_WORDING)


class ModelRegistry:
    """Owns the catalog; every listener given to :meth:`subscribe` gets each new Catalog."""

    def __init__(
        self,
        configured: Sequence[ModelConfig],
        routing_profiles: Collection[str],
        *,
        store: Store | None = None,
        extra: Sequence[ModelConfig] = (),
    ) -> None:
        self.configured = {m.name: m for m in configured}
        self.routing_profiles = set(routing_profiles)
        self.store = store
        self.runtime: dict[str, ModelConfig] = {}
        # Stored models that did not validate at load: name -> why (still in the store).
        self.skipped: dict[str, str] = {}
        # Models only endpoints name (router-only mode): served, not editable.
        self.extra = tuple(extra)
        self._listeners: list[Callable[[cat.Catalog], None]] = []
        self.catalog = self._build(self.runtime)

    def subscribe(self, listener: Callable[[cat.Catalog], None]) -> None:
        """Call `listener` with every catalog published from now on."""
        self._listeners.append(listener)

    def set_endpoint_models(self, names: Collection[str]) -> None:
        """The models endpoints name now (every source: llmgw.endpoint_sources); one no
        model or alias of the catalog's is becomes a bare entry, so that requests for it
        resolve. Publishes only when that set changed."""
        defined = [*self.configured.values(), *self.runtime.values()]
        known = {m.name for m in defined} | {a for m in defined for a in m.aliases}
        extra = tuple(ModelConfig(name=n) for n in sorted(set(names) - known))
        if {m.name for m in extra} == {m.name for m in self.extra}:
            return
        self.extra = extra
        self._publish(self.runtime)

    def _models(self, runtime: Mapping[str, ModelConfig]) -> list[ModelConfig]:
        names = set(self.configured) | set(runtime)
        models = [*self.configured.values(), *runtime.values()]
        return models + [m for m in self.extra if m.name not in names]

    def _build(self, runtime: Mapping[str, ModelConfig]) -> cat.Catalog:
        return cat.Catalog(tuple(self._models(runtime)))

    def _check(self, runtime: Mapping[str, ModelConfig]) -> list[str]:
        return cat.check_models(self._models(runtime), self.routing_profiles, "models")

    def _publish(self, runtime: dict[str, ModelConfig]) -> None:
        self.runtime = runtime
        self.catalog = self._build(runtime)
        for listener in self._listeners:
            listener(self.catalog)

    async def load(self) -> list[str]:
        """Merge the stored runtime models; returns a warning per one that was skipped
        (no longer valid, or shadowed by the configuration), never fails.

        A skipped model stays in the store (it may be fixed by adding it again, or
        removed: :meth:`delete` accepts it) and is reported at every start until then.
        """
        if self.store is None:
            return []
        runtime, skipped, warnings = await self._read()
        for warning in warnings:
            log.warning("%s", warning)
        self.skipped = skipped
        self._publish(runtime)
        return warnings

    async def refresh(self) -> bool:
        """Read the stored runtime models again (another instance on the same store may
        have changed them); publish the catalog only when they differ. Whether they
        did. Raises StoreError."""
        if self.store is None:
            return False
        runtime, skipped, warnings = await self._read()
        for warning in warnings:
            name = warning.split("'")[1] if "'" in warning else ""
            if name not in self.skipped:  # said once, not every refresh
                log.warning("%s", warning)
        self.skipped = skipped
        if runtime == self.runtime:
            return False
        self._publish(runtime)
        return True

    async def _read(self) -> tuple[dict[str, ModelConfig], dict[str, str], list[str]]:
        assert self.store is not None
        warnings: list[str] = []
        runtime: dict[str, ModelConfig] = {}
        skipped: dict[str, str] = {}
        for stored in await self.store.list_models():
            name = str(stored.config.get("name", "?"))
            try:
                model = model_from_dict(stored.config)
            except ConfigError as exc:
                skipped[name] = f"cannot be read: {'; '.join(exc.problems)}"
                warnings.append(_skipped(name, skipped[name]))
                continue
            if model.name in self.configured:
                warnings.append(
                    f"stored model {name!r} skipped: the configuration defines it (it wins)"
                )
                continue
            candidate = {**runtime, model.name: model}
            problems = self._check(candidate)
            if problems:
                # The catalog's keys index the merged list; for the operator, the
                # stored model's own keys say more (`fallbacks[0]: ...`).
                index = [m.name for m in self._models(candidate)].index(model.name)
                own = f"models[{index}]."
                skipped[name] = "; ".join(p.removeprefix(own) for p in problems)
                warnings.append(_skipped(name, skipped[name]))
                continue
            runtime[model.name] = model
        return runtime, skipped, warnings

    def _require_store(self) -> Store:
        if self.store is None:
            raise ModelChangeError(
                409,
                "no store is configured (store.url), so a model added now would vanish on "
                "restart; configure a store or add the model to the configuration file",
            )
        return self.store

    async def put(
        self, model: ModelConfig, *, create: bool, control_plane: bool = True
    ) -> ModelConfig:
        """Add (`create`) or replace a runtime model; validated, persisted, then live.

        `control_plane` says whether a controller runs to deploy models with profiles:
        without one such a model could never start, so it is refused (409) rather than
        reported added. (A server decides on its control plane at start, from the
        models it has then; the caller knows which it got.)"""
        store = self._require_store()
        if model.name in self.configured:
            raise ModelChangeError(
                409, f"model {model.name!r} is defined in the configuration file; edit it there"
            )
        if create and model.name in self.runtime:
            raise ModelChangeError(409, f"model {model.name!r} exists; PATCH it instead")
        if create:
            self._check_shadowing(model.name)
        if not create and model.name not in self.runtime:
            raise ModelChangeError(404, f"no runtime model {model.name!r}")
        runtime = {**self.runtime, model.name: model}
        problems = self._check(runtime)
        if problems:
            raise ModelChangeError(400, problems[0], problems)
        # After validation: a broken entry hears what is wrong with it first.
        if model.profiles and not control_plane:
            raise no_control_plane(model.name)
        await store.put_model(model)  # replaces a skipped one of that name
        self.skipped.pop(model.name, None)
        self._publish(runtime)
        return model

    def _check_shadowing(self, name: str) -> None:
        """409 for a new model's name that clients already use for another model (an
        alias, or a model only endpoints serve): it would take their requests over."""
        existing = self.catalog.resolve(name)
        if existing is not None and existing.name != name:
            raise ModelChangeError(
                409, f"{name!r} is already an alias of model {existing.name!r}; pick another name"
            )
        if any(m.name == name for m in self.extra):
            raise ModelChangeError(
                409,
                f"model {name!r} is served by endpoints in the configuration file that name "
                "it; define it in the configuration file to change it",
            )

    async def patch(
        self, name: str, changes: Mapping[str, Any], *, control_plane: bool = True
    ) -> ModelConfig:
        """Change some keys of a runtime model; `control_plane` as for :meth:`put`."""
        current = self.runtime.get(name)
        if current is None:
            if name in self.configured:
                raise ModelChangeError(
                    409, f"model {name!r} is defined in the configuration file; edit it there"
                )
            if name in self.skipped:
                raise ModelChangeError(
                    409,
                    f"stored model {name!r} was skipped at start ({self.skipped[name]}); "
                    "add it again fixed, or remove it",
                )
            raise ModelChangeError(404, f"no runtime model {name!r}")
        if "name" in changes and changes["name"] != name:
            raise ModelChangeError(400, "a model cannot be renamed; add a new one instead")
        merged = {**model_to_dict(current), **dict(changes)}
        try:
            model = parse_model(merged)
        except ConfigError as exc:
            raise ModelChangeError(400, exc.problems[0], exc.problems) from None
        return await self.put(model, create=False, control_plane=control_plane)

    async def delete(self, name: str) -> None:
        store = self._require_store()
        if name in self.configured:
            raise ModelChangeError(
                409, f"model {name!r} is defined in the configuration file; remove it there"
            )
        if name in self.skipped:  # never served: removing it changes no catalog
            await store.delete_model(name)
            del self.skipped[name]
            return
        if name not in self.runtime:
            raise ModelChangeError(404, f"no runtime model {name!r}")
        runtime = {k: v for k, v in self.runtime.items() if k != name}
        problems = self._check(runtime)
        if problems:  # e.g. another model falls back to it
            raise ModelChangeError(409, problems[0], problems)
        await store.delete_model(name)
        self._publish(runtime)

    def describe(self, model: ModelConfig) -> dict[str, Any]:
        data = model_to_dict(model)
        data["source"] = "runtime" if model.name in self.runtime else "config"
        return data


def _skipped(name: str, reason: str) -> str:
    # The name as a shell word, or escaped when it holds what a log line must not.
    shown = shlex.quote(name) if name.isprintable() else repr(name)
    return (
        f"stored model {name!r} skipped, no longer valid: {reason} "
        f"(add it again fixed, or remove it: llmgw-ctl models remove {shown})"
    )
