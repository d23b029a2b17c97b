"""The configuration's schema: its tables as attrs classes, with their defaults, what
each key means (the comments above each field, which the configuration reference in
docs/operations.md is generated from), and the rules about their values.

Each class states the rules about its own fields in its ``problems(key)`` method, and a
rule across tables in the class that holds both; :func:`llmgw.config.rules.check`
asks every one of them. The catalog's values (models, deployment profiles) are the
domain's, and their rules the catalog's (:func:`llmgw.catalog.rules.check_models`, asked by
:class:`Config`).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import attrs

from llmgw import extras, units
from llmgw.catalog import rules as catalog
from llmgw.config.rules import at, between, positive

# The catalog's values are the domain's; the schema holds them.
from llmgw.domain.catalog import ModelConfig
from llmgw.units import HIDDEN, Bytes, Seconds

__all__ = [
    "DEFAULT_STORE_URL",
    "PLACEMENT_POLICIES",
    "AdmissionConfig",
    "AffinityConfig",
    "AuthConfig",
    "Band",
    "Config",
    "ControlConfig",
    "DiscoveryConfig",
    "EndpointConfig",
    "LogConfig",
    "RouterConfig",
    "RoutingProfile",
    "ScoringConfig",
    "StoreConfig",
    "Timeouts",
    "TlsConfig",
    "TracingConfig",
]


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
    # A TLS handshake on the client port or the admin listener, from the accept.
    tls_handshake: Seconds = Seconds(5.0)

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        for f in attrs.fields(Timeouts):
            positive(found, at(key, f.name), getattr(self, f.name))
        return found


@attrs.frozen
class ScoringConfig:
    """When a replica counts as full by its engine's account (llmgw.router.scheduling)."""

    # Requests queued at the engine (per unit of weight).
    target_waiting: float = 4.0
    # The share of its KV cache in use at which a replica counts as full.
    kv_ceiling: float = 0.9

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        positive(found, at(key, "target_waiting"), self.target_waiting)
        between(found, at(key, "kv_ceiling"), self.kv_ceiling, 0, 1, lo_open=True)
        return found


ROUTING_RULES = ("work", "cache_aware", "none")


@attrs.frozen
class RoutingProfile:
    """Weights of the scorers that rank replicas for a model with this profile, and the
    rule its affinity follows (llmgw.router.scheduling.plugins)."""

    # "work": llmgw's (a prompt stays where its prefill work is least); "cache_aware":
    # the rule of vllm-router's and sglang-router's cache_aware policies, for
    # comparison; "none": no built-in filter (`filters` names them all).
    rule: str = "work"
    queue: float = 1.0
    inflight: float = 1.0
    kv: float = 0.5
    prefix: float = 0.5
    staleness: float = 1.0
    # Prompt tokens still to prefill there (the router's count): a new request waits
    # for them.
    prefill: float = 1.0
    # Plugins by name (llmgw.router.scheduling.registry; docs/scheduling.md): filters
    # run in order after the rule's (rule "none": only these), scorers beside the
    # built-in terms above with their weights, and the picker.
    filters: tuple[str, ...] = ()
    scorers: dict[str, float] = attrs.field(factory=dict)
    picker: str = "lowest-cost"

    def problems(self, key: str) -> list[str]:
        weights = {
            f: getattr(self, f)
            for f in ("queue", "inflight", "kv", "prefix", "staleness", "prefill")
        }
        weights |= {f"scorers.{n}": w for n, w in self.scorers.items()}
        found = [
            f"{at(key, name)}: weights must be 0 or more, got {w:g}"
            for name, w in weights.items()
            if w < 0
        ]
        if self.rule not in ROUTING_RULES:
            found.append(f"{at(key, 'rule')}: one of {', '.join(ROUTING_RULES)}, got {self.rule!r}")
        return found


