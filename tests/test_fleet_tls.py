"""Mutual TLS on the agent port, through real processes: `llmgw-server` with
`[agent_tls]`, `llmgw-agent` processes with certificates made by
`llmgw.transport.certs` (openssl) in a temporary directory.

One server for the module; each test brings its agents: the right certificate
registers and serves; a certificate from another CA, a node id that is not the
certificate's, and a plaintext agent are all kept out, and say why.
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import attrs
import grpc
import httpx
import pytest

from llmgw.transport import certs
from llmgw.transport.pb import agent_pb2 as pb
from llmgw.transport.pb import agent_pb2_grpc
from tests.procs import FleetServer, agent, fleet_server, wait_for
from tests.test_fleet_e2e import complete, control_config, model

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@attrs.frozen
class Pki:
    ca: certs.CertPair
    server: certs.CertPair
    good: certs.CertPair  # CN n-good, from our CA
    named: certs.CertPair  # CN n-cert, from our CA
    rogue: certs.CertPair  # CN n-rogue, from another CA
    evil: certs.CertPair  # CN n-evil, from our CA: a node that lies in its reports


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    out = tmp_path_factory.mktemp("pki")
    ca = certs.make_ca(out)
    other = certs.make_ca(out / "other", subject="someone else's CA")
    return Pki(
        ca=ca,
        server=certs.make_server_cert(out, ca, ["127.0.0.1", "localhost"]),
        good=certs.make_node_cert(out, ca, "n-good"),
        named=certs.make_node_cert(out, ca, "n-cert"),
        rogue=certs.make_node_cert(out / "other", other, "n-rogue"),
        evil=certs.make_node_cert(out, ca, "n-evil"),
    )


def tls_config(pki: Pki) -> str:
    return f"""
