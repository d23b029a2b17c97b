"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a
real llmgw-server with two llmgw-agent processes (pretended GPUs, simulator engines)
and a SQLite store.

One fleet serves the whole module: model ``m`` fits (one replica), model ``huge``
cannot (it wants 8 GPUs on one node; nodes have 2). Node n1 has a fabric and a label,
n2 only a label. The admin listener is on loopback, so its dashboard needs no login;
the client port's ``/admin`` does.
Screenshots go to the pytest session's temporary directory (their paths are printed),
not the repo.
"""

from __future__ import annotations

import re
import shlex
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from llmgw_cli.ctl import build_parser
from tests.procs import FleetServer, agent, fleet_server, wait_for
from tests.test_fleet_e2e import control_config, model

CHROMIUM = "/usr/bin/chromium"
# As the machine notes say: without these, Chromium tries the (closed) network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

HUGE = """
[[models]]
name = "huge"
replicas = 1

[[models.profiles]]
name = "tp8"
engine = "sim"
weights = "sim"
tensor_parallel = 8
"""


class Fleet:
    def __init__(self, srv: FleetServer, admin_key: str, store: Path) -> None:
        self.srv = srv
        self.admin_key = admin_key
        self.store = store

    @property
    def dash(self) -> str:
        """The dashboard on the (loopback) admin listener."""
        return self.srv.admin

    def node(self, node_id: str) -> dict[str, Any]:
        return self.srv.nodes()[node_id]


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard-shots")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    store = tmp_path_factory.mktemp("dash-store") / "llmgw.db"
    config = control_config(
        [model("m", replicas=1), HUGE],
        extra=f'[store]\nurl = "sqlite:///{store}"\n',
    )
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config))
        stack.enter_context(
            agent(
                srv.agent_address,
                "n1",
                "--label",
                "zone=eu-1",
                address="127.0.0.21",
                gpus="2x80GB",
                fabric="ib-a",
            )
        )
        stack.enter_context(
            agent(
                srv.agent_address,
                "n2",
                "--label",
                "rack=r7",
                address="127.0.0.22",
                gpus="2x80GB",
            )
        )
        srv.wait(lambda: srv.ready_replicas("m", 1), "a ready replica of m")
        r = httpx.post(f"{srv.admin}/api/v1/keys", json={"name": "ops", "admin": True}, timeout=5)
        assert r.status_code == 201, r.text
        yield Fleet(srv, r.json()["secret"], store)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser, shots: Path, request: pytest.FixtureRequest) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.on("dialog", lambda dialog: dialog.accept())  # the drain/revoke confirmations
    yield pg
    shot = shots / f"{request.node.name}.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    context.close()


def test_fleet_page_lists_nodes_and_their_gpus(fleet: Fleet, page: Page) -> None:
    page.goto(f"{fleet.dash}/fleet")
    expect(page).to_have_title(re.compile("Fleet"))
    for node_id in ("n1", "n2"):
        section = page.locator(f'section.node[data-node="{node_id}"]')
        expect(section).to_be_visible()
        expect(section.locator("[data-state]")).to_have_text(re.compile("^ready"))
        expect(section.locator("table.gpus tbody tr")).to_have_count(2)
    # Memory is known (0 of 80 GB used, in GiB); pretended GPUs report no utilisation, which
    # is drawn as unknown, not as an idle 0%.
    n1 = page.locator('section.node[data-node="n1"]')
    memory = n1.locator("table.gpus tbody tr").first.locator("td").nth(2)
    expect(memory).to_contain_text("0B / 74.5GiB")  # 80 GB
    utilisation = n1.locator("table.gpus tbody tr").first.locator("td").nth(3)
    expect(utilisation).to_contain_text("unknown")
    expect(utilisation.locator("svg .bar-hatch, svg .bar-unknown").first).to_be_attached()
    # One GPU serves the replica of m.
    expect(page.locator("section.node table.gpus td", has_text="m").first).to_be_visible()


def test_unplaceable_model_shows_its_explanation(fleet: Fleet, page: Page) -> None:
    fleet.srv.wait(
        lambda: (fleet.srv.model_counts("huge") or {}).get("unplaced"), "huge marked unplaced"
    )
    page.goto(f"{fleet.dash}/models")
    huge = page.locator('section.model[data-model="huge"]')
    expect(huge).to_contain_text("0 ready of 1 desired")
    expect(huge).to_contain_text("cannot be placed")
    explain = huge.locator(".explain")
    expect(explain).to_be_visible()
    # The reason per profile, naming the profile and what is missing.
    expect(explain).to_contain_text("tp8")
    expect(explain).to_contain_text(re.compile("GPU", re.I))
    # A model that fits has no explanation.
    expect(page.locator('section.model[data-model="m"] .explain')).to_have_count(0)
    # The overview says the same in one line.
    page.goto(f"{fleet.dash}/")
    expect(page.locator(".problem", has_text="huge")).to_be_visible()


def test_creating_a_key_shows_its_secret_once(fleet: Fleet, page: Page) -> None:
    page.goto(f"{fleet.dash}/keys")
    form = page.locator("form.create-key")
    form.locator('input[name="name"]').fill("team-a")
    form.locator('select[name="band"]').select_option("gold")
    form.locator('input[name="rpm"]').fill("600")
    form.locator('button[type="submit"]').click()
    secret = page.locator("#new-secret").inner_text().strip()
    assert len(secret) >= 20
    row = page.locator("table.keys tr", has_text="team-a")
    expect(row).to_contain_text("gold")
    expect(row).to_contain_text("600 rpm")
    # The secret works on the client port...
    client = openai.OpenAI(
        base_url=f"{fleet.srv.base}/v1", api_key=secret, max_retries=0, timeout=30
    )
    done = client.completions.create(model="m", prompt="hi", max_tokens=2)
    assert done.usage is not None and done.usage.completion_tokens == 2
    # ... and is never shown again: not on the keys page, not in the API.
    page.goto(f"{fleet.dash}/keys")
    expect(page.locator("table.keys tr", has_text="team-a")).to_be_visible()
    assert secret not in page.content()
    assert secret not in httpx.get(f"{fleet.srv.admin}/api/v1/keys", timeout=5).text


def test_revoking_a_key_through_the_ui(fleet: Fleet, page: Page) -> None:
    r = httpx.post(f"{fleet.srv.admin}/api/v1/keys", json={"name": "temp"}, timeout=5)
    key_id, secret = r.json()["id"], r.json()["secret"]
    page.goto(f"{fleet.dash}/keys")
    row = page.locator(f'tr[data-key="{key_id}"]')
    row.locator("button", has_text="Revoke").click()
    expect(page.locator(".notice")).to_contain_text(f"Key {key_id} is revoked")
    expect(page.locator(f'tr[data-key="{key_id}"]')).to_contain_text("revoked")
    # Refused within the key cache's TTL (1 s by default).
    client = openai.OpenAI(
        base_url=f"{fleet.srv.base}/v1", api_key=secret, max_retries=0, timeout=30
    )

    def refused() -> bool:
        try:
            client.completions.create(model="m", prompt="hi", max_tokens=1)
        except openai.AuthenticationError:
            return True
        return False

    wait_for(refused, "the revoked key refused", 10)


def test_client_port_dashboard_needs_an_admin_login(fleet: Fleet, page: Page) -> None:
    base = fleet.srv.base
    page.goto(f"{base}/admin/fleet")
    expect(page).to_have_url(re.compile(r"/admin/login\?next=%2Ffleet$"))
    # A key that is not an admin key is refused...
    user = httpx.post(f"{fleet.srv.admin}/api/v1/keys", json={"name": "user"}, timeout=5)
    page.fill('input[name="key"]', user.json()["secret"])
    page.click('form.login button[type="submit"]')
    expect(page.locator(".error")).to_contain_text("not an admin key")
    # ... as is a wrong one.
    page.fill('input[name="key"]', "sk-nonsense")
    page.click('form.login button[type="submit"]')
    expect(page.locator(".error")).to_contain_text("unknown, revoked or expired")
    # An admin key logs in and goes where it was headed.
    page.fill('input[name="key"]', fleet.admin_key)
    page.click('form.login button[type="submit"]')
    expect(page).to_have_url(f"{base}/admin/fleet")
    expect(page.locator('section.node[data-node="n1"]')).to_be_visible()
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["llmgw_session"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert session["path"] == "/admin"
    assert cookies["llmgw_csrf"]["httpOnly"] and cookies["llmgw_csrf"]["sameSite"] == "Strict"
    # The session lives in the store: another browser without it is sent to the login.
    assert httpx.get(f"{base}/admin/", timeout=5).status_code == 303
    with_cookie = httpx.get(
        f"{base}/admin/models", cookies={"llmgw_session": session["value"]}, timeout=5
    )
    assert with_cookie.status_code == 200 and "huge" in with_cookie.text
    # Logging out ends the session for everyone holding the cookie.
    page.click("header.top form.logout button")
    expect(page).to_have_url(re.compile(r"/admin/login"))
    gone = httpx.get(f"{base}/admin/models", cookies={"llmgw_session": session["value"]})
    assert gone.status_code == 303


def test_changes_without_the_csrf_token_are_refused(fleet: Fleet, page: Page) -> None:
    page.goto(f"{fleet.dash}/fleet")
    token = page.locator('input[name="csrf"]').first.get_attribute("value")
    csrf_cookie = {c["name"]: c["value"] for c in page.context.cookies()}["llmgw_csrf"]
    assert token == csrf_cookie
    url = f"{fleet.dash}/nodes/drain"
    # No token at all; a token without its cookie; a cookie with another token; a
    # matching pair sent from another site.
    attempts = [
        ({"node": "n1"}, {}, {}),
        ({"node": "n1", "csrf": token}, {}, {}),
        ({"node": "n1", "csrf": "forged"}, {"llmgw_csrf": token}, {}),
        (
            {"node": "n1", "csrf": token},
            {"llmgw_csrf": token},
            {"origin": "http://evil.example", "sec-fetch-site": "cross-site"},
        ),
    ]
    for form, cookies, headers in attempts:
        r = httpx.post(url, data=form, cookies=cookies, headers=headers, timeout=5)
        assert r.status_code == 403, (form, cookies, headers, r.text)
        assert "refused" in r.text
    assert fleet.node("n1")["cordoned"] is False


def test_draining_a_node_through_the_ui(fleet: Fleet, page: Page) -> None:
    page.goto(f"{fleet.dash}/fleet")
    n2 = page.locator('section.node[data-node="n2"]')
    n2.locator("button", has_text="Drain").click()
    expect(page.locator(".notice")).to_contain_text("Node n2 is draining")
    expect(page.locator('section.node[data-node="n2"] [data-state]')).to_contain_text("cordoned")
    expect(page.locator('section.node[data-node="n2"] button', has_text="Drain")).to_have_count(0)
    assert fleet.node("n2")["cordoned"] is True
    assert fleet.node("n1")["cordoned"] is False


def test_auto_refresh_keeps_input_and_scroll(fleet: Fleet, page: Page) -> None:
    page.set_viewport_size({"width": 900, "height": 300})
    page.goto(f"{fleet.dash}/keys")
    before = page.locator("#rendered time").inner_text()
    name = page.locator('form.create-key input[name="name"]')
    name.fill("half-typed")
    page.evaluate("window.scrollTo(0, 120)")
    scrolled = page.evaluate("window.scrollY")
    assert scrolled > 0
    # A new key appears without a reload (the table is a live region)...
    r = httpx.post(f"{fleet.srv.admin}/api/v1/keys", json={"name": "appears-live"}, timeout=5)
    assert r.status_code == 201
    expect(page.locator("table.keys tr", has_text="appears-live")).to_be_visible(timeout=12_000)
    expect(page.locator("#rendered time")).not_to_have_text(before)
    # ... while what was typed and where the page was stay as they were.
    assert name.input_value() == "half-typed"
    assert page.evaluate("window.scrollY") == scrolled


def test_traffic_page_charts_requests(fleet: Fleet, page: Page) -> None:
    client = openai.OpenAI(
        base_url=f"{fleet.srv.base}/v1", api_key=fleet.admin_key, max_retries=0, timeout=30
    )
    # Streamed, so each has a time to first token.
    for _ in range(6):
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
        )
        assert sum(1 for _ in stream) >= 3
    page.goto(f"{fleet.dash}/traffic")
    expect(page.locator("p.headline")).to_contain_text("req/s")
    figures = page.locator("figure.chart")
    expect(figures).to_have_count(10)
    expect(figures.first.locator("figcaption")).to_have_text("Requests per second")
    # Finished slots are charted: once the 5 s slot with the streams closes, their
    # time to first token appears (the page refreshes itself).
    ttft = figures.filter(has_text="Time to first token")
    expect(ttft.locator("svg .chart-line, svg .chart-dot").first).to_be_attached(timeout=15_000)
    expect(figures.first.locator("svg .chart-line, svg .chart-dot").first).to_be_attached()
    expect(ttft.locator("svg")).not_to_contain_text("no data")


def test_read_only_pages_work_without_javascript(
    fleet: Fleet, browser: Browser, shots: Path
) -> None:
    context = browser.new_context(java_script_enabled=False)
    try:
        pg = context.new_page()
        for path, text in (
            ("/", "Overview"),
            ("/fleet", "n1"),
            ("/models", "huge"),
            ("/endpoints", "Engine replicas"),
            ("/usage", "Usage"),
            ("/keys", "ops"),
        ):
            response = pg.goto(f"{fleet.dash}{path}")
            assert response is not None and response.status == 200, path
            expect(pg.locator("main")).to_contain_text(text)
        pg.screenshot(path=str(shots / "no-js-keys.png"), full_page=True)
    finally:
        context.close()


def test_usage_page_by_key_and_model(fleet: Fleet, page: Page) -> None:
    client = openai.OpenAI(
        base_url=f"{fleet.srv.base}/v1", api_key=fleet.admin_key, max_retries=0, timeout=30
    )
    client.completions.create(model="m", prompt="count me", max_tokens=4)
    page.goto(f"{fleet.dash}/usage?period=1h&by=key")
    # Usage is written in batches: the row appears within a few refreshes.
    expect(page.locator("table.usage tbody tr", has_text="ops")).to_be_visible(timeout=15_000)
    page.select_option('select[name="by"]', "model")
    page.click('form.filters button[type="submit"]')
    expect(page).to_have_url(re.compile(r"by=model"))
    row = page.locator("table.usage tbody tr", has_text="m")
    expect(row.first).to_be_visible()
    bad = httpx.get(f"{fleet.dash}/usage?period=forever", timeout=5)
    assert bad.status_code == 400 and "period: must be one of" in bad.text


def test_changing_a_runtime_models_replica_count(fleet: Fleet, page: Page) -> None:
    entry = {
        "name": "extra",
        "replicas": 0,
        "profiles": [{"name": "sim", "engine": "sim", "weights": "sim"}],
    }
    r = httpx.post(f"{fleet.srv.admin}/api/v1/models", json=entry, timeout=5)
    assert r.status_code == 201, r.text
    page.goto(f"{fleet.dash}/models")
    extra = page.locator('section.model[data-model="extra"]')
    expect(extra).to_contain_text("0 ready of 0 desired")
    # A bad number is refused with the API's reason, and nothing changes.
    extra.locator('input[name="replicas"]').fill("-1")
    page.evaluate(
        "document.querySelector('section.model[data-model=\"extra\"] form').noValidate = true"
    )
    extra.locator("button", has_text="Set").click()
    expect(page.locator(".error")).to_contain_text("replicas")
    assert fleet.srv.model_counts("extra")["desired"] == 0  # type: ignore[index]
    page.goto(f"{fleet.dash}/models")
    extra = page.locator('section.model[data-model="extra"]')
    extra.locator('input[name="replicas"]').fill("1")
    extra.locator("button", has_text="Set").click()
    expect(page.locator(".notice")).to_contain_text("Model extra: desired replicas set to 1")
    fleet.srv.wait(lambda: fleet.srv.ready_replicas("extra", 1), "a ready replica of extra")
    expect(page.locator('section.model[data-model="extra"]')).to_contain_text(
        "1 ready of 1 desired", timeout=12_000
    )
    # Models from the configuration file are changed there, not here.
    m = page.locator('section.model[data-model="m"]')
    expect(m.locator('input[name="replicas"]')).to_have_count(0)
    expect(m).to_contain_text("Defined in the configuration file")


def test_a_crash_looping_model_shows_why_it_does_not_start(page: Page) -> None:
    """Its own fleet: a model whose engine exits at once (a bad flag) backs off, and the
    dashboard says why, from the failed shard the agent reported."""
    config = control_config([model("bad", replicas=1, args=["--no-such-flag"])])
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config))
        stack.enter_context(agent(srv.agent_address, "n9", address="127.0.0.29"))
        srv.wait(lambda: (srv.model_counts("bad") or {}).get("backoff_seconds"), "bad backing off")
        page.goto(f"{srv.admin}/models")
        failure = page.locator('section.model[data-model="bad"] .failure')
        expect(failure).to_contain_text("Last failed start: exited with code 2")
        expect(failure).to_contain_text("unrecognized arguments: --no-such-flag")
        expect(failure).to_contain_text("on n9, exit code 2")
        page.goto(f"{srv.admin}/")
        expect(page.locator(".problem", has_text="bad")).to_contain_text("last failure")


# -- the dashboard tells the truth ------------------------------------------------------


# "46s", "0.2s", "1m 46s", "2h 5m", "3d 4h": never "46.3s", "346ms" or "1.77m".
DURATION = r"(0\.\d|\d+)s|\d+m( \d+s)?|\d+h( \d+m)?|\d+d( \d+h)?"


def test_times_read_as_human_durations(fleet: Fleet, page: Page) -> None:
    page.goto(f"{fleet.dash}/fleet")
    meta = page.locator('section.node[data-node="n1"] > header .muted')
    expect(meta).to_contain_text("in state")
    text = meta.inner_text()
    assert re.search(rf"heartbeat ({DURATION}) ago", text), text
    assert re.search(rf"in state ({DURATION})$", text), text


def ctl_args(command: str) -> Any:
    """`command` (an ``llmgw-ctl ...`` line a page or a doc shows) parsed by llmgw-ctl's
    own parser; fails the test where llmgw-ctl would refuse it."""
    words = shlex.split(command)
    assert words[0] == "llmgw-ctl", command
    try:
        return build_parser().parse_args(words[1:])
    except SystemExit as exc:
        raise AssertionError(f"llmgw-ctl refuses {command!r} (exit {exc.code})") from None


def test_the_login_hint_is_a_command_llmgw_ctl_accepts(fleet: Fleet, page: Page) -> None:
    page.goto(f"{fleet.srv.base}/admin/login")
    hint = page.locator("main p code", has_text="llmgw-ctl")
    expect(hint).to_have_count(1)
    args = ctl_args(hint.inner_text())
    assert (args.command, args.action, args.name, args.role) == ("keys", "create", "ops", "admin")


def test_models_show_the_routing_profile_that_applies(fleet: Fleet, page: Page) -> None:
    entry = {
        "name": "batchy",
        "replicas": 0,
        "routing_profile": "batch",
        "profiles": [{"name": "sim", "engine": "sim", "weights": "sim"}],
    }
    r = httpx.post(f"{fleet.srv.admin}/api/v1/models", json=entry, timeout=5)
    assert r.status_code == 201, r.text
    page.goto(f"{fleet.dash}/models")
    # A model with no routing profile of its own says nothing false about it...
    m = page.locator('section.model[data-model="m"] > header')
    expect(m).to_be_visible()
    expect(m).not_to_contain_text("None")
    # ... and one with a profile names it.
    batchy = page.locator('section.model[data-model="batchy"] > header')
    expect(batchy).to_contain_text("routing profile batch")


def test_fleet_page_shows_labels_as_labels_and_fabrics_as_fabrics(fleet: Fleet, page: Page) -> None:
    page.goto(f"{fleet.dash}/fleet")
    n1 = page.locator('section.node[data-node="n1"]')
    expect(n1.locator(".fabrics")).to_contain_text("fabrics: ib-a")
    expect(n1.locator(".fabrics")).not_to_contain_text("zone")
    expect(n1.locator(".labels")).to_contain_text("labels: zone=eu-1")
    expect(n1.locator(".labels")).not_to_contain_text("ib-a")
    n2 = page.locator('section.node[data-node="n2"]')
    expect(n2.locator(".fabrics")).to_have_text("no fabric")
    expect(n2.locator(".labels")).to_contain_text("labels: rack=r7")


def _disjoint(boxes: list[dict[str, float]]) -> bool:
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if (
                a["x"] < b["x"] + b["width"]
                and b["x"] < a["x"] + a["width"]
                and a["y"] < b["y"] + b["height"]
                and b["y"] < a["y"] + a["height"]
            ):
                return False
    return True


def test_node_state_counts_add_up_and_do_not_overlap(fleet: Fleet, page: Page) -> None:
    """Cordoned is not a state of its own: with n2 cordoned, the two nodes read as
    "2 ready (1 of them cordoned)", not "2 ready, 1 cordoned"; and the counts are laid out
    side by side, never over each other, however narrow the window."""
    if not fleet.node("n2")["cordoned"]:
        r = httpx.post(f"{fleet.srv.admin}/api/v1/nodes/n2/drain", timeout=5)
        assert r.status_code == 202, r.text
    for width in (1280, 360):
        page.set_viewport_size({"width": width, "height": 900})
        for path, where in (
            ("/fleet", "main .summary"),
            ("/", "section.card:has(h2 a[href='/fleet'])"),
        ):
            page.goto(f"{fleet.dash}{path}")
            states = page.locator(f"{where} .state")
            expect(states.first).to_be_visible()
            texts = states.all_inner_texts()
            counts = [int(re.match(r"\s*(\d+)", t).group(1)) for t in texts]  # type: ignore[union-attr]
            assert sum(counts) == 2, (path, texts)
            expect(page.locator(where)).to_contain_text("2 ready (1 of them cordoned)")
            boxes = [b for b in (s.bounding_box() for s in states.all()) if b is not None]
            assert len(boxes) == len(texts) and _disjoint(boxes), (path, width, boxes)


def test_the_queues_card_fits_a_1400px_window(fleet: Fleet, page: Page) -> None:
    # A pool's queues exist from its first request on: one with a column per band.
    client = openai.OpenAI(
        base_url=f"{fleet.srv.base}/v1", api_key=fleet.admin_key, max_retries=0, timeout=30
    )
    client.completions.create(model="m", prompt="hi", max_tokens=1)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{fleet.dash}/")
    card = page.locator("section.card", has=page.locator("table.queues"))
    table = card.locator("table.queues")
    expect(table.locator("tbody tr").first).to_be_visible()
    box, inner = card.bounding_box(), table.bounding_box()
    assert box is not None and inner is not None
    # Inside its card, not running past its border, and the page does not scroll sideways.
    assert inner["x"] >= box["x"] and inner["x"] + inner["width"] <= box["x"] + box["width"]
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    # Its saturation bar is drawn at a readable size, not squeezed to a sliver.
    bar = table.locator("svg.bar").first.bounding_box()
    assert bar is not None and bar["width"] >= 120


def test_a_burst_of_refusals_shows_as_errors(fleet: Fleet, page: Page) -> None:
    """429s that llmgw answers itself (a key's rate limit) are what the client saw:
    the overview and traffic pages count them as errors of the model, and the usage page
    as errors of the key."""
    r = httpx.post(f"{fleet.srv.admin}/api/v1/keys", json={"name": "tiny", "rpm": 1}, timeout=5)
    assert r.status_code == 201, r.text
    client = openai.OpenAI(
        base_url=f"{fleet.srv.base}/v1", api_key=r.json()["secret"], max_retries=0, timeout=30
    )
    client.completions.create(model="m", prompt="hi", max_tokens=1)  # the minute's one
    refused = 0
    for _ in range(4):
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model="m", prompt="hi", max_tokens=1)
        refused += 1

    def errors_at_least(locator: Any, n: int) -> None:
        expect(locator).to_have_attribute("data-errors", re.compile(r"^\d+$"))
        assert int(locator.get_attribute("data-errors")) >= n

    page.goto(f"{fleet.dash}/")
    traffic = page.locator("section.card", has_text="Traffic, last minute")
    errors_at_least(traffic.locator(".errors"), refused)
    expect(traffic).to_contain_text(re.compile(r"errors by model: m \d+"))

    page.goto(f"{fleet.dash}/traffic")
    errors_at_least(page.locator("p.headline .errors"), refused)
    errors_at_least(page.locator('table.by-model tr[data-model="m"] [data-errors]'), refused)
    # Charted per model once the slot with the burst closes (the page refreshes itself).
    chart = page.locator("figure.chart", has_text="Errors per second per model")
    expect(chart.locator("svg .chart-line, svg .chart-dot").first).to_be_attached(timeout=15_000)
    expect(chart.locator("svg")).to_contain_text("m ")

    # The usage store has them too: the key's five requests, four of them errors.
    page.goto(f"{fleet.dash}/usage?period=1h&by=key")
    row = page.locator("table.usage tbody tr", has_text="tiny")
    expect(row.locator("td").nth(1)).to_have_text("5", timeout=15_000)
    expect(row.locator("td").nth(2)).to_have_text(str(refused))


def test_retries_are_counted_and_charted_per_model(page: Page) -> None:
    """An engine that answers 500 before its first byte makes the router try the other
    one: the traffic page counts the retries of the model and charts them."""
    from tests.procs import set_faults
    from tests.test_router_e2e import FAST, chat
    from tests.test_router_e2e import fleet as sims

    with sims(2, config=FAST + 'failure_threshold = 100\n[store]\nurl = ""\n') as (srv, bases):
        set_faults(bases[0], error_rate=1.0, error_status=500)
        for _ in range(10):
            assert chat(srv).status_code == 200
        retried = srv.metric("llmgw_retries_total", model="m")
        assert retried >= 1
        page.goto(f"{srv.admin}/traffic")
        cell = page.locator('table.by-model tr[data-model="m"] td').nth(4)
        expect(cell).to_have_text(str(int(retried)))
        chart = page.locator("figure.chart", has_text="Retries per second per model")
        expect(chart.locator("svg .chart-line, svg .chart-dot").first).to_be_attached(
            timeout=15_000
        )
        expect(chart).not_to_contain_text("No retry counts recorded")


def test_prefix_predictions_and_spills_are_charted_across_workers(page: Page) -> None:
    """Requests under one long system prompt, to two llmgw-sim replicas behind
    llmgw-server --workers 2: the workers' prefix tables predict what the replica holds,
    the simulator's cached_tokens weigh it; once the prompt's home answers 429 the
    workers pass it over (a spill, throttled). The dashboard's traffic page, served by
    the control process from every worker's records, charts both (issue #31)."""
    from llmgw.dashboard.panels import NO_CACHE_REPORTS, NO_PREDICTIONS
    from tests.procs import server, set_faults, sim
    from tests.test_router_e2e import FAST, ask_tenant

    with ExitStack() as stack:
        bases = [stack.enter_context(sim(model="m"))[1] for _ in range(2)]
        flags = [f"--endpoint=s{i}={b}=m" for i, b in enumerate(bases)]
        srv = stack.enter_context(
            server(*flags, "--workers", "2", config=FAST + '[store]\nurl = ""\n')
        )
        srv.wait_scraped()
        homes = {ask_tenant(srv, i).headers["x-llmgw-endpoint"] for i in range(4)}
        assert len(homes) == 1, homes  # the workers agree on the prompt's home
        predicted = sum(
            srv.metric("llmgw_prefix_predictions_total", model="m", outcome=o)
            for o in ("hit", "miss", "over", "under")
        )
        assert predicted >= 3
        (home,) = homes
        set_faults(bases[int(home[1:])], error_rate=1.0, error_status=429)

        def spilled() -> float:
            return srv.metric(
                "llmgw_affinity_spills_total", model="m", affinity="prefix", reason="throttled"
            )

        # Each worker learns of the 429 on a request of its own, then passes the home over.
        for i in range(4, 30):
            ask_tenant(srv, i)
            if spilled() >= 1:
                break
        assert spilled() >= 1
        page.goto(f"{srv.admin}/traffic")
        # Once the 5 s slots of the requests close (the page refreshes itself).
        predictions = page.locator(
            "figure.chart", has_text="Prefix-cache predictions against the engines"
        )
        expect(predictions.locator("svg .chart-line, svg .chart-dot").first).to_be_attached(
            timeout=15_000
        )
        expect(predictions).not_to_contain_text(NO_CACHE_REPORTS)
        expect(predictions).not_to_contain_text(NO_PREDICTIONS)
        expect(predictions.locator(".chart-legend")).to_contain_text("confirmed")
        spills = page.locator("figure.chart", has_text="Affinity spills per second by reason")
        expect(spills.locator("svg .chart-line, svg .chart-dot").first).to_be_attached(
            timeout=15_000
        )
        expect(spills.locator(".chart-legend")).to_contain_text("prefix:throttled")


def test_cordon_and_uncordon_through_the_ui(fleet: Fleet, page: Page) -> None:
    """A cordon is undone from the same page; a node that is not lost has no Forget."""
    page.goto(f"{fleet.dash}/fleet")
    n1 = page.locator('section.node[data-node="n1"]')
    expect(n1.locator("button", has_text="Forget")).to_have_count(0)
    n1.locator("button", has_text="Cordon").click()
    expect(page.locator(".notice")).to_contain_text("Node n1 is cordoned")
    n1 = page.locator('section.node[data-node="n1"]')
    expect(n1.locator("[data-state]")).to_have_text(re.compile(r"ready, cordoned$"))
    assert fleet.node("n1")["cordoned"] is True and fleet.node("n1")["draining"] is False
    n1.locator("button", has_text="Uncordon").click()
    expect(page.locator(".notice")).to_contain_text("Node n1 takes new replicas again")
    expect(page.locator('section.node[data-node="n1"] [data-state]')).to_have_text("ready")
    assert fleet.node("n1")["cordoned"] is False


def test_forgetting_a_lost_node_through_the_ui(page: Page) -> None:
    """Its own fleet (the module's nodes stay): a node whose agent is gone turns lost,
    gets a Forget button, and once forgotten is gone from the page and the API."""
    config = control_config([HUGE], unreachable="1s", lost="2s")
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config))
        n7 = stack.enter_context(agent(srv.agent_address, "n7", address="127.0.0.27"))
        srv.wait(lambda: srv.nodes().get("n7", {}).get("state") == "ready", "n7 ready")
        n7.proc.kill(signal.SIGKILL)  # the machine is gone
        srv.wait(lambda: srv.nodes()["n7"]["state"] == "lost", "n7 lost")
        page.goto(f"{srv.admin}/fleet")
        node = page.locator('section.node[data-node="n7"]')
        expect(node.locator("[data-state]")).to_have_text(re.compile("^lost"))
        node.locator("button", has_text="Forget").click()  # the page fixture confirms
        expect(page.locator(".notice")).to_contain_text("Node n7 is forgotten")
        expect(page.locator('section.node[data-node="n7"]')).to_have_count(0)
        assert "n7" not in srv.nodes()
        gone = httpx.get(f"{srv.admin}/api/v1/nodes/n7", timeout=5)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "node_not_found"


