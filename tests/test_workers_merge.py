"""The control process's merge of its workers' metrics and admission views, and the
frames between them (llmgw.workers.merge, .wire): pure, in one process."""

from __future__ import annotations

import logging

import msgspec
import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmgw import config as cfg
from llmgw.domain.usage import Usage, UsageRecord
from llmgw.router.core import endpoint_from_config
from llmgw.router.endpoints import Endpoint
from llmgw.workers import merge, wire
from llmgw.workers.worker import Worker


def registry_with(requests: float, breaker: float, cpu: float) -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("llmgw_requests", "requests", ["model"], registry=r).labels("m").inc(requests)
    Gauge("llmgw_breaker_state", "breaker", ["endpoint", "state"], registry=r).labels(
        "e", "open"
    ).set(breaker)
    Gauge("process_cpu_seconds", "cpu", registry=r).set(cpu)
    return r


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
    }


def merged_samples(
    control: CollectorRegistry, workers: list[list[wire.Family]]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    merged = list(merge.metrics(control.collect(), workers))

    class View:
        def collect(self) -> list[object]:
            return merged

    return samples(generate_latest(View()))  # type: ignore[arg-type]


def test_counters_add_up_levels_take_the_highest_and_the_process_is_the_controls() -> None:
    control = registry_with(0, 0, cpu=7)
    workers = [
        merge.families(registry_with(3, 1, cpu=100).collect()),
        merge.families(registry_with(4, 0, cpu=200).collect()),
    ]
    out = merged_samples(control, workers)
    assert out[("llmgw_requests_total", (("model", "m"),))] == 7  # 0 + 3 + 4
    assert out[("llmgw_breaker_state", (("endpoint", "e"), ("state", "open")))] == 1  # max
    assert out[("process_cpu_seconds", ())] == 7  # the control process's own, alone


async def test_every_gauge_a_worker_sends_says_how_it_merges() -> None:
    # A worker's router as llmgw.workers.worker builds it, with every optional family
    # on: a static endpoint with KV-cache events, per-key metrics, and an admission
    # pool (its families appear with the pool's first request).
    conf = cfg.load(
        data={
            "endpoints": [
                {
                    "id": "e",
                    "url": "http://127.0.0.1:9",
                    "models": ["m"],
                    "kv_events": "tcp://127.0.0.1:9",
                }
            ],
            "auth": {"key_metrics": True},
        },
        environ={},
    )
    hello = wire.Hello(
        worker=0,
        config=cfg.converter.unstructure(conf),
        models=[],
        # The control process's set (a worker keeps only what its hello lists).
        endpoints=[endpoint_from_config(e) for e in conf.endpoints],
        draining=[],
        client=[],
        dashboard=None,
        log_level="info",
        log_format="text",
    )
    left, _ = trio.testing.memory_stream_pair()
    router = Worker(wire.Channel(left, wire.ToWorker), hello, None).router
    admission = router.admission
    (await admission.admit("m", admission.select_band(None), "t", 1)).release()
    sent = merge.families(router.metrics.registry.collect())  # what the worker sends
    gauges = {f.name for f in sent if f.type == "gauge"}
    assert {"llmgw_kv_events_up", "llmgw_admission_queue_depth"} <= gauges  # all on
    undeclared = sorted(gauges - merge.LEVELS - merge.SUMS)
    assert undeclared == [], "add each to merge.LEVELS (highest wins) or merge.SUMS (added)"
    assert not merge.LEVELS & merge.SUMS


def test_an_undeclared_gauge_merges_as_a_level_with_one_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(merge, "_warned", set())

    def worker(value: float) -> list[wire.Family]:
        r = CollectorRegistry()
        Gauge("llmgw_new_thing", "undeclared", registry=r).set(value)
        Gauge("llmgw_requests_in_flight", "a sum", ["model"], registry=r).labels("m").set(value)
        return merge.families(r.collect())

    with caplog.at_level(logging.WARNING, logger="llmgw.workers"):
        for _ in range(2):
            out = merged_samples(CollectorRegistry(), [worker(3), worker(5)])
            assert out[("llmgw_new_thing", ())] == 5  # the highest, not 8
            assert out[("llmgw_requests_in_flight", (("model", "m"),))] == 8  # declared: added
    warned = [r.getMessage() for r in caplog.records if "llmgw_new_thing" in r.getMessage()]
    assert len(warned) == 1 and "neither merge.LEVELS nor merge.SUMS" in warned[0]
    assert not any("llmgw_requests_in_flight" in r.getMessage() for r in caplog.records)


def band(name: str, **numbers: object) -> dict[str, object]:
    base: dict[str, object] = dict.fromkeys(merge._COUNTS, 0)
    base.update(band=name, priority=1, saturation_ceiling=0.5)
    base.update(numbers)
    return base


def snapshot(
    saturation: float, depth: int, oldest: float | None, open_: bool, state: str = "ready"
) -> dict[str, object]:
    return {
        "enabled": True,
        "default_band": "gold",
        "queue_ttl_seconds": 30.0,
        "queue_capacity_per_band": 100,
        "bands": [],
        "pools": [
            {
                "pool": "m",
                "saturation": saturation,
                "waiting": depth,
                "admitting": ["gold"] if open_ else [],
                "bands": [band("gold", depth=depth, open=open_, oldest_wait_seconds=oldest)],
                "state": state,
            }
        ],
    }


def test_admission_views_add_queues_and_keep_the_fullest_saturation() -> None:
    a = snapshot(0.4, 2, 1.5, open_=False)
    b = snapshot(0.9, 3, None, open_=True)
    out = merge.admission([a, b])
    assert out is not None
    (pool,) = out["pools"]
    assert pool["saturation"] == 0.9 and pool["waiting"] == 5
    (gold,) = pool["bands"]
    assert gold["depth"] == 5 and gold["open"] is True and gold["oldest_wait_seconds"] == 1.5
    assert gold["priority"] == 1 and gold["saturation_ceiling"] == 0.5  # not added up
    assert pool["admitting"] == ["gold"]
    assert merge.admission([]) is None
    # A model one worker has requests waiting for is waking, whatever the others see.
    at_zero = snapshot(1.0, 0, None, open_=False, state="scaled_to_zero")
    waking = snapshot(1.0, 1, 0.5, open_=False, state="waking")
    for order in ([at_zero, waking], [waking, at_zero]):
        merged = merge.admission(order)
        assert merged is not None and merged["pools"][0]["state"] == "waking"


async def test_frames_carry_each_message_and_refuse_an_oversized_one() -> None:
    left, right = trio.testing.memory_stream_pair()
    to_worker = wire.Channel(left, wire.FromWorker)
    at_worker = wire.Channel(right, wire.ToWorker)
    endpoint = Endpoint("e", "http://127.0.0.1:1", ("m",), headers=((b"authorization", b"x"),))
    await to_worker.send(wire.Upsert(endpoint))
    got = await at_worker.receive()
    assert got == wire.Upsert(endpoint) and got.endpoint.headers == endpoint.headers
    record = UsageRecord("m", "e", 200, Usage(1, 2), 0.1, key_id="k")
    # What the dashboard's ring counts of the router's model of the engines crosses
    # too: the workers' records are how their predictions and spills merge (issue #31).
    weighed = UsageRecord(
        "m",
        "e",
        200,
        Usage(1, 2, cached_tokens=0),
        0.1,
        prediction="over",
        spills=(("prefix", "throttled"), ("session", "gone")),
    )
    await at_worker.send(wire.Usage([record, weighed]))
    got = await to_worker.receive()
    assert got == wire.Usage([record, weighed])
    assert got.records[1].spills == (("prefix", "throttled"), ("session", "gone"))
    assert got.records[0].spills is None and got.records[0].prediction is None
    # A frame claiming more than MAX_FRAME is refused before it is read.
    await right.send_all((wire.MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(wire.WireError, match="over the limit"):
        await to_worker.receive()
    # Bytes that decode as no message of the protocol: refused.
    junk = msgspec.msgpack.encode({"type": "Nonsense"})
    await left.send_all(len(junk).to_bytes(4, "big") + junk)
    with pytest.raises(wire.WireError, match="undecodable"):
        await at_worker.receive()
