"""Edge-encoder service: serves the environment's stream and dials inference, one stream per environment.

With several inference replicas (`--inference-address a,b`) the environment
streams are spread evenly over them, and kept so as replicas go and come back
(core.replicas): a stream moves between two steps, as if it had broken.

For every vector step it updates the env's frame stacks and forwards what the
mode puts on the WAN: activations of the CNN encoder (split modes), or
the newest uint8 frame, an H.264 packet per env, or the bf16 stack (cloud).
Activations use the configured float codec (bf16, int8, int4, fp8, optionally +zstd). Actions come back the same way.

If the Act stream to inference breaks, the environment's step is held and sent
again on a new Act stream (new run id, jittered exponential backoff): inference
never stitches steps from before and after the gap into one trajectory. Video
encoders belong to one Act stream, so a new stream starts from keyframes.

In split modes it also keeps each step's frame stack by step id and dials the
learner (`learner_link`), which trains the encoder through it. What an env's
step waits for (encoder forwards, video encoding) runs on the acting thread,
training steps on the training thread: a step waits at most for an optimizer
step or a lookup in the store (EncoderTrainer's lock), not for a whole training
step, which keeps the edge-encode hop's latency, and its tail, to the acting
work alone.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
import torch

from splitrl.core import checkpoint, codecs, rpc, wire
from splitrl.core.backoff import Backoff
from splitrl.core.framestack import FrameRow
from splitrl.core.link_meter import LinkMeter
from splitrl.core.metrics import Metrics
from splitrl.core.redial import FAILURES, Redial
from splitrl.core.replicas import Replicas
from splitrl.core.service import BackgroundLoop
from splitrl.core.step_ids import first_id, new_prefix
from splitrl.core.video import VideoStreamEncoder
from splitrl.edge_encoder.learner_link import LearnerLink
from splitrl.edge_encoder.observation_store import ObservationStore
from splitrl.edge_encoder.pretrained import load_pretrained
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.edge_encoder.streams import ActStream, EnvStream, Outgoing
from splitrl.edge_encoder.training import EncoderTrainer
from splitrl.v1 import rollout_pb2, rollout_pb2_grpc

log = logging.getLogger(__name__)


class EdgeEncoderService(rollout_pb2_grpc.EdgeEncoderServicer):
    """One instance per process; each environment stream gets its own stacks and its own inference stream."""

    service_names: Sequence[str] = (rollout_pb2.DESCRIPTOR.services_by_name["EdgeEncoder"].full_name,)
    serves_wan = False  # the environment beside it; its own dials cross the WAN

    def __init__(self, settings: EdgeEncoderSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        wan_codec = settings.codec if settings.mode == "cloud" else settings.activation_codec
        metrics.run.info(
            {"mode": settings.mode, "codec": wan_codec}
            | ({"encoder_precision": settings.encoder_precision} if settings.mode != "cloud" else {})
        )
        self.env_meter = LinkMeter(metrics, "env-encoder")
        self.wan_meter = LinkMeter(metrics, "encoder-inference")
        self.stream_kind = codecs.stream_kind(settings.mode, settings.codec)
        self.step_id_prefix = new_prefix()
        self._step_ids = itertools.count(first_id(self.step_id_prefix))
        # An env step's torch and video work; split modes' training steps have a thread of their own.
        self._acting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="acting")
        self._training: ThreadPoolExecutor | None = None
        # Split modes only: the encoder, the store of what it encoded and its training by the learner. Cloud
        # mode sends frames and holds none of it (at width 4,096 the encoder alone is 51 MB).
        self.trainer: EncoderTrainer | None = None
        self.learner_link: LearnerLink | None = None
        if settings.mode != "cloud":
            self._training = ThreadPoolExecutor(max_workers=1, thread_name_prefix="training")
            self.trainer, self.learner_link = self._encoder_training(settings, metrics, self._training)
        self._link_loop = BackgroundLoop("learner link")
        self._inference: Replicas | None = None

    def _encoder_training(
        self, settings: EdgeEncoderSettings, metrics: Metrics, training: ThreadPoolExecutor
    ) -> tuple[EncoderTrainer, LearnerLink]:
        torch.manual_seed(settings.seed)
        model = settings.network_config()
        encoder = model.encoder().eval()
        checkpoint_path = None if settings.checkpoint_dir is None else settings.checkpoint_dir / "encoder.pt"
        if settings.encoder_init is not None and not (checkpoint_path and checkpoint.exists(checkpoint_path)):
            # a restarted or resumed edge goes on from its checkpoint and needs no init file
            encoder.load_state_dict(load_pretrained(settings.encoder_init, model, settings.env))
            log.info("encoder starts from %s", settings.encoder_init)
        trainer = EncoderTrainer(
            encoder,
            ObservationStore(settings.observation_store_size),
            metrics,
            learning_rate=settings.encoder_learning_rate,
            max_grad_norm=settings.encoder_max_grad_norm,
            activation_codec=settings.activation_codec,
            checkpoint_path=checkpoint_path,
            checkpoint_every=settings.checkpoint_every,
            rows_per_pass=settings.encoder_rows_per_pass,
            precision=settings.encoder_precision,
        )
        link = LearnerLink(
            settings.learner_address,
            trainer,
            step_id_prefix=self.step_id_prefix,
            edge_id=settings.edge_id,
            metrics=metrics,
            compute=training,
            transport=settings,
            backoff=Backoff.of(settings),
        )
        return trainer, link

    def register(self, server: grpc.aio.Server) -> None:
        rollout_pb2_grpc.add_EdgeEncoderServicer_to_server(self, server)

    def finished(self) -> None:
        return None

    def failure(self) -> BaseException | None:
        return self._link_loop.failure

    async def start(self) -> None:
        self._inference = Replicas(
            "inference",
            self.settings.inference_address,
            self.settings,
            self.metrics,
            dial=functools.partial(rpc.dial, wan=True),
        )
        if self.learner_link is not None:
            self._link_loop.start(self.learner_link.run)

    async def stop(self) -> None:
        await self._link_loop.cancel()
        if self._inference is not None:
            await self._inference.close()
        self._acting.shutdown(wait=True)
        if self.trainer is not None and self._training is not None:  # after any training step queued there
            await asyncio.get_running_loop().run_in_executor(self._training, self.trainer.save_checkpoint)
            self._training.shutdown(wait=True)

    async def Rollout(
        self, request_iterator: AsyncIterator[rollout_pb2.EnvStep], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rollout_pb2.EnvAction]:
        env_run_id = dict(context.invocation_metadata() or ()).get(codecs.RUN_ID_METADATA_KEY) or codecs.new_run_id()
        assert self._inference is not None, "start() not called"
        stream = EnvStream(self.settings)
        upstream = ActStream(env_run_id, self._inference)
        redial = Redial("inference", Backoff.of(self.settings), self.metrics, refused=_passed_on)
        try:
            async for step in request_iterator:
                self.env_meter.received(step, phase="rollout", payload="observation")
                encode_started = time.perf_counter()
                outgoing = await self._act_request(stream, step)
                if self.stream_kind != "video":  # video is encoded per Act stream, in _act, and timed there
                    self.metrics.hop_latency.labels(hop="edge-encode").observe(time.perf_counter() - encode_started)
                response = await self._act(upstream, outgoing, redial)
                reply = rollout_pb2.EnvAction(
                    sequence=step.sequence, actions=response.actions, policy_version=response.policy_version
                )
                self.env_meter.sent(reply, phase="rollout", payload="action")
                yield reply
            if upstream.call is not None:
                await upstream.call.done_writing()
        finally:
            upstream.close()

    async def _act(self, upstream: ActStream, outgoing: Outgoing, redial: Redial) -> rollout_pb2.ActResponse:
        """Send `outgoing` to inference and return its answer, reopening the Act stream as often as it breaks.

        The environment's step is held meanwhile and sent again, as sequence 0 of a stream with a new run id:
        inference starts fresh trajectories for it. A refusal (core.redial) is passed on with its status.
        The fields a stream's previous message implies, and in video mode the frames (by the encoders of the Act
        stream that carries them), are filled in here, per stream.
        """
        request = outgoing.request
        while True:
            if upstream.lease is not None and upstream.replicas.should_move(upstream.lease):
                moved = upstream.close()
                log.info("env run %s: run %s moves to even out inference replicas", upstream.env_run_id, moved)
            call = upstream.call or self._open(upstream)
            upstream.step_ids.put(request, outgoing.first_step_id)
            upstream.rewards.put(request, outgoing.rewards)
            upstream.encoder_version.put(request, "encoder_version", outgoing.encoder_version)
            shadow: asyncio.Task[None] | None = None
            if upstream.video is not None and self.stream_kind == "video":
                await self._encode_video(upstream.video, request, outgoing.frames)
            elif upstream.video is not None:  # --video-shadow, encoded while the exchange waits on inference
                shadow = asyncio.create_task(self._count_shadow(upstream.video, _shadow_of(request), outgoing.frames))
            try:
                response = await self._exchange(call, request, upstream)
                redial.answered()
                if shadow is not None:  # this Act stream's shadow encoders take the next frames after these
                    await shadow
                return response
            except FAILURES as error:
                lost = upstream.close()  # and with it the shadow encoders: a task still encoding is left to end
                what = (
                    f"env run {upstream.env_run_id}: Act stream {lost} to inference, after {upstream.answered} steps,"
                )
                await redial.lost(error, what)

    def _open(self, upstream: ActStream) -> grpc.aio.StreamStreamCall:
        # The first Act stream carries the environment's run id; each reopened one a new id derived from it.
        upstream.run_id = upstream.env_run_id if upstream.opened == 0 else f"{upstream.env_run_id}.{upstream.opened}"
        upstream.opened += 1
        metadata = (
            (codecs.CODEC_METADATA_KEY, self.stream_kind),
            (codecs.EDGE_ID_METADATA_KEY, self.settings.edge_id),
            (codecs.RUN_ID_METADATA_KEY, upstream.run_id),
        )
        upstream.lease = lease = upstream.replicas.acquire()
        upstream.call = rollout_pb2_grpc.InferenceStub(lease.channel).Act(metadata=metadata)
        upstream.new_call_state()
        if self.stream_kind == "video" or self.settings.video_shadow:  # fresh encoders: keyframes first
            upstream.video = VideoStreamEncoder(self.settings.frame_size, self.settings)
        log.info("env run %s: Act stream to %s open as run %s", upstream.env_run_id, lease.address, upstream.run_id)
        return upstream.call

    async def _exchange(
        self, call: grpc.aio.StreamStreamCall, request: rollout_pb2.ActRequest, upstream: ActStream
    ) -> rollout_pb2.ActResponse:
        """One request / response on an open Act stream; raises if it is broken or inference does not answer."""
        sent_at = time.perf_counter()
        if call.done():  # inference ended the stream (e.g. refused it): report why, not a failed write
            await rpc.raise_if_failed(call)
            raise ConnectionError("inference closed the stream")
        self.wan_meter.sent(request, phase="rollout", payload=codecs.payload_of(self.stream_kind))
        response = await rpc.exchange(call, request, self.settings.inference_timeout_s, "inference")
        self.wan_meter.received(response, phase="rollout", payload="action")
        response.policy_version = upstream.policy_version.get(response, "policy_version")  # filled in if implied
        self.metrics.hop_latency.labels(hop="edge-inference").observe(time.perf_counter() - sent_at)
        upstream.answered += 1
        return response

    async def _encode_video(
        self, video: VideoStreamEncoder, request: rollout_pb2.ActRequest, frames: torch.Tensor
    ) -> None:
        """On the acting thread: `frames` as one H.264 packet per env into `request`; records the encoding time
        and, with --video-measure-psnr, the PSNR the cloud will see."""

        def encode() -> wire.Tensor:
            started = time.perf_counter()
            message = video.encode(frames)
            self.metrics.hop_latency.labels(hop="edge-encode").observe(time.perf_counter() - started)
            if self.settings.video_measure_psnr:
                self.metrics.video_psnr.observe(video.mirror_psnr(frames, message))
            return message

        message = await asyncio.get_running_loop().run_in_executor(self._acting, encode)
        request.observations.CopyFrom(message)

    async def _count_shadow(
        self, video: VideoStreamEncoder, shadow: rollout_pb2.ActRequest, frames: torch.Tensor
    ) -> None:
        """--video-shadow: count the bytes `shadow` (_shadow_of the request as sent) has once `frames` are in it
        as this Act stream's shadow encoders code them. The encode queues on the acting thread with the env
        groups' encoder work and runs while the exchange waits on inference. A failed encode is logged, not
        counted, and never ends the stream: this is a measurement."""
        try:
            packets = await asyncio.get_running_loop().run_in_executor(self._acting, video.encode, frames)
        except Exception:
            log.exception("--video-shadow: encoding failed; this step is not counted")
            return
        shadow.observations.CopyFrom(packets)
        self.metrics.video_shadow_bytes.inc(shadow.ByteSize())

    async def _act_request(self, stream: EnvStream, step: rollout_pb2.EnvStep) -> Outgoing:
        """The ActRequest for `step` and what _act completes it with; video observations are left to _act."""
        frames, episode_start = stream.accept(step)
        step_ids = [next(self._step_ids) for _ in range(frames.shape[0])]
        encoder_version = 0
        observations: wire.Tensor | None = None
        if self.stream_kind == "frame":
            observations = wire.encode(frames, compress=self.settings.codec == "frame+zstd")
        elif self.stream_kind != "video":
            stacks = stream.stacker.push(frames, episode_start)
            if self.stream_kind == "stack-bf16":
                observations = wire.encode(stacks, wire.DTYPE_BFLOAT16)
            else:
                loop = asyncio.get_running_loop()
                rows = list(stream.stacker.rows)  # as of this step: the stacker moves on
                observations, encoder_version = await loop.run_in_executor(
                    self._acting, self._encode, step_ids, stacks, rows
                )
        request = rollout_pb2.ActRequest(
            observations=observations, terminated=step.terminated, truncated=step.truncated
        )
        return Outgoing(request, frames, step_ids[0], encoder_version, list(step.rewards))

    def _encode(self, step_ids: list[int], stacks: torch.Tensor, rows: list[FrameRow]) -> tuple[wire.Tensor, int]:
        """On the acting thread: remember the stacks (as `rows` of shared frames) for training, return (encoded
        activations, encoder version)."""
        assert self.trainer is not None, "activations are encoded in the split modes only"
        activations, encoder_version = self.trainer.act(step_ids, rows, stacks)
        return wire.encode_float(activations, self.settings.activation_codec), encoder_version


def _passed_on(error: grpc.aio.AioRpcError) -> Exception:
    """Inference's refusal, raised to the environment with the same status."""
    return rpc.UpstreamFailed("inference", error)


def _shadow_of(request: rollout_pb2.ActRequest) -> rollout_pb2.ActRequest:
    """A copy of `request` as cloud mode would send it but for its observations: no encoder version."""
    shadow = rollout_pb2.ActRequest()
    shadow.CopyFrom(request)
    shadow.ClearField("encoder_version")  # cloud mode has no edge encoder
    return shadow
