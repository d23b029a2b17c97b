"""Configuration: the schema with its defaults, loading, overlays and validation.

A configuration is built in layers, each a nested dict merged over the one
before (tables merge key by key, arrays replace whole):

1. the built-in defaults (the attrs defaults below, DESIGN §3),
2. the TOML file,
3. ``LLMGW_`` environment variables, ``__`` for nesting
   (``LLMGW_ROUTER__RETRIES=3``; ``LLMGW_ROUTER__ADMISSION__BANDS__2__PRIORITY=5``
   indexes into an array),
4. command-line flags.

The merged dict is structured by cattrs (types, unknown keys) and then checked by
:func:`check`, a pure function that returns every problem with the exact key
that has it. Anything that would fail confusingly at request time fails here.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cattrs
import tomli_w
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from llmgw import catalog, units

# The catalog's values are the domain's; the schema holds them (and names them for
# `from llmgw.config import ModelConfig`).
from llmgw.domain.catalog import AutoscaleConfig, DeploymentProfile, ModelConfig
from llmgw.units import Bytes, Seconds

__all__ = [
    "AdmissionConfig",
    "AffinityConfig",
    "AuthConfig",
    "AutoscaleConfig",
    "Band",
    "Config",
    "ConfigError",
    "ControlConfig",
    "DeploymentProfile",
    "EndpointConfig",
    "LogConfig",
    "ModelConfig",
    "RouterConfig",
    "RoutingProfile",
    "ScoringConfig",
    "StoreConfig",
    "Timeouts",
    "TlsConfig",
    "TracingConfig",
    "check",
    "convert",
    "dump_toml",
    "load",
    "merge",
]

ENV_PREFIX = "LLMGW_"

# Keys that no longer exist, and what replaced them (named in the unknown-key error).
REMOVED_KEYS = {
    "router.scoring.target_inflight": (
        "removed: a replica is full when its engine says so (its queue, KV cache, a "
        "429) or at its capacity: launch flags under the control plane, or "
        "`capacity` on a static endpoint"
    ),
    "router.scoring.session_load_factor": (
        "removed: a session stays on its replica while that one has room and its "
        "prefill work (what it still has to prefill, plus the part of this prompt it "
        "does not hold) is the least; see docs/scheduling.md"
    ),
}


@attrs.frozen
class Timeouts:
    """Per-phase deadlines of one proxied request: reading the client's request head
    (`client_header`, on both listeners) and body (`client_body`), then the upstream
    phases."""

    # Connecting to the engine.
    dial: Seconds = Seconds(5.0)
    # From the request sent to the engine's response head.
    response_header: Seconds = Seconds(60.0)
    # From the response head to a stream's first token.
    first_token: Seconds = Seconds(120.0)
    # The longest gap between two reads from the engine, or two writes the client
    # takes nothing of (then its connection is cut).
    idle: Seconds = Seconds(60.0)
    # The whole request, however it streams.
    total: Seconds = Seconds(1800.0)
    # The client's request head, and a kept-alive connection's wait for its next one.
    client_header: Seconds = Seconds(10.0)
    # The client's request body (408 past it).
    client_body: Seconds = Seconds(30.0)


@attrs.frozen
class ScoringConfig:
    """When a replica counts as full by its engine's account (llmgw.router.scheduling)."""

    # Requests queued at the engine (per unit of weight).
    target_waiting: float = 4.0
    # The share of its KV cache in use at which a replica counts as full.
    kv_ceiling: float = 0.9


@attrs.frozen
class RoutingProfile:
    """Weights of the scorers that rank replicas for a model with this profile."""

    queue: float = 1.0
    inflight: float = 1.0
    kv: float = 0.5
    prefix: float = 0.5
    staleness: float = 1.0
    # Prompt tokens still to prefill there (the router's count): a new request waits
    # for them.
    prefill: float = 1.0


def _default_profiles() -> dict[str, RoutingProfile]:
    return {
        # Latency first: queues and in-flight work dominate.
        "chat": RoutingProfile(queue=1.0, inflight=1.0, kv=0.5, prefix=0.5, staleness=1.0),
        # Throughput first: fill caches and reuse prefixes, tolerate some queueing.
        "batch": RoutingProfile(
            queue=0.5, inflight=0.5, kv=1.0, prefix=1.0, staleness=1.0, prefill=0.5
        ),
    }


@attrs.frozen
class AffinityConfig:
    """Session and prefix affinity tables (bounded, expiring)."""

    # A session (the `router.session_header` value) stays on its replica this long
    # after its last request.
    session_ttl: Seconds = Seconds(1800.0)
    # Sessions remembered at most (the least recently used go first).
    session_table_size: int = 100_000
    # Prompts are hashed in blocks of this many characters for prefix affinity...
    prefix_block_chars: int = 256
    # ...up to this many blocks of a prompt.
    prefix_max_blocks: int = 64
    # Prefix blocks remembered at most; 0 turns prefix affinity off.
    prefix_table_size: int = 200_000
    # A prefix block is forgotten this long after it was last routed.
    prefix_ttl: Seconds = Seconds(600.0)


