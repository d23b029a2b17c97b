"""The probes of issue #17 against a real llmgw-server on loopback (SQLite store): a
DNS-rebinding Host, a cross-site POST, JSON sent as text/plain, a CRLF login redirect
and a body trickled a byte at a time are refused; the same request from the
operator's own tools is served. Off loopback the Host allowlist holds too, and a
scraper reaching the machine by its address or name is served."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest

from .procs import running, server

CONFIG = '[store]\nurl = "sqlite:///{path}"\n'


def test_rebinding_and_cross_site_requests_cannot_create_a_key(tmp_path: Path) -> None:
    config = CONFIG.format(path=tmp_path / "llmgw.db")
    with server("--endpoint", "e=http://127.0.0.1:9=m", config=config) as srv:
        keys = f"{srv.admin}/api/v1/keys"
        body = {"name": "probe", "admin": True}
        rebound = httpx.post(keys, json=body, headers={"host": "attacker.example"}, timeout=5)
        assert rebound.status_code == 421, rebound.text
        cross = httpx.post(
            keys, json=body, headers={"origin": "http://attacker.example"}, timeout=5
        )
        assert cross.status_code == 403 and cross.json()["error"]["code"] == "cross_site"
        fetched = httpx.post(keys, json=body, headers={"sec-fetch-site": "cross-site"}, timeout=5)
        assert fetched.status_code == 403
        # A form or fetch() may post text/plain cross-site without asking first.
        plain = httpx.post(
            keys, content=b'{"name": "probe"}', headers={"content-type": "text/plain"}, timeout=5
        )
        assert plain.status_code == 415, plain.text
        assert httpx.get(keys, timeout=5).json()["keys"] == []  # nothing was created
        # The operator's own client (no Origin, the listener's address as Host) is served.
        made = httpx.post(keys, json={"name": "ops", "admin": True}, timeout=5)
        assert made.status_code == 201, made.text
        # The login on the client port: a CRLF in `next` never becomes a header.
        with httpx.Client(base_url=srv.base, timeout=5) as browser:
            browser.get("/admin/login")
            r = browser.post(
                "/admin/login",
                params={"next": "/\r\nSet-Cookie: evil=1"},
                data={"csrf": browser.cookies["llmgw_csrf"], "key": made.json()["secret"]},
            )
        assert r.status_code == 303, r.text
        assert "evil" not in r.headers.get("set-cookie", "")
        assert r.headers["location"] == "/admin/"


def _trickle(
    address: str, path: str, content_type: str, interval: float, budget: float
) -> tuple[bytes, float]:
    """POST `path` with a 1 KiB Content-Length, then a byte every `interval` seconds
    until the server answers (or `budget` seconds pass); its answer and how long."""
    host, _, port = address.removeprefix("http://").rpartition(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=budget) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: 1024\r\n\r\n".encode()
        )
        sock.settimeout(interval)
        answer = b""
        while time.monotonic() - start < budget:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                sock.sendall(b" ")
                continue
            if not chunk:
                break
            answer += chunk
            if b"\r\n\r\n" in answer:
                break
    return answer, time.monotonic() - start


def test_a_trickled_body_gets_408_at_client_body(tmp_path: Path) -> None:
    """A byte every 0.25 s never lets a chunk wait time out; the whole body must come
    within router.timeouts.client_body (1 s here), on the admin API and the login."""
    config = CONFIG.format(path=tmp_path / "llmgw.db") + '[router.timeouts]\nclient_body = "1s"\n'
    with server("--endpoint", "e=http://127.0.0.1:9=m", config=config) as srv:
        for base, path, content_type in (
            (srv.admin, "/api/v1/keys", "application/json"),
            (srv.base, "/admin/login", "application/x-www-form-urlencoded"),
        ):
            answer, took = _trickle(base, path, content_type, 0.25, 30.0)
            assert answer.startswith(b"HTTP/1.1 408"), (path, answer[:200])
            assert took < 15, (path, took)  # 1024 bytes at this pace would take 256 s


def _outward_address() -> str:
    """The IPv4 address other machines reach this one on: its default route's source
    (connect() on UDP only picks the route; nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))
        return str(probe.getsockname()[0])


@pytest.mark.parametrize(
    ("bind", "names"),
    [("0.0.0.0", []), ("0.0.0.0", ["metrics.example.internal"]), ("outward", [])],
    ids=["wildcard", "wildcard-admin-hosts", "one-address"],
)
def test_off_loopback_the_admin_listener_answers_only_the_machines_own_names(
    tmp_path: Path, bind: str, names: list[str]
) -> None:
    """Off loopback the Host allowlist was checked only when admin_hosts was set, and
    then replaced the listener's own names (issue #17): a rebound page could read
    /metrics, and a Prometheus scraping the machine by its address got 421."""
    outward = _outward_address()
    config = tmp_path / "llmgw.toml"
    # Top-level keys before the first table.
    config.write_text(f"admin_hosts = {names!r}\n" + CONFIG.format(path=tmp_path / "llmgw.db"))
    host = outward if bind == "outward" else bind
    argv = ("--config", str(config), "--endpoint", "e=http://127.0.0.1:9=m",
            "--listen", "127.0.0.1:0", "--admin-listen", f"{host}:0")  # fmt: skip
    with running("llmgw-server", *argv, ready=True) as proc:
        (bound,) = proc.ready["admin_listen"]
        port = bound.rsplit(":", 1)[1]
        # Where Prometheus would scrape it: the machine's address, as the Host too.
        scraped = httpx.get(f"http://{outward}:{port}/metrics", timeout=5)
        assert scraped.status_code == 200, scraped.text
        connect = outward if bind == "outward" else "127.0.0.1"

        def status(host_header: str) -> int:
            url = f"http://{connect}:{port}/metrics"
            return httpx.get(url, headers={"host": host_header}, timeout=5).status_code

        assert status(f"attacker.example:{port}") == 421
        assert status(f"{socket.gethostname()}:{port}") == 200
        # An SSH tunnel's end: ssh -L 9090:<address>:<port> sends Host: 127.0.0.1.
        assert status(f"127.0.0.1:{port}") == 200
        assert status(f"localhost:{port}") == 200
        for name in names:
            assert status(f"{name}:{port}") == 200
        log = proc.log.read_text()
    assert "admin listener answers to Host " in log, log
