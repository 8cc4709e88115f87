"""gRPC plumbing shared by every service: servers, channels, error mapping.

Message-size limits are explicit on both ends. Bad input is mapped to
INVALID_ARGUMENT in one interceptor, so servicers raise `BadRequest` (or let
wire.WireError escape) and the server keeps serving other calls.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from splitrl.core import authz, security
from splitrl.core.config import TransportSettings
from splitrl.core.metrics import Metrics
from splitrl.core.wire import WireError

log = logging.getLogger(__name__)

#: Largest message either end accepts or sends (bytes). A 256-env stack-bf16
#: step is ~19 MB; replay batches are bounded by the learner's batch size.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: Each HTTP/2 stream's flow-control window on a WAN link (bytes), fixed: gRPC's bandwidth probing is off there.
WAN_WINDOW_BYTES = 8 * 1024 * 1024
#: Both ends of each WAN link (the edge-encoder's dials, and the servers edges dial: inference, learner).
#: gRPC sizes its windows by probing the bandwidth-delay product with PINGs, each answered by a PING ack,
#: mostly in packets of their own: on the edge's small lockstep messages they are a large share of the WAN's
#: packets and a tenth or so of its kernel bytes (`splitrl bench framing` measures them).
#: A fixed 8 MiB window lets any message up to that size cross in one round trip, and a larger one after window
#: updates. Links inside the cloud or the edge keep the probing: large messages on loopback stream faster with
#: it (`splitrl bench throughput --link-wan`), and their packets cost nothing. One exception:
#: the learner's weights reach inference on inference's (WAN) server, so that cloud link has the fixed window
#: too (one weights message per update, well under 8 MiB at the recipe's sizes).
WAN_FLOW_CONTROL: Sequence[tuple[str, Any]] = (
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", WAN_WINDOW_BYTES),
)

CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC's own reconnect backoff (default up to 120 s) must not outlast ours (core/backoff.py, a few s):
    # a restarted peer is then reached within about 2 s of coming back.
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)
SERVER_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    # Servers ping too, so a dead client (an edge that lost power) is detected and its stream state freed.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.so_reuseport", 0),
)


def channel_options(*, wan: bool) -> list[tuple[str, Any]]:
    """A client channel's options: splitrl's limits and keepalives, and on a WAN link the fixed window."""
    return [*CHANNEL_OPTIONS, *(WAN_FLOW_CONTROL if wan else ())]


def server_options(*, wan: bool) -> list[tuple[str, Any]]:
    """A server's options: splitrl's limits and keepalives, and for a server edges dial the fixed window."""
    return [*SERVER_OPTIONS, *(WAN_FLOW_CONTROL if wan else ())]


class BadRequest(ValueError):
    """A request the server refuses (INVALID_ARGUMENT); the message is shown to the caller."""


class Refused(Exception):
    """A request that is well-formed but that this server will not serve (FAILED_PRECONDITION: another mode or
    codec); the caller gives up (core.redial)."""


class Busy(Exception):
    """A request this server cannot serve yet (ABORTED); the caller dials again after its backoff (core.redial)."""


class UpstreamFailed(Exception):
    """A call this service made on a caller's behalf failed; the caller gets the same status."""

    def __init__(self, peer: str, error: grpc.aio.AioRpcError) -> None:
        super().__init__(f"{peer}: {error.details()}")
        self.code: grpc.StatusCode = error.code()


def _status_for(error: BaseException) -> grpc.StatusCode | None:
    if isinstance(error, UpstreamFailed):
        return error.code
    if isinstance(error, WireError | BadRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, Refused):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(error, Busy):
        return grpc.StatusCode.ABORTED
    if isinstance(error, authz.PermissionDenied):
        return grpc.StatusCode.PERMISSION_DENIED
    return None