@attrs.frozen
class Band:
    """An admission band: requests of higher priority are admitted first, and a band
    is held back once its pool's saturation reaches its ceiling."""

    name: str
    # Higher is admitted first.
    priority: int
    # In (0, 1]: the pool saturation past which this band's requests queue.
    saturation_ceiling: float


def _default_bands() -> tuple[Band, ...]:
    return (
        Band("platinum", 400, 1.00),
        Band("gold", 300, 0.85),
        Band("silver", 200, 0.60),
        Band("bronze", 100, 0.30),
    )


@attrs.frozen
class AdmissionConfig:
    """Priority-band admission in front of saturated pools (docs/admission.md)."""

    enabled: bool = True
    # The request header naming a request's band (ignored for a key that has one).
    band_header: str = "x-llmgw-band"
    # The request header naming its tenant: tenants of one band take turns, and
    # usage records keep it.
    tenant_header: str = "x-llmgw-tenant"
    # The band of a request that names none (and of a key without one).
    default_band: str = "gold"
    # A request queued this long is refused (429).
    queue_ttl: Seconds = Seconds(30.0)
    # Requests queued per band at most; past it, refused at once.
    queue_capacity_per_band: int = 2000
    # How often queued requests are looked at again.
    interval: Seconds = Seconds(0.01)
    # The default band (and any above it) keeps headroom under its ceiling only while a
    # higher band had a request within this window; bands below the default always do.
    reserve_window: Seconds = Seconds(60.0)
    bands: tuple[Band, ...] = attrs.field(factory=_default_bands)


@attrs.frozen
class RouterConfig:
    # Saturation rests on what engines report: the fresher, the less a burst can
    # overshoot a replica's room between two looks.
    scrape_interval: Seconds = Seconds(1.0)
    # At most scrape_interval.
    scrape_timeout: Seconds = Seconds(1.0)
    # An endpoint not scraped this long is scored down.
    stale_after: Seconds = Seconds(10.0)
    # More replicas tried after a failure, only before any byte reached the client.
    retries: int = 2
    # How long an open breaker keeps an endpoint out.
    cooldown: Seconds = Seconds(15.0)
    # Consecutive failures that open an endpoint's breaker (1: pure cooldown).
    failure_threshold: int = 3
    # The routing profile (router.profiles) of a model that names none.
    default_profile: str = "chat"
    # The request header whose value keeps a conversation on one replica.
    session_header: str = "x-session-id"
    # Ask engines for usage on streams even when the client did not (usage records
    # and token metrics need it); the client still gets only what it asked for.
    inject_usage: bool = True
    # The largest request body taken from a client (413 past it).
    max_body_bytes: Bytes = Bytes(32 * 1024 * 1024)
    # Client connections each listener serves at once (past it: 503 and close); 0:
    # derived from the open-file limit at start (llmgw.server.connection_cap).
    max_connections: int = 0
    # What the router takes from an engine: a non-streaming answer (an embeddings batch
    # is the large case) and one SSE event of a stream, at most. Beyond, the attempt
    # fails as a bad response (502 when no other replica answers).
    max_response_bytes: Bytes = Bytes(64 * 1024 * 1024)
    max_event_bytes: Bytes = Bytes(1024 * 1024)
    # On SIGTERM, how long requests in flight get to finish before the server stops.
    drain_timeout: Seconds = Seconds(30.0)
    timeouts: Timeouts = Timeouts()
    scoring: ScoringConfig = ScoringConfig()
    affinity: AffinityConfig = AffinityConfig()
    admission: AdmissionConfig = AdmissionConfig()
    # Routing profiles by name, for models to pick (`routing_profile`).
    profiles: dict[str, RoutingProfile] = attrs.field(factory=_default_profiles)


#: How placement chooses among the nodes that fit (ControlConfig.placement).
PLACEMENT_POLICIES = ("binpack", "spread")


