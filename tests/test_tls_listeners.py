"""TLS on the client port and the admin listener (issue #17), through a real
llmgw-server in front of a real llmgw-sim, with certificates made by
scripts/make_certs.sh.

The official openai client speaks https to the client port; HTTP/2 is offered by
ALPN; the admin listener with `client_ca` refuses a client without a certificate;
SIGHUP makes new connections get a renewed certificate without a restart.
"""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmgw.transport.certs import CertPair
from tests.procs import scratch_dir, server, sim
from tests.waiting import wait_for


def _config(sim_url: str, certs: Path, ca: CertPair) -> str:
    return f"""
[store]
url = ""

[listen_tls]
cert = "{certs / "server.pem"}"
key = "{certs / "server.key"}"

[admin_tls]
cert = "{certs / "server.pem"}"
key = "{certs / "server.key"}"
client_ca = "{ca.cert}"

[[endpoints]]
id = "sim"
url = "{sim_url}"
models = ["sim-model"]
"""


MAKE_CERTS = Path(__file__).parent.parent / "scripts" / "make_certs.sh"


def make_certs(directory: Path, *node_ids: str) -> CertPair:
    """scripts/make_certs.sh in `directory`: the CA (reused when there), the server's
    pair for localhost and 127.0.0.1, and a client pair per node id."""
    subprocess.run(["bash", str(MAKE_CERTS), str(directory), *node_ids], check=True)
    return CertPair(directory / "ca.pem", directory / "ca.key")


@pytest.fixture(scope="module")
def tls_fleet() -> Iterator[tuple[object, Path, CertPair]]:
    certs = scratch_dir("llmgw-tls-")
    ca = make_certs(certs, "ops")
    with sim() as (_, sim_url), server(config=_config(sim_url, certs, ca)) as srv:
        yield srv, certs, ca


def _https(srv: object, listener: str) -> str:
    address = srv.proc.ready[listener][0]  # type: ignore[attr-defined]
    return f"https://{address}"


def _trusting(ca: CertPair) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca.cert))


def _served_cert(address: str) -> str:
    host, _, port = address.rpartition(":")
    return ssl.get_server_certificate((host, int(port)))


def test_the_openai_client_over_https_with_http2(tls_fleet: tuple[object, Path, CertPair]) -> None:
    srv, _, ca = tls_fleet
    base = _https(srv, "listen")
    with httpx.Client(verify=_trusting(ca), http2=True, timeout=20) as http:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", http_client=http)
        wait_for(lambda: client.models.list().data, "the sim's model is listed", 20)
        answer = client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert answer.choices[0].message.content
        stream = client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=8,
            stream=True,
        )
        assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content) > 0
        assert http.get(f"{base}/v1/models").http_version == "HTTP/2"
    # HTTP/1.1 clients are served too, and plain HTTP is not (a TLS listener only).
    with httpx.Client(verify=_trusting(ca)) as http1:
        assert http1.get(f"{base}/v1/models").http_version == "HTTP/1.1"
    with pytest.raises(httpx.HTTPError):
        httpx.get(base.replace("https://", "http://") + "/v1/models", timeout=5)
    # A client that does not trust the CA is refused by its own TLS check.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/v1/models", timeout=5)


def test_the_admin_listener_requires_a_client_certificate(
    tls_fleet: tuple[object, Path, CertPair],
) -> None:
    srv, certs, ca = tls_fleet
    base = _https(srv, "admin_listen")
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.get(f"{base}/healthz", verify=_trusting(ca), timeout=5).raise_for_status()
    context = _trusting(ca)
    context.load_cert_chain(str(certs / "ops.pem"), str(certs / "ops.key"))
    with httpx.Client(verify=context, timeout=5) as admin:
        assert admin.get(f"{base}/healthz").json() == {"status": "ok"}
        page = admin.get(f"{base}/")
        assert page.status_code == 200
        # Over TLS the dashboard's cookies are Secure and __Host- prefixed.
        cookie = page.headers["set-cookie"]
        assert cookie.startswith("__Host-llmgw_csrf=") and "Secure" in cookie


def test_sighup_serves_a_renewed_certificate(tls_fleet: tuple[object, Path, CertPair]) -> None:
    srv, certs, ca = tls_fleet
    address = srv.proc.ready["listen"][0]  # type: ignore[attr-defined]
    before = _served_cert(address)
    fresh = scratch_dir("llmgw-renewed-")
    for name in ("ca.pem", "ca.key"):  # the same CA signs the renewed certificate
        shutil.copy(certs / name, fresh / name)
    make_certs(fresh)
    renewed = CertPair(fresh / "server.pem", fresh / "server.key")
    (certs / "server.pem").write_bytes(renewed.cert.read_bytes())
    (certs / "server.key").write_bytes(renewed.key.read_bytes())
    assert before != renewed.cert.read_text()
    srv.proc.kill(signal.SIGHUP)  # type: ignore[attr-defined]
    wait_for(
        lambda: (
            _served_cert(address)
            == ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert(renewed.cert.read_text()))
        ),
        "the renewed certificate is served",
        10,
        transient=(OSError,),
    )
    # Still serving, on the same process.
    assert srv.proc.popen.poll() is None  # type: ignore[attr-defined]
    with httpx.Client(verify=_trusting(ca), timeout=5) as http:
        assert http.get(f"https://{address}/v1/models").status_code == 200
