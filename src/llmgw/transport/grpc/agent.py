"""The agent side of the gRPC transport: :class:`GrpcConnector`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import grpc.aio
import trio

from llmgw.config import TlsConfig
from llmgw.transport import grpc_bridge as bridge
from llmgw.transport.base import ConnectFailed
from llmgw.transport.grpc.stream import (
    CONNECT_TIMEOUT,
    METHOD,
    GrpcServerConnection,
    Keepalive,
    _decode_server_message,
    _read,
    _Stream,
)
from llmgw.transport.messages import ServerMessage
from llmgw.transport.pb import agent_pb2 as pb


def _connect_failure(target: str, exc: grpc.aio.AioRpcError, tls: bool) -> ConnectFailed:
    details = exc.details() or ""
    text = details.lower()
    if "connection refused" in text:
        why = "connection refused"
    elif any(m in text for m in ("errors resolving", "dns resolution", "domain name not found")):
        why = "cannot resolve the host name"
    elif "certificate_verify_failed" in text or "certificate verify failed" in text:
        why = "certificate verify failed: the server's certificate is not signed by our CA"
    elif "hostname verification" in text or "not in peer certificate" in text:
        why = "certificate verify failed: the server's certificate does not name this host"
    elif "wrong_version_number" in text or "handshake failed" in text:
        why = "TLS handshake failed (does the server speak TLS?)" if tls else "handshake failed"
    elif "socket closed" in text or "connection reset" in text:
        why = (
            "the server closed the connection during the TLS handshake: it refused our "
            "client certificate (not signed by its client CA?) or does not speak TLS"
            if tls
            else "the server closed the connection: does it require TLS?"
        )
    else:
        why = exc.code().name
    return ConnectFailed(f"cannot connect to {target}: {why} [{exc.code().name}: {details}]")


class GrpcConnector:
    """The agent side of the gRPC transport (a base.AgentConnector).

    ``address`` is any gRPC target (``host:port``). Each ``connect()`` opens its
    own channel (its own TCP connection), so a reconnect never reuses a broken one.
    ``server_name`` overrides the name checked against the server's certificate.
    """

    def __init__(
        self,
        address: str,
        *,
        tls: TlsConfig | None = None,
        node_id: str | None = None,
        keepalive: Keepalive = Keepalive(),
        connect_timeout: float = CONNECT_TIMEOUT,
        server_name: str | None = None,
    ) -> None:
        self.address = address
        self.tls = tls
        self.node_id = node_id
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self.server_name = server_name

    def _credentials(self) -> grpc.ChannelCredentials | None:
        if self.tls is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls.client_ca) if self.tls.client_ca else None,
            private_key=_read(self.tls.key),
            certificate_chain=_read(self.tls.cert),
        )

    def _options(self) -> list[tuple[str, int | str]]:
        options: list[tuple[str, int | str]] = [
            *self.keepalive.client_options(),
            # A channel of its own: not a subchannel shared with other connectors.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self.server_name is not None:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return options

    async def _open(
        self, stream: _Stream[ServerMessage], credentials: grpc.ChannelCredentials | None
    ) -> None:
        target = self.address
        options = self._options()
        if credentials is None:
            channel = grpc.aio.insecure_channel(target, options=options)
        else:
            channel = grpc.aio.secure_channel(target, credentials, options=options)
        call: grpc.aio.StreamStreamCall[Any, pb.ConnectResponse] = channel.stream_stream(
            METHOD,
            request_serializer=pb.ConnectRequest.SerializeToString,
            response_deserializer=pb.ConnectResponse.FromString,
        )(wait_for_ready=False)
        try:
            async with asyncio.timeout(self.connect_timeout):
                # Returns once the stream's headers went out on a ready connection
                # (TCP and TLS, client certificate accepted); fails as the connect does.
                await call.wait_for_connection()
        except BaseException as exc:
            call.cancel()
            await channel.close()
            if isinstance(exc, grpc.aio.AioRpcError):
                raise _connect_failure(target, exc, credentials is not None) from None
            if isinstance(exc, TimeoutError):
                raise ConnectFailed(
                    f"cannot connect to {target}: timed out after {self.connect_timeout:g}s"
                ) from None
            raise
        bridge.spawn(stream.run_client(channel, call))

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[GrpcServerConnection]:
        token = trio.lowlevel.current_trio_token()
        credentials = self._credentials()
        label = f"{self.node_id or 'agent'} to {self.address}"
        stream = _Stream(token, label, _decode_server_message)
        await bridge.run(
            self._open, stream, credentials, discard=lambda _: stream.shut("connect abandoned")
        )
        connection = GrpcServerConnection(stream)
        try:
            yield connection
        finally:
            await connection.aclose()
