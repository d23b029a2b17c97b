"""The gRPC agent transport with mutual TLS: identities from certificates, refused
certificates and servers, plaintext and TLS mismatches, scripts/make_certs.sh."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest
import trio

from llmgw.config import TlsConfig
from llmgw.transport import certs
from llmgw.transport.base import AgentConnection, ConnectFailed
from llmgw.transport.grpc import GrpcConnector, GrpcListener
from tests.grpc_peers import (
    REGISTERED,
    connector,
    echo_registration,
    register,
    serving,
)

ROOT = Path(__file__).resolve().parent.parent


# -- mutual TLS ---------------------------------------------------------------------------------


@attrs.frozen
class Pki:
    server: TlsConfig  # the listener's: server cert and key, the CA of client certs
    node: TlsConfig  # gpu-1's: its cert and key, the CA that signed the server's
    rogue: TlsConfig  # a "gpu-1" certificate from another CA
    wrong_trust: TlsConfig  # gpu-1's certificate, but trusting the other CA for the server
    ca: certs.CertPair


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    out = tmp_path_factory.mktemp("pki")
    ca = certs.make_ca(out)
    other_ca = certs.make_ca(out, "other-ca", subject="someone else's CA")
    server = certs.make_server_cert(out, ca, ("localhost", "127.0.0.1"))
    node = certs.make_node_cert(out, ca, "gpu-1")
    rogue = certs.make_node_cert(out, other_ca, "gpu-1", name="rogue")
    return Pki(
        server=TlsConfig(str(server.cert), str(server.key), str(ca.cert)),
        node=TlsConfig(str(node.cert), str(node.key), str(ca.cert)),
        rogue=TlsConfig(str(rogue.cert), str(rogue.key), str(ca.cert)),
        wrong_trust=TlsConfig(str(node.cert), str(node.key), str(other_ca.cert)),
        ca=ca,
    )


async def test_mtls_accepts_the_right_certificate_and_reports_its_identity(pki: Pki) -> None:
    identities: list[str | None] = []

    async def handler(conn: AgentConnection) -> None:
        identities.append(conn.peer_identity)
        await echo_registration(conn)

    with trio.fail_after(5):
        async with serving(handler, tls=pki.server) as listener:
            async with connector(listener, tls=pki.node, node_id="gpu-1").connect() as conn:
                await conn.send(register("gpu-1"))
                assert await conn.receive() == REGISTERED
            # By name too: the server certificate names localhost as well.
            address = f"localhost:{listener.port}"
            async with GrpcConnector(address, tls=pki.node).connect() as conn:
                await conn.send(register("gpu-1"))
                assert await conn.receive() == REGISTERED
    assert identities == ["gpu-1", "gpu-1"]


async def test_mtls_identity_falls_back_to_the_san(pki: Pki, tmp_path: Path) -> None:
    """A client certificate without a common name is known by its first SAN."""
    key, csr, ext, cert = (tmp_path / name for name in ("n.key", "n.csr", "n.ext", "n.pem"))
    ext.write_text("extendedKeyUsage=clientAuth\nsubjectAltName=DNS:gpu-5.fleet\n")
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    await trio.run_process(
        ["openssl", "req", "-new", *newkey, "-keyout", key, "-out", csr, "-subj", "/O=llmgw"],
        capture_stderr=True,
    )
    await trio.run_process(
        ["openssl", "x509", "-req", "-in", csr, "-CA", pki.ca.cert, "-CAkey", pki.ca.key,
         "-set_serial", "0x1234", "-days", "2", "-extfile", ext, "-out", cert],
        capture_stderr=True,
    )  # fmt: skip
    identities: list[str | None] = []

    async def handler(conn: AgentConnection) -> None:
        identities.append(conn.peer_identity)
        await echo_registration(conn)

    san_only = TlsConfig(str(cert), str(key), pki.node.client_ca)
    with trio.fail_after(5):
        async with (
            serving(handler, tls=pki.server) as listener,
            connector(listener, tls=san_only).connect() as conn,
        ):
            await conn.send(register("gpu-5.fleet"))
            assert await conn.receive() == REGISTERED
    assert identities == ["gpu-5.fleet"]


async def test_mtls_refuses_a_client_certificate_from_another_ca(pki: Pki) -> None:
    identities: list[str | None] = []

    async def handler(conn: AgentConnection) -> None:
        identities.append(conn.peer_identity)
        await echo_registration(conn)

    with trio.fail_after(5):
        async with serving(handler, tls=pki.server) as listener:
            with pytest.raises(ConnectFailed, match="client certificate"):
                async with connector(listener, tls=pki.rogue).connect():
                    pass
            # The listener serves on: a trusted node after it gets its stream.
            async with connector(listener, tls=pki.node).connect() as conn:
                await conn.send(register("gpu-1"))
                assert await conn.receive() == REGISTERED
    # Once, for the trusted node: the rogue (also a "gpu-1") never reached the handler
    # while the listener ran.
    assert identities == ["gpu-1"]


async def test_mtls_client_refuses_a_server_it_does_not_trust(pki: Pki) -> None:
    with trio.fail_after(5):
        async with serving(echo_registration, tls=pki.server) as listener:
            with pytest.raises(ConnectFailed, match="certificate verify failed"):
                async with connector(listener, tls=pki.wrong_trust).connect():
                    pass


async def test_plaintext_client_cannot_reach_a_tls_listener(pki: Pki) -> None:
    called = False

    async def handler(conn: AgentConnection) -> None:
        nonlocal called
        called = True

    with trio.fail_after(5):
        async with serving(handler, tls=pki.server) as listener:
            with pytest.raises(ConnectFailed, match="require TLS"):
                async with connector(listener).connect():
                    pass
    assert not called


async def test_tls_client_cannot_reach_a_plaintext_listener(pki: Pki) -> None:
    with trio.fail_after(5):
        async with serving(echo_registration) as listener:
            with pytest.raises(ConnectFailed, match="TLS handshake failed"):
                async with connector(listener, tls=pki.node).connect():
                    pass


async def test_mtls_client_checks_the_server_name(pki: Pki) -> None:
    with trio.fail_after(5):
        async with serving(echo_registration, tls=pki.server) as listener:
            wrong_name = connector(listener, tls=pki.node, server_name="ctl.example.com")
            with pytest.raises(ConnectFailed, match="does not name this host"):
                async with wrong_name.connect():
                    pass
            right_name = connector(listener, tls=pki.node, server_name="localhost")
            async with right_name.connect() as conn:
                await conn.send(register("gpu-1"))
                assert await conn.receive() == REGISTERED


def test_tls_listener_requires_a_client_ca(pki: Pki) -> None:
    with pytest.raises(ValueError, match="client_ca"):
        GrpcListener(":0", tls=TlsConfig(pki.server.cert, pki.server.key))


async def test_make_certs_script_makes_a_working_pki(tmp_path: Path) -> None:
    done = await trio.run_process(
        ["bash", str(ROOT / "scripts" / "make_certs.sh"), str(tmp_path), "gpu-7"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    files = set(os.listdir(tmp_path))
    assert {"ca.pem", "ca.key", "server.pem", "server.key", "gpu-7.pem", "gpu-7.key"} <= files
    server_tls = TlsConfig(
        *(str(tmp_path / name) for name in ("server.pem", "server.key", "ca.pem"))
    )
    node_tls = TlsConfig(*(str(tmp_path / name) for name in ("gpu-7.pem", "gpu-7.key", "ca.pem")))
    identities: list[str | None] = []

    async def handler(conn: AgentConnection) -> None:
        identities.append(conn.peer_identity)
        await echo_registration(conn)

    with trio.fail_after(5):
        async with (
            serving(handler, tls=server_tls) as listener,
            connector(listener, tls=node_tls).connect() as conn,
        ):
            await conn.send(register("gpu-7"))
            assert await conn.receive() == REGISTERED
    assert identities == ["gpu-7"]
