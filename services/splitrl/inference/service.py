"""Inference service: serves edge streams, batches them, acts, and records trajectories.

Per stream it validates each ActRequest against the configured mode, turns it
into policy input (decoding video per env, and stacking frames itself for the
`frame` and `video` codecs), submits it
to the shared Batcher, answers with actions, and feeds the TrajectoryCutter
whose chunks go to replay through the ReplayWriter.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
import torch

from splitrl.core import authz, codecs, weights, wire
from splitrl.core.backoff import Backoff
from splitrl.core.envs import action_spec_of
from splitrl.core.framestack import FrameStacker
from splitrl.core.link_meter import LinkMeter
from splitrl.core.lockstep import Carried, LockstepStream, RewardBook, StepIdCursor, episode_ends
from splitrl.core.metrics import Metrics
from splitrl.core.rpc import BadRequest, Refused
from splitrl.core.step_ids import prefix_of_id
from splitrl.core.trajectory import TrajectoryTensors
from splitrl.core.video import VideoDecodeError, VideoStreamDecoder
from splitrl.inference.batcher import Batcher
from splitrl.inference.policy import Decisions, Policy, PreparedWeights
from splitrl.inference.replay_writer import ReplayWriter
from splitrl.inference.settings import InferenceSettings
from splitrl.inference.trajectories import TrajectoryCutter
from splitrl.v1 import rollout_pb2, rollout_pb2_grpc, weights_pb2, weights_pb2_grpc

log = logging.getLogger(__name__)

#: Versions count the learner's updates; one at or above 2**53 (exact in a float64) cannot come from a run.
MAX_WEIGHTS_VERSION = 2**53


class InferenceService(rollout_pb2_grpc.InferenceServicer, weights_pb2_grpc.PolicyUpdatesServicer):
    """Central, batched inference for every edge stream; takes new weights from the learner in flight."""

    service_names: Sequence[str] = (
        rollout_pb2.DESCRIPTOR.services_by_name["Inference"].full_name,
        weights_pb2.DESCRIPTOR.services_by_name["PolicyUpdates"].full_name,
    )
    serves_wan = True  # edges' Act streams

    def __init__(self, settings: InferenceSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        # The observation codec matters only in cloud mode; edges choose their activation codec.
        metrics.run.info({"mode": settings.mode} | ({"codec": settings.codec} if settings.mode == "cloud" else {}))
        self.meter = LinkMeter(metrics, "encoder-inference")
        self.weights_meter = LinkMeter(metrics, "learner-inference")
        self.stream_kind = codecs.stream_kind(settings.mode, settings.codec)
        self.model_config = settings.network_config()
        self.action_spec = action_spec_of(settings.env, settings.env_kwargs)
        self.action_dtype, _ = codecs.action_wire(self.action_spec, 1)
        self.policy = Policy(
            settings.mode,
            self.model_config,
            self.action_spec,
            settings.seed,
            runtime=settings.acting_runtime,
            threads=settings.torch_threads,
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy")
        # Video decoding runs off the event loop (other streams and the batcher go on), beside the policy thread.
        self._decoding = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="video") if self.stream_kind == "video" else None
        )
        # So do the learner's weights: metering, decoding and checking CarRacing's megabytes takes milliseconds
        # an update, which on the loop would hold every Act stream's answer that long.
        self._weights_decoding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights")
        self.batcher = Batcher(
            self.policy.act,
            self._executor,
            metrics,
            settings.max_batch_size,
            settings.max_wait_ms / 1000,
            max_queued=settings.max_queued_requests,
        )
        self.writer = ReplayWriter(
            settings.replay_shard_address,
            settings.replay_table,
            metrics,
            settings.max_pending_inserts,
            settings,
            Backoff.of(settings),
        )
        self._tasks: list[asyncio.Task[None]] = []
        #: Each step-id prefix belongs to the edge that first used it (authz.Claims): no edge names another's steps.
        self.prefixes = authz.Claims("step-id prefix")

    def register(self, server: grpc.aio.Server) -> None:
        rollout_pb2_grpc.add_InferenceServicer_to_server(self, server)
        weights_pb2_grpc.add_PolicyUpdatesServicer_to_server(self, server)

    def finished(self) -> None:
        return None

    def failure(self) -> None:
        return None

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.batcher.run(), name="batcher"),
            asyncio.create_task(self.writer.run(), name="replay-writer"),
        ]
        if self.policy.runtime == "onnxruntime":
            self._tasks.append(asyncio.create_task(self._act_in_onnxruntime(), name="onnxruntime-session"))

    async def _act_in_onnxruntime(self) -> None:
        """Once serving (acting in torch meanwhile): an ONNX Runtime session for the weights acted with now,
        built on the weights thread and swapped in between two batches, unless the learner's newer weights
        were swapped in first (prepared the same way)."""
        loop = asyncio.get_running_loop()
        state, version = await loop.run_in_executor(self._executor, self.policy.weights_now)
        prepared = await loop.run_in_executor(self._weights_decoding, self.policy.prepare, state)
        with contextlib.suppress(BadRequest):  # "older than": newer weights were swapped in meanwhile
            await loop.run_in_executor(self._executor, self.policy.load, prepared, version)

    async def stop(self) -> None:
        await self.writer.flush(timeout_s=self.settings.shutdown_grace_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._weights_decoding.shutdown(wait=True)  # it feeds the policy executor
        self._executor.shutdown(wait=True)
        if self._decoding is not None:
            self._decoding.shutdown(wait=True)

    async def Act(
        self, request_iterator: AsyncIterator[rollout_pb2.ActRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rollout_pb2.ActResponse]:
        metadata = dict(context.invocation_metadata() or ())
        announced = metadata.get(codecs.CODEC_METADATA_KEY)  # the stream kind the edge says it sends
        # Every stream is a new run: its frame stacks and trajectories start empty, whoever sends it.
        stream = _EdgeStream(self.settings, self.stream_kind, authz.peer_identity(context), self.prefixes)
        run_id = metadata.get(codecs.RUN_ID_METADATA_KEY, "(none)")
        log.info("Act stream open: edge %s, run %s", metadata.get(codecs.EDGE_ID_METADATA_KEY, "?"), run_id)
        self.batcher.open_streams += 1
        try:
            async for request in request_iterator:
                # Refused only once the first request is read: ending the call while the edge is still
                # writing it would make the edge see INTERNAL ("Internal error from Core"), not this reason.
                if announced != self.stream_kind:
                    raise Refused(
                        f"this inference serves {self.settings.mode!r} mode and expects codec {self.stream_kind!r}; "
                        f"the stream announced {announced!r}"
                    )
                self.meter.received(request, phase="rollout", payload=codecs.payload_of(self.stream_kind))
                try:
                    observations = await self._policy_input(stream, request)
                except VideoDecodeError:  # the stream ends, and its decoders with it
                    self.metrics.video_decode_errors.inc()
                    raise
                decisions = await self.batcher.submit(observations)
                response = rollout_pb2.ActResponse(actions=wire.encode(decisions.actions, self.action_dtype))
                stream.policy_version.put(response, "policy_version", decisions.policy_version)
                self.meter.sent(response, phase="rollout", payload="action")
                yield response
                for chunk in stream.record(request, observations, decisions):
                    self.metrics.trajectories.inc()
                    await self.writer.put(chunk.to_proto())
        finally:
            self.batcher.open_streams -= 1
            # The chunk in progress is never finished by another stream: a reconnecting edge gets a new run.
            # (A killed edge ends the request stream just as one that closed it does, so both count here.)
            unfinished = stream.unfinished_chunks()
            if unfinished:
                self.metrics.trajectory_chunks_dropped.labels(reason="reconnect").inc(unfinished)
                log.info("Act stream of run %s ended; %d unfinished chunks dropped", run_id, unfinished)

    async def _policy_input(self, stream: _EdgeStream, request: rollout_pb2.ActRequest) -> torch.Tensor:
        if self._decoding is None:
            return stream.policy_input(request)
        return await asyncio.get_running_loop().run_in_executor(self._decoding, stream.policy_input, request)

    async def Publish(
        self, request_iterator: AsyncIterator[weights_pb2.Weights], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[weights_pb2.WeightsAck]:
        loop = asyncio.get_running_loop()
        previous: int | None = None  # the version this stream brought last
        async for message in request_iterator:
            self._check_version(message.version, previous)
            prepared = await loop.run_in_executor(self._weights_decoding, self._received_weights, message)
            # The policy executor runs one batch at a time, so the swap lands between two batches. A stream's
            # first version may go back: a learner resumed from a checkpoint older than what inference acts with.
            load = functools.partial(self.policy.load, rewind=previous is None)
            await loop.run_in_executor(self._executor, load, prepared, message.version)
            previous = message.version
            self.metrics.policy_version.set(self.policy.version)  # the newest swapped in, whichever stream swapped last
            ack = weights_pb2.WeightsAck(version=message.version)
            self.weights_meter.sent(ack, phase="weights", payload="ack")
            yield ack

    def _check_version(self, version: int, previous: int | None) -> None:
        """A plausible successor on its stream: below MAX_WEIGHTS_VERSION, and on a stream that brought
        `previous`, from `previous` to `previous + max_version_step` (BadRequest otherwise)."""
        if version >= MAX_WEIGHTS_VERSION:
            raise BadRequest(f"Weights.version {version} is beyond any run: versions count updates, below 2**53")
        if previous is not None and not previous <= version <= previous + self.settings.max_version_step:
            raise BadRequest(
                f"Weights.version {version} does not follow {previous} on this stream (at most "
                f"{self.settings.max_version_step} updates later, never earlier)"
            )

    def _received_weights(self, message: weights_pb2.Weights) -> PreparedWeights:
        """On the weights thread: count `message` and return its state_dict, checked (BadRequest, WireError:
        finite, within max_weight_magnitude, finite outputs) and prepared to act with."""
        self.weights_meter.received(message, phase="weights", payload="weights")
        reference = self.policy.network.state_dict()
        state = weights.from_proto(message, reference, max_magnitude=self.settings.max_weight_magnitude)
        self.policy.check_outputs(state)
        return self.policy.prepare(state)


class _EdgeStream:
    """Validation, cloud-side frame stacks and trajectory cutting for one edge stream."""

    def __init__(
        self,
        settings: InferenceSettings,
        stream_kind: codecs.StreamKind,
        edge: authz.Identity | None,
        prefixes: authz.Claims,
    ) -> None:
        self.settings, self.stream_kind = settings, stream_kind
        self.edge, self.prefixes = edge, prefixes
        self.prefix: int | None = None  # of this stream's step ids, claimed for `edge` on its first message
        self.lockstep = LockstepStream("ActRequest", sequenced=False)
        # What the edge leaves out when the stream's previous message implies it, and the same for our answers.
        self.step_ids, self.encoder_version, self.policy_version = StepIdCursor(), Carried(), Carried()
        self.rewards = RewardBook()
        self.cutter = TrajectoryCutter(settings.unroll_length)
        self.stacker: FrameStacker | None = None
        self.video = (
            VideoStreamDecoder(settings.frame_size, settings.max_batch_size) if stream_kind == "video" else None
        )

    @property
    def num_envs(self) -> int | None:
        return self.lockstep.num_envs

    def policy_input(self, request: rollout_pb2.ActRequest) -> torch.Tensor:
        """Validate `request`, fill in what it left for the stream to imply (first_step_id, encoder_version, rewards),
        and return what the policy consumes (uint8 stacks or bf16 activations)."""
        s = self.settings
        dtype, shape = codecs.expected_observation(
            self.stream_kind, self.num_envs, s.frame_stack, s.frame_size, s.width
        )
        if dtype is None:  # activations, in any float codec; NaN / Inf refused
            observations = wire.decode_float(
                request.observations, expect_shape=shape, max_magnitude=s.activation_bound()
            ).to(torch.bfloat16)
        elif self.video is not None:
            observations = self.video.decode(request.observations, expect_shape=list(shape))
        else:
            observations = wire.decode(request.observations, expect_dtype=dtype, expect_shape=shape)
        n = observations.shape[0]
        # The fields the stream's previous message implied are filled in (after metering: the bytes were what crossed).
        request.first_step_id = self.step_ids.get(request)
        request.encoder_version = self.encoder_version.get(request, "encoder_version")
        self.rewards.get(request, n)
        if request.first_step_id + n > 2**63 or request.encoder_version >= 2**63:
            raise BadRequest("ActRequest's step ids (first_step_id + rows) and encoder_version must be below 2**63")
        self._claim_prefix(request.first_step_id, n)
        starts = self.lockstep.accept(request, n, ("rewards", "terminated", "truncated"))
        largest = max(map(abs, request.rewards), default=0.0)
        if largest > s.max_abs_reward:  # refused here, this edge alone: replay would refuse the chunk holding it
            raise BadRequest(
                f"ActRequest reports a reward of |{largest:.3g}|, above --max-abs-reward {s.max_abs_reward:.3g}"
            )
        if self.stream_kind in ("frame", "video"):
            if self.stacker is None:
                self.stacker = FrameStacker(n, s.frame_stack, s.frame_size, s.frame_size)
            return self.stacker.push(observations, starts)
        if self.stream_kind == "stack-bf16":
            return observations.clamp(0, 255).round().to(torch.uint8)
        return observations

    def _claim_prefix(self, first_step_id: int, rows: int) -> None:
        """The stream's step ids keep the prefix of its first, which must be its edge's own (authz.Claims)."""
        first, last = prefix_of_id(first_step_id), prefix_of_id(first_step_id + rows - 1)
        if self.prefix is None:
            self.prefixes.claim(first, self.edge)
            self.prefix = first
        if first != self.prefix or last != self.prefix:
            raise BadRequest(f"ActRequest's step ids left this stream's step-id prefix {self.prefix}")

    def unfinished_chunks(self) -> int:
        """Per-env chunks begun but not cut: what is lost if the stream ends now."""
        return (self.num_envs or 0) if self.cutter.pending_steps else 0

    def record(
        self, request: rollout_pb2.ActRequest, observations: torch.Tensor, decisions: Decisions
    ) -> list[TrajectoryTensors]:
        """Feed one acted-on request (as policy_input completed it) to the cutter; returns the chunks it
        completed."""
        return self.cutter.add(
            observations,
            decisions,
            step_ids=request.first_step_id + torch.arange(observations.shape[0], dtype=torch.int64),
            encoder_version=request.encoder_version,
            previous_rewards=torch.tensor(request.rewards, dtype=torch.float32),
            previous_terminated=episode_ends(request, "terminated", observations.shape[0]),
            previous_truncated=episode_ends(request, "truncated", observations.shape[0]),
        )
