"""The Responses API through a real llmgw-server in front of two llmgw-sim replicas,
with the official openai SDK (issue #19). Each replica keeps the responses it made in
its own process, as vLLM does: follow-ups (``previous_response_id``), retrieval and
deletion work only because llmgw sends them to the replica that made the response."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from tests.procs import Server, server, sim
from tests.test_api_paths import CONFIG
from tests.test_keys_e2e import CONFIG as KEYED_CONFIG
from tests.test_keys_e2e import create_keys
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def gateway() -> Iterator[Server]:
    with ExitStack() as stack:
        bases = [stack.enter_context(sim(model="m"))[1] for _ in range(2)]
        flags = [a for i, b in enumerate(bases) for a in ("--endpoint", f"s{i}={b}=m")]
        srv = stack.enter_context(server(*flags, config=CONFIG))
        srv.wait_scraped()
        yield srv


def client(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key="none", max_retries=0, timeout=30)


def test_follow_ups_go_to_the_replica_that_stored_the_response(gateway: Server) -> None:
    api = client(gateway)
    first = api.responses.with_raw_response.create(
        model="m", input="Hello there", max_output_tokens=4
    )
    home = first.headers["x-llmgw-endpoint"]
    made = first.parse()
    assert made.id.startswith("resp_") and made.output_text and made.usage is not None
    assert made.usage.output_tokens == 4
    previous = made.id
    # Round robin alone would send about half of these to the other replica, whose
    # engine does not have the response and would refuse it.
    for _ in range(6):
        reply = api.responses.with_raw_response.create(
            model="m", input="And then?", previous_response_id=previous, max_output_tokens=2
        )
        assert reply.headers["x-llmgw-endpoint"] == home
        previous = reply.parse().id
    wait_for(
        lambda: (
            gateway.metric("llmgw_completion_tokens_total", model="m", endpoint=home) >= 4 + 6 * 2
        ),
        "the follow-ups' tokens counted at their replica",
    )


def test_a_streamed_response_is_relayed_and_its_id_remembered(gateway: Server) -> None:
    api = client(gateway)
    kinds: list[str] = []
    final = None
    with api.responses.stream(model="m", input="Stream it", max_output_tokens=3) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 3
    assert final.usage is not None and final.usage.output_tokens == 3
    follow = api.responses.create(model="m", input="more", previous_response_id=final.id)
    assert follow.previous_response_id == final.id


def test_retrieve_and_delete_reach_the_same_replica(gateway: Server) -> None:
    api = client(gateway)
    made = api.responses.create(model="m", input="keep me", max_output_tokens=2)
    for _ in range(4):  # whichever replica round robin would pick next
        assert api.responses.retrieve(made.id).output_text == made.output_text
    api.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(made.id)


def test_an_unknown_previous_response_is_a_clear_404(gateway: Server) -> None:
    api = client(gateway)
    with pytest.raises(openai.NotFoundError) as unknown:
        api.responses.create(model="m", input="x", previous_response_id="resp_nowhere")
    assert unknown.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve("resp_nowhere")


def test_a_stored_response_is_its_keys_alone(tmp_path: Path) -> None:
    """Another key gets the 404 of an unknown id (it learns nothing of the response,
    not even that it exists) on retrieve, input_items, delete and chaining; the key
    that made it still has it, and what the other key tried did not delete it."""
    db = tmp_path / "llmgw.db"
    keys = create_keys(db, alice={}, mallory={})
    with (
        sim(model="m") as (_, base),
        server("--endpoint", f"s0={base}=m", config=KEYED_CONFIG.format(path=db)) as srv,
    ):
        srv.wait_scraped()

        def api(name: str) -> openai.OpenAI:
            return openai.OpenAI(
                base_url=f"{srv.base}/v1", api_key=keys[name][1], max_retries=0, timeout=30
            )

        alice, mallory = api("alice"), api("mallory")
        made = alice.responses.create(model="m", input="my secret plan", max_output_tokens=2)
        with pytest.raises(openai.NotFoundError) as got:
            mallory.responses.retrieve(made.id)
        assert got.value.code == "response_not_found", got.value
        with pytest.raises(openai.NotFoundError) as items:
            mallory.responses.input_items.list(made.id)
        assert items.value.code == "response_not_found", items.value
        with pytest.raises(openai.NotFoundError) as chained:
            mallory.responses.create(model="m", input="go on", previous_response_id=made.id)
        assert chained.value.code == "previous_response_not_found", chained.value
        with pytest.raises(openai.NotFoundError) as deleted:
            mallory.responses.delete(made.id)
        assert deleted.value.code == "response_not_found", deleted.value
        # The same answer as for an id nobody made: nothing tells the two apart.
        unknown = httpx.get(
            f"{srv.base}/v1/responses/resp_nowhere",
            headers={"authorization": f"Bearer {keys['mallory'][1]}"},
            timeout=30,
        )
        foreign = httpx.get(
            f"{srv.base}/v1/responses/{made.id}",
            headers={"authorization": f"Bearer {keys['mallory'][1]}"},
            timeout=30,
        )
        assert foreign.status_code == unknown.status_code == 404
        assert foreign.json() == {
            **unknown.json(),
            "error": {
                **unknown.json()["error"],
                "message": unknown.json()["error"]["message"].replace("resp_nowhere", made.id),
            },
        }
        # Alice's response is untouched: hers to read, chain and delete.
        assert alice.responses.retrieve(made.id).output_text == made.output_text
        follow = alice.responses.create(
            model="m", input="go on", previous_response_id=made.id, max_output_tokens=2
        )
        assert follow.previous_response_id == made.id
        alice.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            alice.responses.retrieve(made.id)