@attrs.frozen
class ControlConfig:
    """The control plane: reconciling, node expiry, engine ports."""

    # The reconcile period (passes also follow events).
    interval: Seconds = Seconds(5.0)
    # A model whose replica keeps failing to start is retried after this, doubling...
    base_backoff: Seconds = Seconds(10.0)
    # ...up to this.
    max_backoff: Seconds = Seconds(600.0)
    # A node silent this long is unreachable: no new placements there.
    unreachable_after: Seconds = Seconds(15.0)
    # A node silent this long is lost: its replicas are placed elsewhere.
    lost_after: Seconds = Seconds(60.0)
    # A replica whose shards are not all ready this long after the start command
    # failed to start (large models load for many minutes).
    start_timeout: Seconds = Seconds(1800.0)
    # The ports engines are given on each node (their HTTP and distributed init).
    port_range: tuple[int, int] = (20000, 20999)
    # The network interface multi-node engines bootstrap over (NCCL, Gloo).
    mgmt_interface: str = "eth0"
    # Instances on one PostgreSQL store: how long the leader's lease on the control
    # plane lasts unrenewed (it renews every third of it); a follower takes over
    # within about this long after the leader is gone (docs/operations.md).
    lease: Seconds = Seconds(10.0)
    # Where agents reach this instance's agent port (HOST:PORT), told to agents by
    # the instances that do not lead; default: the agent listener's address (the host
    # name when it listens on every interface).
    advertise: str = ""
    # Which of the nodes that fit a replica gets it: "binpack", the fullest (whole
    # nodes stay free for big models), or "spread", the emptiest (load and failures
    # spread over the nodes).
    placement: str = "binpack"


@attrs.frozen
class EndpointConfig:
    """A static engine replica (router-only mode)."""

    # Names it in logs, metrics and the admin API (never its address to clients).
    id: str
    # The engine's base URL (http:// or https://).
    url: str
    # The models it serves, as clients name them.
    models: tuple[str, ...]
    # A label for grouping endpoints, shown by the admin API and readable by custom
    # scheduling plugins (docs/scheduling.md); the built-in ones ignore it.
    pool: str = "default"
    # Scales this endpoint's share among equally loaded peers.
    weight: float = 1.0
    # Lower tiers are used only while every higher tier is saturated or unusable;
    # 0 is the highest.
    priority: int = 0
    # Sequences the engine runs at once (vLLM --max-num-seqs, SGLang
    # --max-running-requests, llama.cpp -np), when known: past it, requests queue.
    capacity: int | None = None
    # Sent to the engine as `Authorization: Bearer <api_key>` (vLLM's --api-key, a
    # hosted provider's key), on requests and scrapes; never logged nor shown.
    api_key: str | None = attrs.field(default=None, repr=False)
    # More headers sent with every request to this engine (a provider's org header).
    headers: dict[str, str] = attrs.field(factory=dict, repr=False)


@attrs.frozen
class TlsConfig:
    """A listener's TLS files (PEM); SIGHUP rereads those of listen_tls and admin_tls."""

    # The certificate chain.
    cert: str
    # Its private key.
    key: str
    # Clients must present a certificate signed by this CA (required for agent_tls).
    client_ca: str | None = None


@attrs.frozen
class AuthConfig:
    # Require API keys on the client port even before the first key exists (keys
    # are required anyway as soon as one exists).
    required: bool = False
    # How long a key lookup is cached: a revoked key stops working within this.
    cache_ttl: Seconds = Seconds(1.0)
    # How long a dashboard login lasts (the session is kept in the store).
    session_ttl: Seconds = Seconds(8 * 3600.0)
    # Per-key Prometheus counters (llmgw_key_requests_total, llmgw_key_tokens_total, and
    # a key label on llmgw_rejected_requests_total): off by default, since every key
    # multiplies the series count (cardinality).
    key_metrics: bool = False


@attrs.frozen
class TracingConfig:
    """OpenTelemetry traces of client requests (llmgw.router.tracing), off unless
    `endpoint` is set."""

    # The collector's OTLP/HTTP traces URL, path included
    # (http://collector:4318/v1/traces); "" for no tracing.
    endpoint: str = ""
    # The share of the traces llmgw starts that are recorded, 0 to 1.
    sample_ratio: float = 1.0
    # A client's traceparent decides for its request (its sampled flag), as W3C and
    # OTel's default sampler do; false: the ratio decides for every request.
    parent_based: bool = True
    service_name: str = "llmgw"
    # Each export's deadline, and the bound on the last flush when the server stops.
    timeout: Seconds = Seconds(10.0)
    # Sent with each export (a collector's API key): secrets, hidden by --print-config.
    headers: dict[str, str] = attrs.field(factory=dict, repr=False)


DEFAULT_STORE_URL = "sqlite://llmgw.db"  # relative: the working directory (store/sqlite.py)


@attrs.frozen
class StoreConfig:
    # The embedded default: SQLite in the working directory. "" for no store: the
    # endpoints that would persist something (keys, runtime models) then refuse.
    url: str = DEFAULT_STORE_URL


@attrs.frozen
class LogConfig:
    """What llmgw-server logs besides its events (the level and format are flags:
    --log-level, --log-format)."""

    # An access-log line per request routed to a model and per refusal, at INFO on
    # the llmgw.access logger (docs/router.md, "Logs").
    access: bool = True