def _strict_deserializer(deserialize: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any]:
    """`deserialize`, raising BadRequest (INVALID_ARGUMENT) for bytes that are not a valid protobuf message."""

    def parse(raw: bytes) -> Any:
        if deserialize is None:
            return raw
        try:
            return deserialize(raw)
        except DecodeError as error:
            raise BadRequest(f"{method} request is not a valid protobuf message ({len(raw)} bytes): {error}") from error

    return parse


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Turns BadRequest / WireError / Refused raised by a handler into a gRPC status, counted by method."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: gRPC answers UNIMPLEMENTED
            return None
        method = handler_call_details.method.rsplit("/", 1)[-1]
        parse = _strict_deserializer(handler.request_deserializer, method)
        if handler.unary_unary is not None:
            # gRPC answers UNKNOWN for a request its deserializer cannot parse before the handler runs:
            # the unary request arrives as bytes and is parsed inside the wrapper, where BadRequest is mapped.
            behaviour = handler.unary_unary
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(lambda raw, context: behaviour(parse(raw), context), method),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None and inspect.isasyncgenfunction(handler.stream_stream):
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(handler.stream_stream, method),
                request_deserializer=parse,  # runs as the handler iterates, so BadRequest reaches the wrapper
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None and inspect.iscoroutinefunction(handler.stream_stream):
            # A stream that answers with context.write (EncoderTraining.Train) is a coroutine, not a generator.
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_unary(handler.stream_stream, method),
                request_deserializer=parse,
                response_serializer=handler.response_serializer,
            )
        return handler

    async def _abort(self, context: grpc.aio.ServicerContext, method: str, error: Exception) -> None:
        code = _status_for(error)
        assert code is not None
        self._metrics.rejected_requests.labels(method=method, code=code.name).inc()
        log.warning("%s refused: %s: %s", method, code.name, error)
        await context.abort(code, str(error))

    def _wrap_unary(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await behaviour(request, context)
            except (WireError, BadRequest, Refused, Busy, UpstreamFailed, authz.PermissionDenied) as error:
                await self._abort(context, method, error)

        return wrapped

    def _wrap_stream(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        async def wrapped(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            self._metrics.streams_open.labels(method=method).inc()
            try:
                async for response in behaviour(request_iterator, context):
                    yield response
            except (WireError, BadRequest, Refused, Busy, UpstreamFailed, authz.PermissionDenied) as error:
                await self._abort(context, method, error)
            finally:
                self._metrics.streams_open.labels(method=method).dec()

        return wrapped


class CallTasks(grpc.aio.ServerInterceptor):
    """The asyncio tasks of a server's calls that are still running, so a stopping service can let them end.

    gRPC's `Server.stop` returns once gRPC's core holds no live call, but the Python task of a call whose
    peer has just gone can still be unwinding then. If the process's event loop closes first, asyncio cancels
    that task under gRPC's own wrapper, which prints "Exception not handled by _handle_exceptions" and a
    CancelledError traceback (for example a learner's Train call when services are stopped one by one).
    `intercept_service` runs in the call's own task, so that is the task noted.
    """

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return await continuation(handler_call_details)

    async def wait(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` seconds for every noted call to end; returns how many were still running."""
        still_running: set[asyncio.Task[Any]] = set()
        if self._running:
            _, still_running = await asyncio.wait(set(self._running), timeout=timeout_s)
        await asyncio.sleep(0)  # gRPC's wrapper task around each call resumes once the call's task is done
        return len(still_running)


async def create_server(
    metrics: Metrics,
    service_names: Sequence[str],
    token: str | None = None,
    *,
    wan: bool = False,
    roles: authz.RoleInterceptor | None = None,
    serve_reflection: bool = False,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, CallTasks]:
    """A grpc.aio server with health checking and error mapping; services are added by the caller.
    `wan`: edges dial it across the WAN (WAN_FLOW_CONTROL). The CallTasks are its calls still running.

    Health starts NOT_SERVING for every name; the caller flips it once ready. With a `token`, every call
    but health checks must carry it (security.BearerTokenInterceptor: the first interceptor that acts on a
    call, so no handler runs before it; CallTasks before it only notes the call's task). With `roles`, each
    call must then come from a role allowed to make it (authz.RoleInterceptor), before any request is parsed.
    Reflection is served only with `serve_reflection`.
    """
    calls = CallTasks()
    interceptors: list[grpc.aio.ServerInterceptor] = [calls]
    if token is not None:
        interceptors.append(security.BearerTokenInterceptor(token, metrics))
    if roles is not None:
        interceptors.append(roles)
    interceptors.append(ErrorMappingInterceptor(metrics))
    server = grpc.aio.server(interceptors=interceptors, options=server_options(wan=wan))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await set_serving(health_servicer, service_names, serving=False)
    if serve_reflection:
        reflection.enable_server_reflection((*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    return server, health_servicer, calls


async def set_serving(health_servicer: health.aio.HealthServicer, service_names: Sequence[str], serving: bool) -> None:
    """Set the health status of the server ("") and of each named service."""
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", *service_names):
        await health_servicer.set(name, status)


def dial(target: str, transport: TransportSettings, *, wan: bool = False) -> grpc.aio.Channel:
    """The one way a service opens a client channel: splitrl's limits and keepalives, secured as `transport` says.

    `transport` is the dialling process's own settings (its certificate, CA and token serve both directions).
    `wan`: the link crosses the WAN (the edge-encoder's dials): WAN_FLOW_CONTROL.
    """
    loaded = security.load(transport)
    options = [*channel_options(wan=wan), *loaded.channel_options()]
    credentials = loaded.channel_credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=loaded.client_interceptors())
    return grpc.aio.secure_channel(target, credentials, options=options)


def insecure_channel(target: str, *, wan: bool = False) -> grpc.aio.Channel:
    """A plaintext client channel with splitrl's limits, no token (tests and tools talking to plaintext servers)."""
    return grpc.aio.insecure_channel(target, options=channel_options(wan=wan))


async def exchange(call: grpc.aio.StreamStreamCall, request: Any, timeout_s: float, peer: str) -> Any:
    """Write `request` on a lockstep stream and return `peer`'s answer.

    Raises the call's status (AioRpcError) or ConnectionError if the peer ended the stream, and TimeoutError
    if no answer came within `timeout_s`: a peer that keeps the connection but stops answering is given up on.
    """
    await call.write(request)
    reply = await asyncio.wait_for(call.read(), timeout_s)
    if reply is grpc.aio.EOF:
        await raise_if_failed(call)
        raise ConnectionError(f"{peer} closed the stream")
    return reply


async def raise_if_failed(call: grpc.aio.Call) -> None:
    """Raise the ended `call`'s status as AioRpcError unless it is OK (a streaming call cannot be awaited for it)."""
    code = await call.code()
    if code != grpc.StatusCode.OK:
        raise grpc.aio.AioRpcError(
            code, await call.initial_metadata(), await call.trailing_metadata(), await call.details()
        )
