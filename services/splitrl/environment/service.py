"""Environment service: the loop that steps the envs, one EnvStep message per vector step.

It dials the edge-encoder (edge processes sit behind NAT and only dial out)
and runs in lockstep: send frames, wait for actions, step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import grpc
import numpy as np

from splitrl.core import rpc, wire
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
        """The rollout loop. Returns once max_steps agent steps are done."""
        settings, n = self.settings, self.settings.num_envs
        async with rpc.insecure_channel(settings.encoder_address) as channel:
            await channel.channel_ready()
            call = rollout_pb2_grpc.EdgeEncoderStub(channel).Rollout()
            frames, _ = self.envs.reset(seed=settings.seed)
            rewards = np.zeros(n, np.float32)
            terminated = truncated = np.zeros(n, bool)
            sequence = 0
            while not settings.max_steps or self.steps_taken < settings.max_steps:
                step = rollout_pb2.EnvStep(
                    sequence=sequence,
                    frames=wire.encode(frames),
                    rewards=rewards.tolist(),
                    terminated=terminated.tolist(),
                    truncated=truncated.tolist(),
                )
                sent_at = time.perf_counter()
                self.meter.sent(step, phase="rollout", payload="observation")
                await call.write(step)
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    raise ConnectionError("edge-encoder closed the stream")
                self.meter.received(reply, phase="rollout", payload="action")
                self.metrics.hop_latency.labels(hop="environment-edge").observe(time.perf_counter() - sent_at)
                actions = self._actions(reply, sequence)
                frames, rewards_, terminated, truncated, info = self.envs.step(actions)
                rewards = np.asarray(rewards_, np.float32)
                self._record(info)
                self.steps_taken += n
                sequence += 1
            await call.done_writing()
        log.info("environment done after %d agent steps", self.steps_taken)

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