@attrs.frozen
class Config:
    # The client API (HOST:PORT, :PORT for every interface; port 0 picks one).
    listen: str = ":8080"
    # Processes serving the client API, sharing its port (SO_REUSEPORT) behind the one
    # that runs everything else (docs/operations.md, "Every core"); 0: one per core.
    workers: int = 0
    # Metrics, health, the admin API and the dashboard; off loopback, admin keys.
    admin_listen: str = "127.0.0.1:9090"
    # Where agents connect (gRPC), with the control plane only.
    agent_listen: str = ":7443"
    router: RouterConfig = RouterConfig()
    control: ControlConfig = ControlConfig()
    store: StoreConfig = StoreConfig()
    auth: AuthConfig = AuthConfig()
    tracing: TracingConfig = TracingConfig()
    log: LogConfig = LogConfig()
    agent_tls: TlsConfig | None = None
    # HTTPS on the client port and the admin listener (served by hypercorn, HTTP/2 by
    # ALPN); with `client_ca` a client certificate signed by it is required.
    listen_tls: TlsConfig | None = None
    admin_tls: TlsConfig | None = None
    # More Host names the admin listener answers to; others get 421. Always counted: the
    # loopback names and its configured and bound addresses; off loopback also the
    # machine's host name and FQDN, and on a wildcard bind its interfaces' addresses.
    admin_hosts: tuple[str, ...] = ()
    endpoints: tuple[EndpointConfig, ...] = ()
    models: tuple[ModelConfig, ...] = ()

    @property
    def control_plane(self) -> bool:
        """Whether any model asks to be deployed (DESIGN §1: that turns the control plane on)."""
        return any(m.profiles for m in self.models)


_T = TypeVar("_T")


# What may be sent in an engine request's head: RFC 9110 tokens and visible ASCII (so
# a configured value can never add a header line of its own).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\x21-\x7e]+")
_HEADER_VALUE_SPACES = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")
# Headers llmgw writes itself on each engine request.
_OWN_HEADERS = frozenset(
    {"authorization", "content-type", "content-length", "host", "x-request-id", "traceparent"}
)


class ConfigError(Exception):
    """The configuration cannot be used; `problems` name each key and what is wrong."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


# -- conversion ---------------------------------------------------------------


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, omit_if_default=False)
    conv.register_structure_hook(Seconds, lambda v, _: Seconds(units.parse_duration(v)))
    conv.register_unstructure_hook(Seconds, lambda v: units.format_duration(v))
    conv.register_structure_hook(Bytes, lambda v, _: Bytes(units.parse_size(v)))
    conv.register_unstructure_hook(Bytes, lambda v: units.format_size(v))

    def strict(kind: type[Any]) -> Any:
        # cattrs would happily turn "3" into 3 or 1.5 into 1; a config typo should not pass.
        def hook(value: object, _: object) -> Any:
            if isinstance(value, bool) and kind is not bool:
                raise ValueError(f"expected {kind.__name__}, got {value!r}")
            if kind is float and isinstance(value, int | float):
                return float(value)
            if not isinstance(value, kind):
                raise ValueError(f"expected {kind.__name__}, got {value!r}")
            return value

        return hook

    for kind in (int, float, str, bool):
        conv.register_structure_hook(kind, strict(kind))
    return conv


converter = _make_converter()


def _unstructure(config: object) -> Any:
    """A nested dict without None values (TOML has no null)."""

    def prune(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: prune(v) for k, v in value.items() if v is not None}
        if isinstance(value, list | tuple):
            return [prune(v) for v in value]
        return value

    return prune(converter.unstructure(config))


#: What `dump_toml` writes for a secret.
HIDDEN = "<hidden>"


def hide_profile_keys(models: Any) -> None:
    """Replace every deployment profile's `api_key` in unstructured `models` by HIDDEN."""
    for model in models:
        for profile in model.get("profiles", ()):
            if profile.get("api_key") is not None:
                profile["api_key"] = HIDDEN


def dump_toml(config: Config) -> str:
    """The effective configuration as TOML that :func:`load` reads back unchanged,
    but for secrets (endpoints' `api_key` and `headers` values, the tracing exporter's
    `headers` values): shown as HIDDEN."""
    data = _unstructure(config)
    hide_profile_keys(data.get("models", ()))
    for holder in (*data.get("endpoints", ()), data["tracing"]):
        if "api_key" in holder:
            holder["api_key"] = HIDDEN
        holder["headers"] = dict.fromkeys(holder.get("headers", {}), HIDDEN)
        if not holder["headers"]:
            del holder["headers"]
    return tomli_w.dumps(data)


# -- layering -----------------------------------------------------------------


def merge(base: Any, over: Any) -> Any:
    """`over` laid over `base`, as configuration layers are: tables merge key by key,
    anything else (arrays too) replaces; neither argument is changed."""
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = merge(base[key], value) if key in base else value
        return merged
    return over


