"""The server side of the gRPC transport: :class:`GrpcListener` and the servicer that
hands each agent's stream to trio.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import urllib.parse
from collections.abc import Callable
from typing import Any

import attrs
import grpc
import grpc.aio
import trio

from llmgw import units
from llmgw.config import TlsConfig
from llmgw.transport import grpc_bridge as bridge
from llmgw.transport import limits
from llmgw.transport.base import AgentHandler, ConnectionClosed
from llmgw.transport.grpc.stream import (
    CLOSE_GRACE,
    EOF_SETTLE,
    SERVICE_NAME,
    STOP_GRACE,
    GrpcAgentConnection,
    Keepalive,
    _decode_agent_message,
    _read,
    _Stream,
)
from llmgw.transport.messages import AgentMessage
from llmgw.transport.pb import agent_pb2 as pb

log = logging.getLogger("llmgw.transport.grpc")


def _peer_identity(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The verified client certificate's CN, else its first SAN; None without TLS."""
    auth = {key: list(values) for key, values in context.auth_context().items()}
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth.get(key, ()):
            if value:  # a certificate without a CN reports an empty one
                return value.decode("utf-8", "replace")
    return None


def _peer_host(peer: str) -> str | None:
    """The IP address in grpc's peer string (``ipv4:10.0.0.5:43210``,
    ``ipv6:[::1]:43210``, brackets maybe %-encoded); an IPv4-mapped IPv6 address as IPv4.
    None for anything else (a Unix socket)."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    if kind == "ipv4":
        host = rest.rpartition(":")[0]
    elif kind == "ipv6":
        host = rest.rpartition(":")[0].strip("[]")
    else:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


class _Servicer:
    """``AgentService.Connect`` on the asyncio thread: hands each stream to trio."""

    def __init__(self, token: trio.lowlevel.TrioToken, accept: Callable[[_Accepted], None]) -> None:
        self._token = token
        self._accept = accept

    async def connect(
        self,
        request_iterator: object,
        context: grpc.aio.ServicerContext[pb.ConnectRequest, pb.ConnectResponse],
    ) -> None:
        identity = _peer_identity(context)
        peer = context.peer()
        label = f"agent {identity} at {peer}" if identity else f"agent at {peer}"
        stream = _Stream(self._token, label, _decode_agent_message, eof_settle=EOF_SETTLE)
        # Headers now, so a client knows its stream was accepted before any message.
        await context.send_initial_metadata(())
        accepted = _Accepted(stream, identity, _peer_host(peer))
        if not bridge.wake_trio(self._token, lambda: self._accept(accepted)):
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details("the server is stopping")
            return
        await stream.run_server(context)


@attrs.frozen
class _Accepted:
    stream: _Stream[AgentMessage]
    identity: str | None
    address: str | None  # the peer's IP address


def _bind_target(address: str) -> str:
    parsed = units.parse_address(address)
    host = parsed.host or "[::]"  # every interface, IPv6 and IPv4
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{parsed.port}"


async def _check_bindable(address: str) -> None:
    """Bind `address` as the gRPC server is about to, and let go at once, raising the
    OSError a bind meets ("cannot listen on 127.0.0.1:7443: address already in use").

    grpc's own failure says only "Failed to bind" (and its C core logs a line of its
    own to stderr), so without this the operator does not learn why. A race with
    another process in between only brings back grpc's vaguer message."""
    parsed = units.parse_address(address)
    if parsed.port == 0:
        return  # the kernel picks a free port: nothing to collide with
    try:
        infos = await trio.socket.getaddrinfo(
            parsed.bind_host, parsed.port, type=trio.socket.SOCK_STREAM
        )
        family, kind, proto, _, sockaddr = infos[0]
        with trio.socket.socket(family, kind, proto) as sock:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)  # as grpc
            await sock.bind(sockaddr)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        reason = reason[:1].lower() + reason[1:]
        raise OSError(exc.errno, f"cannot listen on {address}: {reason}") from None


async def _start_server(
    servicer: _Servicer,
    target: str,
    credentials: grpc.ServerCredentials | None,
    options: list[tuple[str, int]],
) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=options)
    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Connect": grpc.stream_stream_rpc_method_handler(
                servicer.connect,
                request_deserializer=pb.ConnectRequest.FromString,
                response_serializer=pb.ConnectResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    try:
        if credentials is None:
            port = server.add_insecure_port(target)
        else:
            port = server.add_secure_port(target, credentials)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {target}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {target}")
    await server.start()
    return server, port


