"""Environment service: the loop that steps the envs, one EnvStep message per vector step.

It dials the edge-encoder (edge processes sit behind NAT and only dial out)
and runs in lockstep: send frames, wait for actions, step. A lost edge-encoder
is redialled with backoff; the process ends only at max_steps or on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import grpc
import numpy as np

from splitrl.core import codecs, rpc, wire
from splitrl.core.backoff import Backoff
from splitrl.core.envs import action_spec_from_space, make_vector_env
from splitrl.core.metrics import LinkMeter, Metrics
from splitrl.core.service import BackgroundLoop
from splitrl.environment.settings import EnvironmentSettings
from splitrl.v1 import rollout_pb2, rollout_pb2_grpc

log = logging.getLogger(__name__)


class EnvironmentService:
    """Steps `num_envs` envs until `max_steps` agent steps (or until stopped)."""

    service_names: Sequence[str] = ()

    def __init__(self, settings: EnvironmentSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.meter = LinkMeter(metrics, "env-encoder")
        self.envs = make_vector_env(
            settings.env, settings.env_kwargs, settings.num_envs, settings.frame_size, settings.action_repeat
        )
        self.action_spec = action_spec_from_space(self.envs.single_action_space)
        self.steps_taken = 0
        self.loop = BackgroundLoop("environment loop")

    def register(self, server: grpc.aio.Server) -> None:
        pass  # health only: the environment serves no RPC of its own

    def finished(self) -> asyncio.Event:
        return self.loop.done

    def failure(self) -> BaseException | None:
        return self.loop.failure

    async def start(self) -> None:
        self.loop.start(self.run)

    async def stop(self) -> None:
        await self.loop.cancel()
        self.envs.close()

    async def run(self) -> None:
        """The rollout loop. Returns once max_steps agent steps are done; a lost edge-encoder is redialled.

        A broken stream never ends the loop: the step whose actions did not come back is sent again, as
        sequence 0 of a fresh stream with a new run id (the edge starts new frame stacks for it, and
        inference new trajectories), after a jittered exponential backoff.
        """
        settings = self.settings
        frames, _ = self.envs.reset(seed=settings.seed)
        pending = _Pending(frames, settings.num_envs)
        backoff = Backoff.of(settings)
        while not self._done():
            run_id = codecs.new_run_id()
            try:
                async with rpc.dial(settings.encoder_address, settings) as channel:
                    await asyncio.wait_for(channel.channel_ready(), settings.peer_timeout_s)
                    call = rollout_pb2_grpc.EdgeEncoderStub(channel).Rollout(
                        metadata=((codecs.RUN_ID_METADATA_KEY, run_id),)
                    )
                    log.info("rollout stream to edge-encoder %s open (run id %s)", settings.encoder_address, run_id)
                    try:
                        await self._stream(call, pending, backoff)
                    finally:
                        call.cancel()
            except (grpc.aio.AioRpcError, ConnectionError, TimeoutError, ValueError) as error:
                # ValueError: the edge answered nonsense (wire.WireError included); a fresh stream starts over.
                self.metrics.reconnects.labels(peer="edge-encoder").inc()
                delay = await backoff.sleep()
                log.warning("rollout stream %s to edge-encoder lost (%s); redialled after %.2fs", run_id, error, delay)
        log.info("environment done after %d agent steps", self.steps_taken)

    def _done(self) -> bool:
        return bool(self.settings.max_steps) and self.steps_taken >= self.settings.max_steps

    async def _stream(self, call: grpc.aio.StreamStreamCall, pending: _Pending, backoff: Backoff) -> None:
        """Step in lockstep on one stream until max_steps; raises if the stream breaks or the edge goes quiet."""
        sequence = 0
        while not self._done():
            step = pending.message(sequence)
            sent_at = time.perf_counter()
            self.meter.sent(step, phase="rollout", payload="observation")
            await call.write(step)
            # Per-message liveness: a hung edge (alive to keepalives, but not answering) is given up on.
            reply = await asyncio.wait_for(call.read(), self.settings.peer_timeout_s)
            if reply is grpc.aio.EOF:
                await rpc.raise_if_failed(call)
                raise ConnectionError("edge-encoder closed the stream")
            self.meter.received(reply, phase="rollout", payload="action")
            self.metrics.hop_latency.labels(hop="environment-edge").observe(time.perf_counter() - sent_at)
            actions = self._actions(reply, sequence)
            backoff.reset()  # the edge answered: this stream works
            frames, rewards, terminated, truncated, info = self.envs.step(actions)
            pending.advance(frames, rewards, terminated, truncated)
            self._record(info)
            self.steps_taken += self.settings.num_envs
            sequence += 1
        await call.done_writing()

    def _actions(self, reply: rollout_pb2.EnvAction, sequence: int) -> np.ndarray:
        if reply.sequence != sequence:
            raise ValueError(f"edge-encoder answered sequence {reply.sequence}, expected {sequence}")
        spec, n = self.action_spec, self.settings.num_envs
        if spec.kind == "discrete":
            actions = wire.decode(reply.actions, expect_dtype=wire.DType.DTYPE_INT64, expect_shape=[n]).numpy()
            if actions.min() < 0 or actions.max() >= spec.size:
                raise ValueError(f"action outside [0, {spec.size}): {actions.tolist()}")
            return actions
        continuous = wire.decode(reply.actions, expect_dtype=wire.DType.DTYPE_FLOAT32, expect_shape=[n, spec.size])
        return np.clip(continuous.numpy(), spec.low, spec.high)

    def _record(self, info: dict) -> None:
        self.metrics.env_steps.inc(self.settings.num_envs)
        if "_episode" in info:
            for ret, length in zip(
                info["episode"]["r"][info["_episode"]], info["episode"]["l"][info["_episode"]], strict=True
            ):
                self.metrics.episode_return.observe(float(ret))
                self.metrics.episode_length.observe(int(length))


class _Pending:
    """The vector step to send next: the envs' newest frames and what the previous actions earned.

    It survives a broken stream, so the step the edge never answered is sent again on the next one.
    """

    def __init__(self, frames: np.ndarray, num_envs: int) -> None:
        self.frames = frames
        self.rewards = np.zeros(num_envs, np.float32)
        self.terminated = np.zeros(num_envs, bool)
        self.truncated = np.zeros(num_envs, bool)

    def advance(self, frames: np.ndarray, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
        self.frames, self.rewards = frames, np.asarray(rewards, np.float32)
        self.terminated, self.truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)

    def message(self, sequence: int) -> rollout_pb2.EnvStep:
        return rollout_pb2.EnvStep(
            sequence=sequence,
            frames=wire.encode(self.frames),
            rewards=self.rewards.tolist(),
            terminated=self.terminated.tolist(),
            truncated=self.truncated.tolist(),
        )