def _default_profiles() -> dict[str, RoutingProfile]:
    return {
        # Latency first: queues and in-flight work dominate.
        "chat": RoutingProfile(queue=1.0, inflight=1.0, kv=0.5, prefix=0.5, staleness=1.0),
        # Throughput first: fill caches and reuse prefixes, tolerate some queueing.
        "batch": RoutingProfile(
            queue=0.5, inflight=0.5, kv=1.0, prefix=1.0, staleness=1.0, prefill=0.5
        ),
        # The peers' rule, to measure the default against (benchmarks/routing_quality.py).
        "cache_aware": RoutingProfile(rule="cache_aware"),
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
    # An endpoint with `kv_events` whose engine sent no KV-cache event for this long
    # after a request that had it store blocks is routed on the estimated table
    # until its events come back (llmgw_kv_events_up; docs/scheduling.md).
    kv_events_timeout: Seconds = Seconds(10.0)
    # Blocks remembered per endpoint from its KV-cache events (the oldest go first).
    kv_events_max_blocks: int = 200_000

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        for name in ("session_ttl", "prefix_ttl", "kv_events_timeout"):
            positive(found, at(key, name), getattr(self, name))
        for name in (
            "session_table_size",
            "prefix_block_chars",
            "prefix_max_blocks",
            "kv_events_max_blocks",
        ):
            if getattr(self, name) < 1:
                found.append(f"{at(key, name)}: must be at least 1, got {getattr(self, name)}")
        if self.prefix_table_size < 0:
            found.append(
                f"{at(key, 'prefix_table_size')}: must be 0 or more (0 turns it off), "
                f"got {self.prefix_table_size}"
            )
        return found


@attrs.frozen
class Band:
    """An admission band: requests of higher priority are admitted first, and a band
    is held back once its pool's saturation reaches its ceiling."""

    name: str
    # Higher is admitted first.
    priority: int
    # In (0, 1]: the pool saturation past which this band's requests queue.
    saturation_ceiling: float

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        if not self.name:
            found.append(f"{at(key, 'name')}: must not be empty")
        ceiling = self.saturation_ceiling
        between(found, at(key, "saturation_ceiling"), ceiling, 0, 1, lo_open=True)
        return found


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

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        positive(found, at(key, "queue_ttl"), self.queue_ttl)
        positive(found, at(key, "interval"), self.interval)
        if self.reserve_window < 0:
            found.append(
                f"{at(key, 'reserve_window')}: must be 0 or more, "
                f"got {units.format_duration(self.reserve_window)}"
            )
        if self.queue_capacity_per_band < 0:
            found.append(
                f"{at(key, 'queue_capacity_per_band')}: must be 0 or more, "
                f"got {self.queue_capacity_per_band}"
            )
        if not self.bands:
            found.append(f"{at(key, 'bands')}: at least one band is needed")
        names: set[str] = set()
        for i, band in enumerate(self.bands):
            if band.name and band.name in names:  # an empty one is the band's to name
                found.append(f"{key}.bands[{i}].name: band {band.name!r} is defined twice")
            names.add(band.name)
        if self.bands and self.default_band not in names:
            found.append(
                f"{at(key, 'default_band')}: no band named {self.default_band!r} "
                f"(have {', '.join(b.name for b in self.bands)})"
            )
        return found


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
    # Client connections the client listener serves at once (past it: 503 and close,
    # or with TLS just the close); 0: derived from the open-file limit at start, which
    # also sizes the admin listener's share (llmgw.http.budget).
    max_connections: int = 0
    # What the router takes from an engine: a non-streaming answer (an embeddings batch
    # is the large case) and one SSE event of a stream, at most. Beyond, the attempt
    # fails as a bad response (502 when no other replica answers).
    max_response_bytes: Bytes = Bytes(64 * 1024 * 1024)
    max_event_bytes: Bytes = Bytes(1024 * 1024)
    # Non-streaming answers are held whole before the client gets them: what all of
    # them together may hold at once (at least max_response_bytes). Past it a request
    # is answered 503 with Retry-After, not with the process's memory.
    max_buffered_bytes: Bytes = Bytes(128 * 1024 * 1024)
    # On SIGTERM, how long requests in flight get to finish before the server stops.
    drain_timeout: Seconds = Seconds(30.0)
    timeouts: Timeouts = Timeouts()
    scoring: ScoringConfig = ScoringConfig()
    affinity: AffinityConfig = AffinityConfig()
    admission: AdmissionConfig = AdmissionConfig()
    # Routing profiles by name, for models to pick (`routing_profile`).
    profiles: dict[str, RoutingProfile] = attrs.field(factory=_default_profiles)

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        for name in ("scrape_interval", "scrape_timeout", "stale_after", "cooldown"):
            positive(found, at(key, name), getattr(self, name))
        positive(found, at(key, "drain_timeout"), self.drain_timeout)
        if self.scrape_timeout > self.scrape_interval:
            found.append(
                f"{at(key, 'scrape_timeout')}: must not exceed {at(key, 'scrape_interval')} "
                f"({units.format_duration(self.scrape_interval)}), "
                f"got {units.format_duration(self.scrape_timeout)}"
            )
        if self.retries < 0:
            found.append(f"{at(key, 'retries')}: must be 0 or more, got {self.retries}")
        if self.max_connections < 0:
            found.append(
                f"{at(key, 'max_connections')}: must be 0 (from the open-file limit) or more,"
                f" got {self.max_connections}"
            )
        if self.failure_threshold < 1:
            found.append(
                f"{at(key, 'failure_threshold')}: must be at least 1, got {self.failure_threshold}"
            )
        for name in ("max_body_bytes", "max_response_bytes", "max_event_bytes"):
            positive(found, at(key, name), getattr(self, name))
        if self.max_buffered_bytes < self.max_response_bytes:
            found.append(
                f"{at(key, 'max_buffered_bytes')}: must be at least "
                f"{at(key, 'max_response_bytes')} ({units.format_size(self.max_response_bytes)}),"
                " or an answer that size could never be held, got "
                f"{units.format_size(self.max_buffered_bytes)}"
            )
        if self.default_profile not in self.profiles:
            found.append(
                f"{at(key, 'default_profile')}: no routing profile named "
                f"{self.default_profile!r} (have {', '.join(sorted(self.profiles))})"
            )
        return found


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

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        for name in (
            "interval",
            "base_backoff",
            "max_backoff",
            "unreachable_after",
            "lost_after",
            "start_timeout",
            "lease",
        ):
            positive(found, at(key, name), getattr(self, name))
        if self.advertise:
            try:
                units.parse_address(self.advertise)
            except ValueError as exc:
                found.append(f"{at(key, 'advertise')}: {exc}")
        if self.base_backoff > self.max_backoff:
            found.append(
                f"{at(key, 'base_backoff')}: must not exceed {at(key, 'max_backoff')} "
                f"({units.format_duration(self.max_backoff)}), "
                f"got {units.format_duration(self.base_backoff)}"
            )
        if self.unreachable_after >= self.lost_after:
            found.append(
                f"{at(key, 'unreachable_after')}: must be shorter than {at(key, 'lost_after')} "
                f"({units.format_duration(self.lost_after)}), "
                f"got {units.format_duration(self.unreachable_after)}"
            )
        if self.placement not in PLACEMENT_POLICIES:
            found.append(
                f"{at(key, 'placement')}: must be one of {', '.join(PLACEMENT_POLICIES)},"
                f" got {self.placement!r}"
            )
        lo, hi = self.port_range
        if not (1 <= lo <= hi <= 65535):
            found.append(
                f"{at(key, 'port_range')}: must be [low, high] within 1..65535, got [{lo}, {hi}]"
            )
        return found


# What may be sent in an engine request's head: RFC 9110 tokens and visible ASCII (so
# a configured value can never add a header line of its own).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\x21-\x7e]+")
_HEADER_VALUE_SPACES = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")
# Headers llmgw writes itself on each engine request.
_OWN_HEADERS = frozenset(
    {"authorization", "content-type", "content-length", "host", "x-request-id", "traceparent"}
)


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
    # Where the engine publishes its KV-cache events (vLLM's --kv-events-config ZMQ
    # endpoint, e.g. "tcp://10.0.0.5:5557"): the router subscribes and routes on the
    # engine's own prefix-cache index (docs/scheduling.md).
    kv_events: str | None = None
    # Its replay socket (vLLM's kv-events-config `replay_endpoint`): asked for what the
    # router missed (a gap in the sequence numbers, or what came before it connected).
    kv_events_replay: str | None = None

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        for name in ("kv_events", "kv_events_replay"):
            address = getattr(self, name)
            if address is not None and not (
                address.startswith(("tcp://", "ipc://")) and "*" not in address
            ):
                found.append(
                    f"{at(key, name)}: must be a tcp:// or ipc:// address to connect to, "
                    f"got {address!r}"
                )
        if self.kv_events_replay is not None and self.kv_events is None:
            found.append(f"{at(key, 'kv_events_replay')}: needs kv_events")
        if not self.id:
            found.append(f"{at(key, 'id')}: must not be empty")
        if not self.url.startswith(("http://", "https://")):
            found.append(f"{at(key, 'url')}: must start with http:// or https://, got {self.url!r}")
        if not self.models:
            found.append(f"{at(key, 'models')}: must name at least one model")
        positive(found, at(key, "weight"), self.weight)
        if self.priority < 0:
            found.append(f"{at(key, 'priority')}: must be 0 or more, got {self.priority}")
        if self.capacity is not None and self.capacity < 1:
            found.append(f"{at(key, 'capacity')}: must be at least 1, got {self.capacity}")
        if self.api_key is not None and not _HEADER_VALUE.fullmatch(self.api_key):
            found.append(f"{at(key, 'api_key')}: must be printable ASCII without spaces")
        if HIDDEN in (self.api_key, *self.headers.values()):
            found.append(
                f"{key or 'endpoint'}: {HIDDEN!r} is what --print-config writes in place of "
                "a secret; give the secret itself"
            )
        for name, value in self.headers.items():
            if not _HEADER_NAME.fullmatch(name) or name.lower() in _OWN_HEADERS:
                found.append(
                    f"{at(key, 'headers')}: {name!r} is not a header name llmgw may send "
                    f"(a token, not one of {', '.join(sorted(_OWN_HEADERS))})"
                )
            elif not _HEADER_VALUE_SPACES.fullmatch(value):
                found.append(f"{at(key, 'headers')}.{name}: must be printable ASCII")
        return found


@attrs.frozen
class DiscoveryConfig:
    """Endpoints from a file another program writes (docs/router.md, "Where endpoints
    come from"), beside [[endpoints]] and those added through the admin API."""

    # A TOML file of [[endpoints]] tables, as this file writes them (JSON when its name
    # ends in .json: {"endpoints": [...]}); read again whenever it changes. "": none.
    file: str = ""
    # How often the file is looked at (its size, time and content).
    interval: Seconds = Seconds(2.0)
    # Start in router-only mode with no endpoint yet: they come later through the admin
    # API (POST /api/v1/endpoints, llmgw-ctl endpoints add) or the file. Without it a
    # server with nothing to serve refuses to start.
    start_empty: bool = False

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        positive(found, at(key, "interval"), self.interval)
        if self.file and Path(self.file).is_dir():
            found.append(f"{at(key, 'file')}: is a directory, not a file: {self.file}")
        return found


@attrs.frozen
class TlsConfig:
    """A listener's TLS files (PEM); SIGHUP rereads those of listen_tls and admin_tls."""

    # The certificate chain.
    cert: str
    # Its private key.
    key: str
    # Clients must present a certificate signed by this CA (required for agent_tls).
    client_ca: str | None = None

    def problems(self, key: str) -> list[str]:
        return [
            f"{at(key, name)}: no such file: {path}"
            for name in ("cert", "key", "client_ca")
            if (path := getattr(self, name)) is not None and not Path(path).is_file()
        ]


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

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        positive(found, at(key, "cache_ttl"), self.cache_ttl)
        positive(found, at(key, "session_ttl"), self.session_ttl)
        return found


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

    def problems(self, key: str) -> list[str]:
        found: list[str] = []
        between(found, at(key, "sample_ratio"), self.sample_ratio, 0, 1)
        positive(found, at(key, "timeout"), self.timeout)
        if not self.service_name:
            found.append(f"{at(key, 'service_name')}: must not be empty")
        headers = at(key, "headers")
        for name, value in self.headers.items():
            if value == HIDDEN:
                found.append(
                    f"{headers}.{name}: {HIDDEN!r} is what --print-config writes in place "
                    "of a secret; give the secret itself"
                )
            elif not _HEADER_NAME.fullmatch(name):
                found.append(f"{headers}: {name!r} is not a header name (a token)")
            elif not _HEADER_VALUE_SPACES.fullmatch(value):
                found.append(f"{headers}.{name}: must be printable ASCII")
        if not self.endpoint:
            return found
        if not self.endpoint.startswith(("http://", "https://")):
            found.append(
                f"{at(key, 'endpoint')}: must be an OTLP/HTTP URL starting with http:// or "
                "https:// (e.g. http://collector:4318/v1/traces), or empty for no tracing; "
                f"got {self.endpoint!r}"
            )
        missing = extras.needs("tracing", "tracing")
        if missing is not None:
            found.append(f"{at(key, 'endpoint')}: {missing} (or leave tracing.endpoint empty)")
        return found


DEFAULT_STORE_URL = "sqlite://llmgw.db"  # relative: the working directory (store/sqlite.py)


@attrs.frozen
class StoreConfig:
    # The embedded default: SQLite in the working directory. "" for no store: the
    # endpoints that would persist something (keys, runtime models) then refuse.
    url: str = DEFAULT_STORE_URL

    def problems(self, key: str) -> list[str]:
        if self.url and not self.url.startswith(("sqlite://", "postgresql://", "postgres://")):
            return [
                f"{at(key, 'url')}: must start with sqlite:// or postgresql:// (or be empty "
                f"for no store), got {self.url!r}"
            ]
        if self.url.startswith(("postgresql://", "postgres://")):
            missing = extras.needs("a PostgreSQL store", "postgres")
            if missing is not None:
                return [f"{at(key, 'url')}: {missing}"]
        return []


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
    # Where agents connect (gRPC), with the control plane only. Loopback by default: off
    # loopback it needs agent_tls, or allow_insecure_agents.
    agent_listen: str = "127.0.0.1:7443"
    router: RouterConfig = RouterConfig()
    control: ControlConfig = ControlConfig()
    store: StoreConfig = StoreConfig()
    auth: AuthConfig = AuthConfig()
    tracing: TracingConfig = TracingConfig()
    log: LogConfig = LogConfig()
    agent_tls: TlsConfig | None = None
    # Accept plaintext agents on an agent_listen off loopback (no agent_tls): any host
    # that reaches the port can then register as a node, and have engines placed on it
    # and client prompts sent to it. Only on a network where every host is trusted
    # (docs/transport.md, "Trusting agents"); the server warns at start.
    allow_insecure_agents: bool = False
    # HTTPS on the client port and the admin listener (served by hypercorn, HTTP/2 by
    # ALPN); with `client_ca` a client certificate signed by it is required.
    listen_tls: TlsConfig | None = None
    admin_tls: TlsConfig | None = None
    # More Host names the admin listener answers to; others get 421. Always counted: the
    # loopback names and its configured and bound addresses; off loopback also the
    # machine's host name and FQDN, and on a wildcard bind its interfaces' addresses.
    admin_hosts: tuple[str, ...] = ()
    endpoints: tuple[EndpointConfig, ...] = ()
    discovery: DiscoveryConfig = DiscoveryConfig()
    models: tuple[ModelConfig, ...] = ()

    @property
    def insecure_agents(self) -> bool:
        """Whether agent_listen takes plaintext agents from other hosts: off loopback
        (a host name other than localhost counts as off) without agent_tls."""
        if self.agent_tls is not None:
            return False
        try:
            host = units.parse_address(self.agent_listen).host.strip("[]")
        except ValueError:
            return False  # reported as a problem of its own
        if host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(host).is_loopback
        except ValueError:
            return True  # every interface (""), or a name that may resolve to any

    def insecure_agents_warning(self) -> str | None:
        """What the server logs at start when it takes plaintext agents off loopback."""
        if not self.insecure_agents:
            return None
        return (
            f"agent_listen {self.agent_listen} takes PLAINTEXT agents from other hosts "
            "(allow_insecure_agents): any host that reaches it can register as a node and "
            "have client prompts sent to it; set agent_tls on a network not wholly trusted"
        )

    @property
    def control_plane(self) -> bool:
        """Whether any model asks to be deployed (DESIGN §1: that turns the control plane on)."""
        return any(m.profiles for m in self.models)

    def problems(self, key: str) -> list[str]:
        """The top level's own keys, and the rules across tables."""
        found: list[str] = []
        if self.workers < 0:
            found.append(
                f"{at(key, 'workers')}: must be 0 (one per core) or more, got {self.workers}"
            )
        for name in ("listen", "admin_listen", "agent_listen"):
            try:
                units.parse_address(getattr(self, name))
            except ValueError as exc:
                found.append(f"{at(key, name)}: {exc}")
        ids: set[str] = set()
        for i, ep in enumerate(self.endpoints):
            if ep.id and ep.id in ids:  # an empty one is the endpoint's to name
                found.append(f"{at(key, 'endpoints')}[{i}].id: endpoint id {ep.id!r} is used twice")
            ids.add(ep.id)
        found.extend(
            catalog.check_models(self.models, set(self.router.profiles), at(key, "models"))
        )
        # Whatever the models: runtime ones (the store's) can turn the control plane on.
        if self.insecure_agents and not self.allow_insecure_agents:
            found.append(
                f"{at(key, 'agent_listen')}: {self.agent_listen} is off loopback and agent_tls "
                "is not set: any host that reaches it could register as a node and have client "
                "prompts sent to it. Set agent_tls (client certificates), listen on loopback "
                "(127.0.0.1:7443), or on a network where every host is trusted set "
                "allow_insecure_agents = true"
            )
        if self.agent_tls is not None and self.agent_tls.client_ca is None:
            found.append(
                f"{at(key, 'agent_tls.client_ca')}: required: with TLS the agent port requires "
                "client certificates; name the CA that signs the nodes' certificates"
            )
        for i, host in enumerate(self.admin_hosts):
            if not host or any(c in host for c in "/@[] \t") or host.count(":") == 1:
                found.append(
                    f"{at(key, 'admin_hosts')}[{i}]: a host name or address without a port, "
                    f"got {host!r}"
                )
        if self.auth.required and not self.store.url:
            found.append(
                f"{at(key, 'auth.required')}: API keys live in the store; set store.url (e.g. "
                "sqlite:///var/lib/llmgw/llmgw.db) or turn auth.required off"
            )
        return found