[agent_tls]
cert = "{pki.server.cert}"
key = "{pki.server.key}"
client_ca = "{pki.ca.cert}"
"""


@pytest.fixture(scope="module")
def srv(pki: Pki) -> Iterator[FleetServer]:
    with fleet_server(control_config([model("m")], extra=tls_config(pki))) as server:
        yield server


def tls_args(pair: certs.CertPair, ca: Path) -> tuple[str, ...]:
    return ("--tls-cert", str(pair.cert), "--tls-key", str(pair.key), "--tls-ca", str(ca))


def test_an_agent_with_a_certificate_from_our_ca_registers_and_serves(
    srv: FleetServer, pki: Pki
) -> None:
    with agent(
        srv.agent_address, "n-good", *tls_args(pki.good, pki.ca.cert), address="127.0.0.71"
    ) as a:
        srv.wait(lambda: srv.ready_replicas("m", 1), "m ready on n-good", logs=[a.proc])
        node = srv.nodes()["n-good"]
        assert node["state"] == "ready" and node["connected"], node
        complete(srv)
        assert "PLAINTEXT" not in srv.proc.output()
        assert "no TLS" not in a.proc.output()


def test_an_agent_with_a_certificate_from_another_ca_cannot_connect(
    srv: FleetServer, pki: Pki
) -> None:
    # It trusts our server (our CA), but its own certificate is someone else's.
    with agent(
        srv.agent_address, "n-rogue", *tls_args(pki.rogue, pki.ca.cert), address="127.0.0.72"
    ) as a:
        wait_for(
            lambda: "refused our client certificate" in a.proc.output(),
            "the rogue agent saying why it cannot connect",
            context=a.proc.output,
        )
        # And it keeps trying, never getting in.
        wait_for(lambda: a.proc.output().count("refused our client certificate") >= 2, "a retry")
        assert "n-rogue" not in srv.nodes()
        assert "registered with the server" not in a.proc.output()
    # The handshake failed: no handler ever saw it.
    assert "n-rogue" not in srv.proc.output()


def test_an_agent_whose_node_id_is_not_its_certificates_is_refused(
    srv: FleetServer, pki: Pki
) -> None:
    # A valid certificate for n-cert, used to claim to be another node.
    with agent(
        srv.agent_address, "n-liar", *tls_args(pki.named, pki.ca.cert), address="127.0.0.73"
    ) as a:
        wait_for(
            lambda: "refused registration of 'n-liar'" in srv.proc.output(),
            "the server refusing n-liar",
            context=srv.proc.output,
        )
        assert (
            "node id 'n-liar' does not match the connection's verified identity 'n-cert'"
            in srv.proc.output()
        )
        # It keeps trying and is refused each time; it never gets in.
        wait_for(
            lambda: srv.proc.output().count("refused registration of 'n-liar'") >= 2,
            "a second refusal",
            context=srv.proc.output,
        )
        assert "n-liar" not in srv.nodes() and "n-cert" not in srv.nodes()
        output = a.proc.output()
        assert "registered with the server" not in output
        # The server says why before it closes the stream.
        assert "the server refused this agent" in output
        assert "does not match the connection's verified identity 'n-cert'" in output


def test_a_plaintext_agent_cannot_reach_the_tls_port(srv: FleetServer) -> None:
    with agent(srv.agent_address, "n-plain", address="127.0.0.74") as a:
        wait_for(
            lambda: "does it require TLS?" in a.proc.output(),
            "the plaintext agent failing to connect, and guessing why",
            context=a.proc.output,
        )
        assert "n-plain" not in srv.nodes()
        assert "registered with the server" not in a.proc.output()


def test_a_certified_node_reporting_its_engine_at_another_port_is_refused_and_never_routed_to(
    pki: Pki,
) -> None:
    """A node with a valid certificate is placed a replica, then says it is ready at a
    port of its choosing (where something else listens). The server publishes only the
    URL it derives (the node's registered address and the port it assigned): the report
    is refused and logged, and no client request reaches that port."""
    # Its own server: the module's has agents of the other tests coming and going.
    with (
        fleet_server(control_config([model("m")], extra=tls_config(pki))) as server,
        socket.create_server(("127.0.0.1", 0)) as foreign,
    ):
        foreign_port = foreign.getsockname()[1]
        requests: queue.Queue[pb.ConnectRequest | None] = queue.Queue()

        def outgoing() -> Iterator[pb.ConnectRequest]:
            while (request := requests.get()) is not None:
                yield request

        credentials = grpc.ssl_channel_credentials(
            root_certificates=pki.ca.cert.read_bytes(),
            private_key=pki.evil.key.read_bytes(),
            certificate_chain=pki.evil.cert.read_bytes(),
        )
        node = pb.NodeInfo(
            node_id="n-evil",
            hostname="n-evil",
            address="127.0.0.1",
            gpus=[pb.Gpu(index=0, uuid="GPU-evil-0", name="NVIDIA H100", memory_total=80 << 30)],
            engines=[pb.EngineInfo(name="sim")],
        )
        with grpc.secure_channel(server.agent_address, credentials) as channel:
            responses = agent_pb2_grpc.AgentServiceStub(channel).Connect(outgoing(), timeout=60)
            try:
                requests.put(pb.ConnectRequest(register=pb.Register(node=node)))
                assert next(responses).WhichOneof("payload") == "registered"
                start = next(responses)
                assert start.WhichOneof("payload") == "start_shard", start
                cmd = start.start_shard
                assert cmd.port != foreign_port
                requests.put(
                    pb.ConnectRequest(
                        shard_status=pb.ShardStatus(
                            replica_id=cmd.replica_id,
                            rank=0,
                            epoch=cmd.epoch,
                            state=pb.SHARD_STATE_READY,
                            model="m",
                            endpoint_url=f"http://127.0.0.1:{foreign_port}",
                            port=cmd.port,
                        )
                    )
                )
                # The server has decided about the report: refused it, or (the bug)
                # published the replica.
                refusal = "not the URL it was assigned"
                server.wait(
                    lambda: refusal in server.proc.output() or server.ready_replicas("m", 1),
                    "the server deciding about n-evil's report",
                )
                # A client asks for m: whatever it gets, nothing reaches the foreign port.
                # (A timeout is the request waiting for a replica of m that never comes.)
                with contextlib.suppress(httpx.TimeoutException):
                    httpx.post(
                        f"{server.base}/v1/completions",
                        json={"model": "m", "prompt": "secret", "max_tokens": 1},
                        timeout=3,
                    )
                foreign.setblocking(False)
                with pytest.raises(BlockingIOError):
                    foreign.accept()[0].close()  # a connection the router made
                assert refusal in server.proc.output()
                assert f"127.0.0.1:{foreign_port}" in server.proc.output()  # named in the log
                assert not server.ready_replicas("m")
            finally:
                requests.put(None)
