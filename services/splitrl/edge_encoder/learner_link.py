"""The edge's end of the `learner-encoder` link: dial the learner, say hello, answer its training requests.

The edge dials out (it sits behind NAT) and keeps redialling while the service
runs, so a learner that starts late or restarts is picked up. A malformed
request is logged, counted in `splitrl_rejected_requests_total` and answered as
"nothing applied"; it never stops the edge.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

import grpc

from splitrl.core import rpc, wire
from splitrl.core.backoff import Backoff
from splitrl.core.config import TransportSettings
from splitrl.core.link_meter import LinkMeter
from splitrl.core.metrics import Metrics
from splitrl.core.redial import FAILURES, Redial
from splitrl.core.rpc import BadRequest
from splitrl.core.step_ids import unpack_step_ids
from splitrl.edge_encoder.training import EncoderTrainer
from splitrl.v1 import training_pb2, training_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
METHOD = "/splitrl.v1.EncoderTraining/Train"


#: A failed torch step (RuntimeError) also starts the link over.
LINK_FAILURES: tuple[type[BaseException], ...] = (*FAILURES, RuntimeError)


class RefusedByLearner(ValueError):
    """The learner refused this edge (e.g. another encoder width): redialling cannot help."""


class LearnerLink:
    """One Train stream at a time; its torch calls run on `compute`, the edge's training thread (acting has its
    own)."""

    def __init__(
        self,
        address: str,
        trainer: EncoderTrainer,
        *,
        step_id_prefix: int,
        edge_id: str,
        metrics: Metrics,
        compute: Executor,
        transport: TransportSettings,
        backoff: Backoff,
    ) -> None:
        self.address = address
        self.trainer = trainer
        self.step_id_prefix = step_id_prefix
        self.edge_id = edge_id
        self.metrics = metrics
        self.meter = LinkMeter(metrics, "learner-encoder")
        self.compute = compute
        self.transport = transport  # this edge's TLS settings, for dialling the learner
        # Between redials; reset once a stream is open. A refusal (e.g. a width mismatch) ends the link.
        self.redial = Redial("learner", backoff, metrics, refused=self._refused)

    async def run(self) -> None:
        """Serve the learner until cancelled, redialling with backoff when the stream ends."""
        while True:
            try:
                async with rpc.dial(self.address, self.transport, wan=True) as channel:
                    await channel.channel_ready()  # no hello is counted as sent to a learner that is not there
                    await self._serve(training_pb2_grpc.EncoderTrainingStub(channel).Train())
                error: BaseException = ConnectionError("the learner ended the training stream")
            except LINK_FAILURES as failure:
                error = failure
            finally:
                await self._on_compute(self.trainer.forget_pending)
            await self.redial.lost(error, f"training stream to learner {self.address}")

    def _refused(self, error: grpc.aio.AioRpcError) -> Exception:
        return RefusedByLearner(f"learner {self.address} refused this edge: {error.details()}")

    async def _serve(self, call: grpc.aio.StreamStreamCall) -> None:
        hello = training_pb2.EdgeMessage(
            hello=training_pb2.EdgeHello(
                step_id_prefix=self.step_id_prefix,
                encoder_version=self.trainer.version,
                edge_id=self.edge_id,
                width=self.trainer.encoder.width,
            )
        )
        self.meter.sent(hello, phase="training", payload="request")
        await call.write(hello)
        log.info("training stream to learner %s open", self.address)
        self.redial.answered()  # the learner took the hello: this connection works
        async for message in call:
            reply = await self._answer(message)
            await call.write(reply)

    async def _answer(self, message: training_pb2.LearnerMessage) -> training_pb2.EdgeMessage:
        kind = message.WhichOneof("kind")
        if kind == "activation_request":
            self.meter.received(message, phase="training", payload="request")
            request = message.activation_request
            try:
                activations = await self._on_compute(lambda: self.trainer.activations(request))
            except (BadRequest, wire.WireError) as error:
                self._reject(error)
                activations = training_pb2.Activations(request_id=request.request_id, missing_step_ids=_named(request))
            reply = training_pb2.EdgeMessage(activations=activations)
            self.meter.sent(reply, phase="training", payload="activation")
            return reply
        if kind == "gradients":
            self.meter.received(message, phase="training", payload="gradient")
            gradients = message.gradients
            try:
                applied = await self._on_compute(lambda: self.trainer.apply(gradients))
            except (BadRequest, wire.WireError) as error:
                self._reject(error)
                applied = training_pb2.GradientsApplied(
                    request_id=gradients.request_id,
                    encoder_version=self.trainer.version,
                    unknown_step_ids=max(len(_named(gradients)), _rows(gradients.gradients)),
                )
            reply = training_pb2.EdgeMessage(applied=applied)
            self.meter.sent(reply, phase="training", payload="ack")
            return reply
        raise ConnectionError(f"learner sent a message of no known kind ({kind!r})")

    def _reject(self, error: Exception) -> None:
        log.warning("refused a learner request: %s", error)
        self.metrics.rejected_requests.labels(method=METHOD, code="INVALID_ARGUMENT").inc()

    async def _on_compute(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.compute, fn)


def _rows(tensor: wire.Tensor) -> int:
    """Leading dimension of a tensor as declared (0 if it has none); used only to report what was skipped."""
    return int(tensor.shape[0]) if len(tensor.shape) else 0


def _named(request: training_pb2.ActivationRequest | training_pb2.EncoderGradients) -> list[int]:
    """The step ids a refused request named, to report them missing; none if it names none or they are malformed."""
    if not request.HasField("steps"):
        return []
    try:
        return unpack_step_ids(request.steps)
    except BadRequest:
        return []