def _field_type(cls: Any, key: str) -> Any:
    """The type of attrs class `cls`'s field `key`; None for no such field."""
    if attrs.has(cls) and key in attrs.fields_dict(cls):
        return _type_hints(cls)[key]
    return None


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    # Resolving string annotations costs; the shape check asks once per key of a
    # table, and the admin API on every request body.
    return typing.get_type_hints(cls)


def _inner(tp: Any, key: str) -> Any:
    """The type found one step below `tp` at `key` (a field, dict value or array item)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        tp = next((a for a in args if a is not type(None)), tp)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict:
        return args[1]
    if origin is tuple and args:
        return args[0]
    return _field_type(tp, key)


def _parse_env_value(tp: Any, raw: str, key: str) -> Any:
    """Parse an environment string into what the field at `key` expects."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        origin = typing.get_origin(tp)
    if tp is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError([f"{key}: expected true or false, got {raw!r}"])
    if tp is int:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError([f"{key}: expected an integer, got {raw!r}"]) from None
    if tp is float:
        try:
            return float(raw)
        except ValueError:
            raise ConfigError([f"{key}: expected a number, got {raw!r}"]) from None
    if tp in (str, Seconds, Bytes):
        return raw
    # Arrays and tables: TOML syntax (`[20000, 20999]`, `{ a = "b" }`), or a
    # comma-separated list for arrays of plain values.
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if origin is tuple:
            return [p.strip() for p in raw.split(",") if p.strip()]
        raise ConfigError([f"{key}: cannot parse {raw!r} as a TOML value"]) from None


def env_overlay(environ: Mapping[str, str], base: Any) -> dict[str, Any]:
    """Apply ``LLMGW_A__B=value`` variables onto the merged dict `base`; returns a new dict."""
    result: Any = base
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        result = _set_path(result, parts, environ[name], Config, name)
    return typing.cast(dict[str, Any], result)


def _set_path(node: Any, parts: list[str], raw: str, tp: Any, name: str) -> Any:
    key, rest = parts[0], parts[1:]
    if isinstance(node, list):
        if not key.isdigit() or int(key) >= len(node):
            raise ConfigError([f"{name}: no array element {key!r} to set"])
        copy = list(node)
        sub_tp = _inner(tp, key)
        copy[int(key)] = (
            _set_path(copy[int(key)], rest, raw, sub_tp, name)
            if rest
            else merge(copy[int(key)], _parse_env_value(sub_tp, raw, name))
        )
        return copy
    node = dict(node) if isinstance(node, dict) else {}
    sub_tp = _inner(tp, key)
    if sub_tp is None:
        # Unknown: leave it for the structuring step, which names it and suggests.
        node[key] = raw if not rest else _set_path({}, rest, raw, None, name)
        return node
    if rest:
        node[key] = _set_path(node.get(key, {}), rest, raw, sub_tp, name)
    else:
        # A table given whole merges like one from the file: it cannot drop built-ins.
        value = _parse_env_value(sub_tp, raw, name)
        node[key] = merge(node[key], value) if key in node else value
    return node


# -- errors from structuring --------------------------------------------------