async def _stop_server(server: grpc.aio.Server, grace: float) -> None:
    await server.stop(grace)


class GrpcListener:
    """The server side of the gRPC transport (a base.AgentListener).

    ``address`` is ``HOST:PORT`` or ``:PORT`` (every interface); port 0 picks a free
    port, readable as ``port`` (and in ``addresses``) once ``serve`` has reported
    started.
    """

    def __init__(
        self,
        address: str,
        *,
        tls: TlsConfig | None = None,
        keepalive: Keepalive = Keepalive(),
    ) -> None:
        if tls is not None and tls.client_ca is None:
            raise ValueError(
                "agent TLS needs client_ca: the agent port requires client certificates "
                "signed by it (mTLS)"
            )
        self.address = address
        self.tls = tls
        self.keepalive = keepalive
        self.port: int | None = None
        # Referenced while serving: a grpc.aio.Server stops when garbage-collected.
        self._server: grpc.aio.Server | None = None

    @property
    def addresses(self) -> list[str]:
        """Where it listens once ``serve`` has reported started, as ``HOST:PORT`` with
        the bound port (``[::]:PORT`` for every interface); empty before."""
        if self.port is None:
            return []
        host = units.parse_address(self.address).host or "::"
        return [str(units.Address(host, self.port))]

    def _credentials(self) -> grpc.ServerCredentials | None:
        if self.tls is None:
            return None
        assert self.tls.client_ca is not None  # checked in __init__
        return grpc.ssl_server_credentials(
            [(_read(self.tls.key), _read(self.tls.cert))],
            root_certificates=_read(self.tls.client_ca),
            require_client_auth=True,
        )

    async def serve(
        self,
        handler: AgentHandler,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        token = trio.lowlevel.current_trio_token()
        accept_tx, accept_rx = trio.open_memory_channel[_Accepted](math.inf)
        streams: set[_Stream[AgentMessage]] = set()

        def accept(accepted: _Accepted) -> None:  # on the trio thread
            try:
                accept_tx.send_nowait(accepted)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                accepted.stream.shut("the server is stopping")
                return
            stream = accepted.stream
            streams.add(stream)
            stream.on_finished = lambda: streams.discard(stream)

        await _check_bindable(self.address)
        target = _bind_target(self.address)
        server, port = await bridge.run(
            _start_server,
            _Servicer(token, accept),
            target,
            self._credentials(),
            [
                *self.keepalive.server_options(),
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", limits.MAX_MESSAGE_BYTES),
            ],
            discard=lambda started: bridge.spawn(started[0].stop(None)),
        )
        self._server, self.port = server, port
        if self.tls is None:
            log.warning(
                "agent port %s (port %d) is PLAINTEXT: no TLS, no client certificates; any "
                "host that reaches it can claim any node id. Set agent_tls (cert, key, "
                "client_ca) to require client certificates.",
                self.address,
                port,
            )
        else:
            log.info(
                "agent port %s (port %d): mTLS, client certificates required", self.address, port
            )
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for accepted in accept_rx:
                    nursery.start_soon(self._handle, handler, accepted)
        finally:
            accept_tx.close()
            while True:  # accepted as we stopped; never reached a handler
                try:
                    accept_rx.receive_nowait().stream.shut("the server is stopping")
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            with trio.CancelScope(shield=True):
                with trio.move_on_after(STOP_GRACE + 5.0):
                    await bridge.run(_stop_server, server, STOP_GRACE)
                # Every stream has ended by now; wait for their asyncio sides to finish.
                with trio.move_on_after(CLOSE_GRACE + 1.0):
                    for stream in list(streams):
                        await stream.finished.wait()
            self._server = None

    async def _handle(self, handler: AgentHandler, accepted: _Accepted) -> None:
        stream = accepted.stream
        try:
            await handler(GrpcAgentConnection(stream, accepted.identity, accepted.address))
        except* ConnectionClosed:
            pass  # the usual way an agent's stream ends; other errors are the handler's bugs
        finally:
            stream.close_soon(f"{stream.label}: closed by the server")