def test_a_model_at_zero_reads_idle_then_starting_then_ready(page: Page) -> None:
    """Its own fleet: an autoscaled model at zero whose engine takes 8 s to come up (the
    page refreshes every REFRESH_SECONDS: one refresh falls within the start)."""
    from tests.test_coldstart_e2e import scaled

    config = control_config([scaled("z", startup="8s")])
    with ExitStack() as stack:
        srv = stack.enter_context(fleet_server(config))
        stack.enter_context(agent(srv.agent_address, "n8", address="127.0.0.28"))
        srv.wait(lambda: srv.nodes().get("n8", {}).get("state") == "ready", "n8 ready")
        page.goto(f"{srv.admin}/models")
        z = page.locator('section.model[data-model="z"]')
        expect(z.locator("header")).to_contain_text("autoscaled, 0 to 1 replicas")
        expect(z.locator(".counts")).to_contain_text("idle at zero replicas: a request wakes it")
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(
                openai.OpenAI(
                    base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=30
                ).completions.create,
                model="z",
                prompt="hi",
                max_tokens=2,
            )
            # The page refreshes itself: the waiting request shows while the engine loads.
            expect(z.locator(".counts")).to_contain_text(
                "starting from zero: 1 request waiting", timeout=10_000
            )
            done = asked.result(timeout=30)
        assert done.usage is not None and done.usage.completion_tokens == 2
        expect(z.locator(".counts")).to_contain_text("1 ready of 1 desired", timeout=10_000)