def _structure_problems(exc: BaseException, path: str) -> list[str]:
    problems: list[str] = []
    if isinstance(exc, ClassValidationError | IterableValidationError):
        with_notes, others = exc.group_exceptions()
        for sub, note in with_notes:
            step = getattr(note, "name", None) or getattr(note, "index", None)
            if isinstance(step, int):
                sub_path = f"{path}[{step}]"
            else:
                sub_path = f"{path}.{step}" if path else str(step)
            problems.extend(_structure_problems(sub, sub_path))
        for sub in others:
            problems.extend(_structure_problems(sub, path))
        return problems
    if isinstance(exc, ForbiddenExtraKeysError):
        known = [f.name for f in attrs.fields(exc.cl)] if exc.cl and attrs.has(exc.cl) else []
        for extra in sorted(exc.extra_fields):
            key = f"{path}.{extra}" if path else extra
            close = difflib.get_close_matches(extra, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            if key in REMOVED_KEYS:
                hint = f" ({REMOVED_KEYS[key]})"
            problems.append(f"{key}: unknown key{hint}")
        return problems
    if isinstance(exc, KeyError):
        # cattrs notes the missing attribute, so `path` already ends with its name.
        return [f"{path}: required key is missing"]
    message = str(exc) or type(exc).__name__
    if isinstance(exc, TypeError | AttributeError):
        # A value of another kind than the schema's (a string for a table):
        # structure_as() names both kinds before cattrs runs; other callers get this.
        message = "has the wrong type"
    return [f"{path or '<root>'}: {message}"]


def _kind(value: object) -> str:
    """What a TOML reader would call `value`, with its article."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


@attrs.frozen
class Wording:
    """How a shape problem is put: a configuration file speaks TOML ("must be a
    table"), the admin API's bodies JSON ("expected an object")."""

    kind: Callable[[Any], str]  # what a value is, with its article
    table: str = "a table"
    wants: str = "must be"


TOML_WORDING = Wording(_kind)
_ARRAYS = (tuple, list, frozenset, set, Sequence)
_TABLES = (dict, Mapping)


def shape_problems(
    value: Any, tp: Any, path: str = "", wording: Wording = TOML_WORDING
) -> list[str]:
    """Tables and arrays where the schema `tp` has them, checked before cattrs: it would
    iterate a string into an array of characters, or fail on one with a bare TypeError.
    Scalars are left to the converter's strict hooks."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        candidates = [a for a in args if a is not type(None)]
        if value is None or len(candidates) != 1:
            return []
        tp = candidates[0]
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    where, wants = path or "<root>", wording.wants
    if attrs.has(tp) or origin in _TABLES or tp in _TABLES:
        if not isinstance(value, Mapping):
            return [f"{where}: {wants} {wording.table}, got {wording.kind(value)}"]
        problems: list[str] = []
        for key, item in value.items():
            sub_tp = _field_type(tp, key) if attrs.has(tp) else (args[1] if args else None)
            if sub_tp is not None:  # unknown keys are the converter's to name
                sub = f"{path}.{key}" if path else str(key)
                problems.extend(shape_problems(item, sub_tp, sub, wording))
        return problems
    if origin in _ARRAYS or tp in _ARRAYS:
        if not isinstance(value, list | tuple):
            return [f"{where}: {wants} an array, got {wording.kind(value)}"]
        if not args:
            return []
        fixed = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
        if fixed and len(value) != len(args):
            return [f"{where}: {wants} an array of {len(args)} values, got {len(value)}"]
        return [
            p
            for i, item in enumerate(value)
            for p in shape_problems(item, args[i] if fixed else args[0], f"{path}[{i}]", wording)
        ]
    return []


def structure(data: Mapping[str, Any]) -> Config:
    """Build a Config from a merged dict; raises ConfigError naming every bad key."""
    return structure_as(data, Config)


def structure_as(data: Mapping[str, Any], tp: type[_T], wording: Wording = TOML_WORDING) -> _T:
    """An attrs instance of `tp` from parsed TOML (or JSON) by this module's rules
    (strict types, durations and sizes, unknown keys refused); raises ConfigError
    naming every bad key."""
    shape = shape_problems(data, tp, "", wording)
    if shape:
        raise ConfigError(shape)
    return convert(data, tp)


def convert(data: Mapping[str, Any], tp: type[_T]) -> _T:
    """`data` as an attrs instance of `tp` by the converter alone, for data whose shape
    its caller checked in its own words (the admin API's JSON) or wrote itself (the
    store); raises ConfigError naming every bad key."""
    try:
        return converter.structure(dict(data), tp)
    except Exception as exc:  # cattrs raises a tree of errors; flatten it into keys
        raise ConfigError(_structure_problems(exc, "")) from None


# -- semantic checks ----------------------------------------------------------


def _between(
    problems: list[str], key: str, value: float, lo: float, hi: float, *, lo_open: bool = False
) -> None:
    below = value <= lo if lo_open else value < lo
    if below or value > hi:
        left = "(" if lo_open else "["
        problems.append(f"{key}: must be in {left}{lo:g}, {hi:g}], got {value:g}")


def _positive(problems: list[str], key: str, value: float) -> None:
    if value <= 0:
        problems.append(f"{key}: must be greater than 0, got {value:g}")


def check(config: Config) -> list[str]:
    """Every rule a structured configuration must meet, as ``key: problem`` lines."""
    problems: list[str] = []
    if config.workers < 0:
        problems.append(f"workers: must be 0 (one per core) or more, got {config.workers}")
    for key in ("listen", "admin_listen", "agent_listen"):
        try:
            units.parse_address(getattr(config, key))
        except ValueError as exc:
            problems.append(f"{key}: {exc}")

    r = config.router
    for key in ("scrape_interval", "scrape_timeout", "stale_after", "cooldown", "drain_timeout"):
        _positive(problems, f"router.{key}", getattr(r, key))
    if r.scrape_timeout > r.scrape_interval:
        problems.append(
            f"router.scrape_timeout: must not exceed router.scrape_interval "
            f"({units.format_duration(r.scrape_interval)}), "
            f"got {units.format_duration(r.scrape_timeout)}"
        )
    if r.retries < 0:
        problems.append(f"router.retries: must be 0 or more, got {r.retries}")
    if r.max_connections < 0:
        problems.append(
            f"router.max_connections: must be 0 (from the open-file limit) or more,"
            f" got {r.max_connections}"
        )
    if r.failure_threshold < 1:
        problems.append(f"router.failure_threshold: must be at least 1, got {r.failure_threshold}")
    for key in ("max_body_bytes", "max_response_bytes", "max_event_bytes"):
        _positive(problems, f"router.{key}", getattr(r, key))
    for f in attrs.fields(Timeouts):
        _positive(problems, f"router.timeouts.{f.name}", getattr(r.timeouts, f.name))
    s = r.scoring
    _positive(problems, "router.scoring.target_waiting", s.target_waiting)
    _between(problems, "router.scoring.kv_ceiling", s.kv_ceiling, 0, 1, lo_open=True)
    a = r.affinity
    for key in ("session_ttl", "prefix_ttl"):
        _positive(problems, f"router.affinity.{key}", getattr(a, key))
    for key in ("session_table_size", "prefix_block_chars", "prefix_max_blocks"):
        if getattr(a, key) < 1:
            problems.append(f"router.affinity.{key}: must be at least 1, got {getattr(a, key)}")
    if a.prefix_table_size < 0:
        problems.append(
            "router.affinity.prefix_table_size: must be 0 or more (0 turns it off), "
            f"got {a.prefix_table_size}"
        )
    for name, profile in r.profiles.items():
        for f in attrs.fields(RoutingProfile):
            if getattr(profile, f.name) < 0:
                problems.append(
                    f"router.profiles.{name}.{f.name}: weights must be 0 or more, "
                    f"got {getattr(profile, f.name):g}"
                )
    if r.default_profile not in r.profiles:
        problems.append(
            f"router.default_profile: no routing profile named {r.default_profile!r} "
            f"(have {', '.join(sorted(r.profiles))})"
        )

    ad = r.admission
    _positive(problems, "router.admission.queue_ttl", ad.queue_ttl)
    _positive(problems, "router.admission.interval", ad.interval)
    if ad.reserve_window < 0:
        problems.append(
            "router.admission.reserve_window: must be 0 or more, "
            f"got {units.format_duration(ad.reserve_window)}"
        )
    if ad.queue_capacity_per_band < 0:
        problems.append(
            f"router.admission.queue_capacity_per_band: must be 0 or more, "
            f"got {ad.queue_capacity_per_band}"
        )
    if not ad.bands:
        problems.append("router.admission.bands: at least one band is needed")
    seen_bands: set[str] = set()
    for i, band in enumerate(ad.bands):
        key = f"router.admission.bands[{i}]"
        if not band.name:
            problems.append(f"{key}.name: must not be empty")
        elif band.name in seen_bands:
            problems.append(f"{key}.name: band {band.name!r} is defined twice")
        seen_bands.add(band.name)
        _between(problems, f"{key}.saturation_ceiling", band.saturation_ceiling, 0, 1, lo_open=True)
    if ad.bands and ad.default_band not in seen_bands:
        problems.append(
            f"router.admission.default_band: no band named {ad.default_band!r} "
            f"(have {', '.join(b.name for b in ad.bands)})"
        )

    c = config.control
    for key in (
        "interval",
        "base_backoff",
        "max_backoff",
        "unreachable_after",
        "lost_after",
        "start_timeout",
        "lease",
    ):
        _positive(problems, f"control.{key}", getattr(c, key))
    if c.advertise:
        try:
            units.parse_address(c.advertise)
        except ValueError as exc:
            problems.append(f"control.advertise: {exc}")
    if c.base_backoff > c.max_backoff:
        problems.append(
            f"control.base_backoff: must not exceed control.max_backoff "
            f"({units.format_duration(c.max_backoff)}), got {units.format_duration(c.base_backoff)}"
        )
    if c.unreachable_after >= c.lost_after:
        problems.append(
            f"control.unreachable_after: must be shorter than control.lost_after "
            f"({units.format_duration(c.lost_after)}), "
            f"got {units.format_duration(c.unreachable_after)}"
        )
    if c.placement not in PLACEMENT_POLICIES:
        problems.append(
            f"control.placement: must be one of {', '.join(PLACEMENT_POLICIES)},"
            f" got {c.placement!r}"
        )
    lo, hi = c.port_range
    if not (1 <= lo <= hi <= 65535):
        problems.append(
            f"control.port_range: must be [low, high] within 1..65535, got [{lo}, {hi}]"
        )

    ids: set[str] = set()
    for i, ep in enumerate(config.endpoints):
        key = f"endpoints[{i}]"
        if not ep.id:
            problems.append(f"{key}.id: must not be empty")
        elif ep.id in ids:
            problems.append(f"{key}.id: endpoint id {ep.id!r} is used twice")
        ids.add(ep.id)
        if not ep.url.startswith(("http://", "https://")):
            problems.append(f"{key}.url: must start with http:// or https://, got {ep.url!r}")
        if not ep.models:
            problems.append(f"{key}.models: must name at least one model")
        _positive(problems, f"{key}.weight", ep.weight)
        if ep.priority < 0:
            problems.append(f"{key}.priority: must be 0 or more, got {ep.priority}")
        if ep.capacity is not None and ep.capacity < 1:
            problems.append(f"{key}.capacity: must be at least 1, got {ep.capacity}")
        if ep.api_key is not None and not _HEADER_VALUE.fullmatch(ep.api_key):
            problems.append(f"{key}.api_key: must be printable ASCII without spaces")
        if HIDDEN in (ep.api_key, *ep.headers.values()):
            problems.append(
                f"{key}: {HIDDEN!r} is what --print-config writes in place of a secret; "
                "give the secret itself"
            )
        for name, value in ep.headers.items():
            if not _HEADER_NAME.fullmatch(name) or name.lower() in _OWN_HEADERS:
                problems.append(
                    f"{key}.headers: {name!r} is not a header name llmgw may send "
                    f"(a token, not one of {', '.join(sorted(_OWN_HEADERS))})"
                )
            elif not _HEADER_VALUE_SPACES.fullmatch(value):
                problems.append(f"{key}.headers.{name}: must be printable ASCII")
    problems.extend(_tracing_problems(config.tracing))

    problems.extend(catalog.check_models(config.models, set(r.profiles), "models"))
    if config.agent_tls is not None and config.agent_tls.client_ca is None:
        problems.append(
            "agent_tls.client_ca: required: with TLS the agent port requires client "
            "certificates; name the CA that signs the nodes' certificates"
        )
    for name in ("agent_tls", "listen_tls", "admin_tls"):
        tls = getattr(config, name)
        for key in ("cert", "key", "client_ca"):
            path = None if tls is None else getattr(tls, key)
            if path is not None and not Path(path).is_file():
                problems.append(f"{name}.{key}: no such file: {path}")
    for i, host in enumerate(config.admin_hosts):
        if not host or any(c in host for c in "/@[] \t") or host.count(":") == 1:
            problems.append(
                f"admin_hosts[{i}]: a host name or address without a port, got {host!r}"
            )
    _positive(problems, "auth.cache_ttl", config.auth.cache_ttl)
    _positive(problems, "auth.session_ttl", config.auth.session_ttl)
    if config.auth.required and not config.store.url:
        problems.append(
            "auth.required: API keys live in the store; set store.url (e.g. "
            "sqlite:///var/lib/llmgw/llmgw.db) or turn auth.required off"
        )
    if config.store.url and not config.store.url.startswith(
        ("sqlite://", "postgresql://", "postgres://")
    ):
        problems.append(
            "store.url: must start with sqlite:// or postgresql:// (or be empty for no "
            f"store), got {config.store.url!r}"
        )
    return problems


def _tracing_problems(t: TracingConfig) -> list[str]:
    from llmgw.router import tracing  # it knows what tracing needs installed

    problems: list[str] = []
    _between(problems, "tracing.sample_ratio", t.sample_ratio, 0, 1)
    _positive(problems, "tracing.timeout", t.timeout)
    if not t.service_name:
        problems.append("tracing.service_name: must not be empty")
    for name, value in t.headers.items():
        if value == HIDDEN:
            problems.append(
                f"tracing.headers.{name}: {HIDDEN!r} is what --print-config writes in place "
                "of a secret; give the secret itself"
            )
        elif not _HEADER_NAME.fullmatch(name):
            problems.append(f"tracing.headers: {name!r} is not a header name (a token)")
        elif not _HEADER_VALUE_SPACES.fullmatch(value):
            problems.append(f"tracing.headers.{name}: must be printable ASCII")
    if not t.endpoint:
        return problems
    if not t.endpoint.startswith(("http://", "https://")):
        problems.append(
            "tracing.endpoint: must be an OTLP/HTTP URL starting with http:// or https:// "
            f"(e.g. http://collector:4318/v1/traces), or empty for no tracing; got {t.endpoint!r}"
        )
    missing = tracing.missing_packages()
    if missing:
        problems.append(
            f"tracing.endpoint: tracing needs {', '.join(missing)}, not installed: "
            "pip install 'llmgw[tracing]' (or leave tracing.endpoint empty)"
        )
    return problems


# -- entry point --------------------------------------------------------------


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError([f"config file {os.fspath(path)}: not found"]) from None
    except OSError as exc:
        raise ConfigError([f"config file {os.fspath(path)}: {exc.strerror}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"config file {os.fspath(path)}: invalid TOML: {exc}"]) from None


def load(
    path: str | os.PathLike[str] | None = None,
    *,
    data: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults, then the file (or `data`), then `LLMGW_` variables, then `overrides`.

    Raises ConfigError listing every problem with the key that has it.
    """
    merged: Any = _unstructure(Config())
    if path is not None:
        merged = merge(merged, read_toml(path))
    if data is not None:
        merged = merge(merged, dict(data))
    merged = env_overlay(os.environ if environ is None else environ, merged)
    if overrides:
        merged = merge(merged, dict(overrides))
    config = structure(merged)
    problems = check(config)
    if problems:
        raise ConfigError(problems)
    return config
