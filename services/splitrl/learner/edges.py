"""The learner's end of the `learner-encoder` link: every connected edge's Train stream.

Edges dial in and say hello with the prefix their step ids carry; the trainer
(which runs on its own thread) then asks for activations and hands back
gradients through the blocking methods of `EdgeLinks`, which route each step id
to the edge whose prefix it carries. Steps of an edge that is not connected,
or that the edge no longer holds, come back as missing rows: the trainer skips
them, nothing fails.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import grpc
import torch

from splitrl.core import authz, wire
from splitrl.core.config import FloatCodec
from splitrl.core.link_meter import LinkMeter
from splitrl.core.metrics import Metrics, Payload
from splitrl.core.rpc import BadRequest, Busy
from splitrl.core.step_ids import MAX_PREFIX, pack_step_ids, prefix_of
from splitrl.core.tasks import first_done
from splitrl.learner.settings import EDGE_REPLY_TIMEOUT_S
from splitrl.v1 import tensor_pb2, training_pb2, training_pb2_grpc

log = logging.getLogger(__name__)
#: Split-accumulate gradients waiting to be written to one edge before the trainer blocks (backpressure).
MAX_QUEUED_MESSAGES = 64
#: How much later than the edges' deadline the trainer's thread stops waiting on the event loop itself.
LOOP_SLACK_S = 5.0


@dataclass
class _Edge:
    prefix: int
    edge_id: str
    encoder_version: int
    outgoing: asyncio.Queue[training_pb2.LearnerMessage]
    pending: dict[int, asyncio.Future[training_pb2.EdgeMessage]] = field(default_factory=dict)
    gone: asyncio.Event = field(default_factory=asyncio.Event)

    def disconnect(self) -> None:
        """Fail everything waiting on this edge: answers it will never send, and room in its queue."""
        self.gone.set()
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ConnectionError(f"edge {self.edge_id} disconnected"))


def request_id_of(message: training_pb2.LearnerMessage) -> int:
    """The request id a LearnerMessage carries, whichever kind it is."""
    kind = message.WhichOneof("kind")
    return int(getattr(message, kind).request_id)


@dataclass
class Ticket:
    """Which rows of a minibatch each edge answered, so their gradients can go back to the same graphs."""

    parts: list[tuple[int, int, torch.Tensor]]  # (prefix, request_id, row positions in the minibatch)


class EdgeLinks(training_pb2_grpc.EncoderTrainingServicer):
    """Connected edges by step-id prefix. gRPC side runs on the event loop; trainer side blocks its own thread."""

    service_name = training_pb2.DESCRIPTOR.services_by_name["EncoderTraining"].full_name

    def __init__(
        self,
        metrics: Metrics,
        width: int,
        *,
        max_encoder_lag: int,
        gradient_codec: FloatCodec = "bf16",
        activation_bound: float | None = None,
    ) -> None:
        """`activation_bound`: edges' activations beyond this magnitude are refused (EnvSettings.activation_bound)."""
        self.metrics = metrics
        self.activation_bound = activation_bound
        self.gradient_codec: FloatCodec = gradient_codec
        self.meter = LinkMeter(metrics, "learner-encoder")
        self.width = width
        self.max_encoder_lag = max_encoder_lag
        self._edges: dict[int, _Edge] = {}
        self.prefixes = authz.Claims("step-id prefix")
        self._request_ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.connected = asyncio.Event()

    def close(self) -> None:
        """From now on every trainer-side call returns at once as if no edge were connected (thread-safe)."""
        self._closed = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._disconnect_all)

    def _disconnect_all(self) -> None:
        for edge in list(self._edges.values()):
            edge.disconnect()

    # -- gRPC side (event loop) -------------------------------------------------------------------

    async def Train(
        self, request_iterator: AsyncIterator[training_pb2.EdgeMessage], context: grpc.aio.ServicerContext
    ) -> None:
        self._loop = asyncio.get_running_loop()
        edge = await self._accept_hello(request_iterator, authz.peer_identity(context))
        self._edges[edge.prefix] = edge
        self.connected.set()
        log.info("edge %s connected (prefix %d, encoder version %d)", edge.edge_id, edge.prefix, edge.encoder_version)
        reader = asyncio.create_task(self._read(edge, request_iterator))
        try:
            while not reader.done():
                getter = await first_done(reader, edge.outgoing.get())
                if getter is None:
                    break
                message = getter.result()
                payload: Payload = "request" if message.WhichOneof("kind") == "activation_request" else "gradient"
                self.meter.sent(message, phase="training", payload=payload)
                await context.write(message)
            await reader  # re-raises a bad message from the edge as this call's status
        finally:
            reader.cancel()
            del self._edges[edge.prefix]
            if not self._edges:
                self.connected.clear()
            edge.disconnect()
            log.info("edge %s disconnected", edge.edge_id)

    async def _accept_hello(
        self, request_iterator: AsyncIterator[training_pb2.EdgeMessage], identity: authz.Identity | None
    ) -> _Edge:
        """The edge a Train stream's hello announces. Under mutual TLS the edge is named by its certificate
        (the hello's edge_id only joins the log line), and its step-id prefix must be its own (authz.Claims)."""
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "hello":
            raise BadRequest("the first EdgeMessage of a Train stream must be a hello")
        self.meter.received(first, phase="training", payload="request")
        hello = first.hello
        if not 1 <= hello.step_id_prefix < MAX_PREFIX:
            raise BadRequest(f"EdgeHello.step_id_prefix must be in [1, {MAX_PREFIX}), got {hello.step_id_prefix}")
        if hello.width != self.width:
            raise BadRequest(f"EdgeHello.width is {hello.width}; this learner trains width {self.width}")
        self.prefixes.claim(hello.step_id_prefix, identity)
        if hello.step_id_prefix in self._edges:
            # Busy, not a refusal: a restarted edge may redial before its old stream is noticed gone.
            raise Busy(f"an edge with step-id prefix {hello.step_id_prefix} is already connected")
        name = hello.edge_id if identity is None else f"{identity} (announced as {hello.edge_id!r})"
        return _Edge(hello.step_id_prefix, name, hello.encoder_version, asyncio.Queue(MAX_QUEUED_MESSAGES))

    async def _read(self, edge: _Edge, request_iterator: AsyncIterator[training_pb2.EdgeMessage]) -> None:
        async for message in request_iterator:
            kind = message.WhichOneof("kind")
            if kind == "activations":
                self.meter.received(message, phase="training", payload="activation")
                request_id = message.activations.request_id
            elif kind == "applied":
                self.meter.received(message, phase="training", payload="ack")
                request_id = message.applied.request_id
                edge.encoder_version = max(edge.encoder_version, message.applied.encoder_version)
            else:
                raise BadRequest(f"unexpected EdgeMessage kind {kind!r} after the hello")
            future = edge.pending.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(message)

    async def _send(
        self, prefix: int, message: training_pb2.LearnerMessage, wait: bool
    ) -> training_pb2.EdgeMessage | None:
        edge = self._edges.get(prefix)
        if edge is None:
            raise ConnectionError(f"no edge with step-id prefix {prefix} is connected")
        future: asyncio.Future[training_pb2.EdgeMessage] | None = None
        if wait:
            future = asyncio.get_running_loop().create_future()
            edge.pending[request_id_of(message)] = future
        putter = asyncio.create_task(edge.outgoing.put(message))
        gone = asyncio.create_task(edge.gone.wait())
        try:
            await asyncio.wait({putter, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # cancelled or not, no task is left behind waiting on the queue or the event
            putter.cancel()
            gone.cancel()
        if edge.gone.is_set():
            raise ConnectionError(f"edge {edge.edge_id} disconnected")
        return None if future is None else await future

    # -- trainer side (its own thread; blocks until the edge answers) ----------------------------------

    def fetch_activations(self, step_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Ticket]:
        """Split: fresh activations float32 [n, width] for int64 [n] step ids, and which rows came back (bool [n])."""
        activations = torch.zeros((len(step_ids), self.width))
        present = torch.zeros(len(step_ids), dtype=torch.bool)
        ticket = Ticket([])
        by_prefix = self._by_prefix(step_ids)
        ids_by_prefix = {prefix: step_ids[positions].tolist() for prefix, positions in by_prefix.items()}
        requests = {
            prefix: training_pb2.LearnerMessage(
                activation_request=training_pb2.ActivationRequest(
                    request_id=next(self._request_ids), steps=pack_step_ids(ids)
                )
            )
            for prefix, ids in ids_by_prefix.items()
        }
        replies = self._call(requests, wait=True)
        for prefix, positions in by_prefix.items():
            ids, reply = ids_by_prefix[prefix], replies[prefix]
            if reply is None:
                self.metrics.unknown_step_ids.labels(request="no-edge").inc(len(ids))
                continue
            missing = set(reply.activations.missing_step_ids)
            answered = positions[torch.tensor([i not in missing for i in ids], dtype=torch.bool)]
            try:
                rows = wire.decode_float(
                    reply.activations.activations,
                    expect_shape=[len(answered), self.width],
                    max_magnitude=self.activation_bound,
                )
            except wire.WireError as error:
                log.warning("edge prefix %d sent unusable activations (%s); rows skipped", prefix, error)
                continue
            activations[answered] = rows.float()
            present[answered] = True
            if len(answered):
                ticket.parts.append((prefix, request_id_of(requests[prefix]), answered))
        return activations, present, ticket

    def return_gradients(self, ticket: Ticket, gradients: torch.Tensor, learning_rate_scale: float) -> None:
        """Split: send d(loss)/d(activations) [n, width] for the ticket's rows down; wait until applied. The
        edges step at `learning_rate_scale` times their encoder learning rate."""
        self._call(
            {
                prefix: self._gradients_message(
                    request_id, wire.encode_float(gradients[positions], self.gradient_codec), learning_rate_scale
                )
                for prefix, request_id, positions in ticket.parts
            },
            wait=True,
        )

    def push_gradients(
        self,
        step_ids: torch.Tensor,
        encoder_versions: torch.Tensor,
        gradients: torch.Tensor,
        learning_rate_scale: float,
    ) -> None:
        """Split-accumulate: send gradients of stored activations down without waiting for the edge, to step at
        `learning_rate_scale` times its encoder learning rate.

        Rows more than `max_encoder_lag` encoder versions behind their edge are dropped (and counted):
        their gradient was taken at an activation the edge's encoder no longer produces.
        """
        pushes = {}
        for prefix, positions in self._by_prefix(step_ids).items():
            edge = self._edges.get(prefix)
            if edge is None:
                self.metrics.unknown_step_ids.labels(request="no-edge").inc(len(positions))
                continue
            lags = edge.encoder_version - encoder_versions[positions]
            for lag in lags.tolist():
                self.metrics.encoder_lag.observe(max(lag, 0))
            fresh = positions[lags <= self.max_encoder_lag]
            if len(fresh) < len(positions):
                self.metrics.stale_activations_dropped.inc(len(positions) - len(fresh))
            if len(fresh) == 0:
                continue
            pushes[prefix] = self._gradients_message(
                next(self._request_ids),
                wire.encode_float(gradients[fresh], self.gradient_codec),
                learning_rate_scale,
                steps=pack_step_ids(step_ids[fresh].tolist()),
            )
        self._call(pushes, wait=False)

    @staticmethod
    def _gradients_message(
        request_id: int,
        gradients: tensor_pb2.Tensor,
        learning_rate_scale: float,
        steps: training_pb2.StepIds | None = None,
    ) -> training_pb2.LearnerMessage:
        """An EncoderGradients message; the scale is left unset at 1 (the edge's default), which saves its bytes
        in every run without a learning-rate schedule."""
        message = training_pb2.EncoderGradients(request_id=request_id, gradients=gradients, steps=steps)
        if learning_rate_scale != 1.0:
            message.learning_rate_scale = learning_rate_scale
        return training_pb2.LearnerMessage(gradients=message)

    def _by_prefix(self, step_ids: torch.Tensor) -> dict[int, torch.Tensor]:
        """Positions of `step_ids` per issuing edge's prefix, in ascending id order (so they pack small)."""
        prefixes = prefix_of(step_ids)
        by_prefix = {}
        for prefix in prefixes.unique().tolist():
            positions = (prefixes == prefix).nonzero().squeeze(1)
            by_prefix[int(prefix)] = positions[step_ids[positions].argsort()]
        return by_prefix

    def _call(
        self, messages: dict[int, training_pb2.LearnerMessage], *, wait: bool
    ) -> dict[int, training_pb2.EdgeMessage | None]:
        """Send each edge (by prefix) its message, all at once, from the trainer's thread; with `wait`, return
        each edge's answer. One deadline for them all, EDGE_REPLY_TIMEOUT_S: however many edges are slow, a
        call waits that long at most (data-parallel ranks wait in a collective meanwhile). An edge that is
        gone or did not answer in time maps to None."""
        unanswered: dict[int, training_pb2.EdgeMessage | None] = dict.fromkeys(messages)
        if not messages or self._loop is None or self._closed:
            return unanswered  # nothing to send, no edge has ever connected, or the learner is stopping
        future = asyncio.run_coroutine_threadsafe(self._send_all(messages, wait), self._loop)
        try:
            return future.result(EDGE_REPLY_TIMEOUT_S + LOOP_SLACK_S)
        except FutureTimeout:  # the event loop itself is stuck or gone
            future.cancel()
            log.warning("training requests to edge prefixes %s got no answer from the event loop", sorted(messages))
            return unanswered

    async def _send_all(
        self, messages: dict[int, training_pb2.LearnerMessage], wait: bool
    ) -> dict[int, training_pb2.EdgeMessage | None]:
        async def send(prefix: int, message: training_pb2.LearnerMessage) -> training_pb2.EdgeMessage | None:
            request_id = request_id_of(message)
            try:
                return await asyncio.wait_for(self._send(prefix, message, wait), EDGE_REPLY_TIMEOUT_S)
            except (ConnectionError, TimeoutError) as error:
                reason = error or f"no answer in {EDGE_REPLY_TIMEOUT_S:g} s"
                log.warning("training request %d to edge prefix %d failed: %s", request_id, prefix, reason)
                return None

        answers = await asyncio.gather(*(send(prefix, message) for prefix, message in messages.items()))
        return dict(zip(messages, answers, strict=True))

    @property
    def edge_count(self) -> int:
        return len(self._edges)
