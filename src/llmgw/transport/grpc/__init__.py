"""The gRPC agent transport: :mod:`llmgw.transport.base` over ``AgentService.Connect``.

The server listens with :class:`GrpcListener`, agents connect with
:class:`GrpcConnector`; each connection is one bidirectional ``Connect`` stream of
``ConnectRequest``/``ConnectResponse``, converted to and from the protocol's values
by :mod:`llmgw.transport.convert` at this edge. Any stock gRPC peer built from
``proto/llmgw/agent/v1/agent.proto`` interoperates.

grpcio's ``grpc.aio`` does the wire work in the process's one asyncio thread
(:mod:`llmgw.transport.grpc_bridge`, DESIGN §11); trio only ever waits on events.
Per stream the asyncio side runs a reader (messages → a bounded inbox that trio's
``receive`` takes from) and a writer (trio's ``send`` → a bounded outbox → the
stream), so:

* cancelling ``receive`` loses no message (taking one from the inbox is atomic);
* cancelling ``send`` cancels only its wait for room in the outbox, never a
  half-done write (grpc.aio cancels the whole RPC when a write is cancelled);
* ``aclose`` is graceful: what was sent is flushed, then the stream ends; a stream
  that does not finish within ``CLOSE_GRACE`` is cut. A cancelled ``aclose`` cuts
  at once.

Either end closing ends the whole connection, as with the stub: the agent's
``aclose`` half-closes the stream and the server then ends it (so the server's
``send`` fails); the server's ends it with status OK after its last message.

Liveness: both ends send HTTP/2 keepalive pings (:class:`Keepalive`), so a peer
whose host or network died (no FIN, no RST) ends ``receive`` with
ConnectionClosed within ``interval + timeout`` (15 s by default).

TLS: with a :class:`~llmgw.config.TlsConfig` the listener requires client
certificates signed by ``client_ca`` (mTLS) and reports the certificate's common
name (else its first subject alternative name) as ``peer_identity``; without TLS
the port is plaintext and the listener says so loudly at start. On the connector,
``tls.cert``/``tls.key`` are the agent's certificate and ``tls.client_ca`` is the
CA that signed the *server's* certificate (None: the system's roots).

Modules: :mod:`~llmgw.transport.grpc.stream` (one stream, both loops, and the ends
trio sees), :mod:`~llmgw.transport.grpc.server` (the listener),
:mod:`~llmgw.transport.grpc.agent` (the connector).
"""

from __future__ import annotations

import typing

from llmgw.transport.grpc.agent import GrpcConnector
from llmgw.transport.grpc.server import GrpcListener
from llmgw.transport.grpc.stream import (
    CLOSE_GRACE,
    METHOD,
    SERVICE_NAME,
    STOP_GRACE,
    GrpcAgentConnection,
    GrpcServerConnection,
    Keepalive,
)

__all__ = [
    "CLOSE_GRACE",
    "METHOD",
    "SERVICE_NAME",
    "STOP_GRACE",
    "GrpcAgentConnection",
    "GrpcConnector",
    "GrpcListener",
    "GrpcServerConnection",
    "Keepalive",
]


if typing.TYPE_CHECKING:
    # mypy proves these implement the Protocols of llmgw.transport.base.
    from llmgw.transport import base

    def _conforms(
        listener: GrpcListener,
        connector: GrpcConnector,
        agent_end: GrpcAgentConnection,
        server_end: GrpcServerConnection,
    ) -> None:
        _listener: base.AgentListener = listener
        _connector: base.AgentConnector = connector
        _agent_end: base.AgentConnection = agent_end
        _server_end: base.ServerConnection = server_end
