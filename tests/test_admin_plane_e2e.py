"""The probes of issue #17 against a real llmgw-server on loopback (SQLite store): a
DNS-rebinding Host, a cross-site POST, and a CRLF login redirect are refused; the same
request from the operator's own tools is served."""

from __future__ import annotations

from pathlib import Path

import httpx

from .procs import server

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
