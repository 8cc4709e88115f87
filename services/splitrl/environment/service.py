"""Environment service: the loop that steps the envs, one EnvStep message per vector step.

It dials the edge-encoder (edge processes sit behind NAT and only dial out)
and runs in lockstep: send frames, wait for actions, step. A lost edge-encoder
is redialled with backoff (core.redial); the process ends at max_steps, on
SIGTERM, or when the edge refuses its stream (a mismatched setting).

With `env_groups` G > 1 the envs are split into G vector envs, each with its own
stream (Sample Factory's double-buffered sampling): while one group's step is
on its round trip through edge and inference, another group's envs are stepped,
so the process stays busy instead of waiting for actions. With `env_workers`
each group steps in a worker process of its own (core.env_worker), so groups
step at the same time, on more than one core.
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
from splitrl.core.env_worker import GroupEnvs, group_envs
from splitrl.core.envs import action_spec_from_space, skip_unused_pygame_modules
from splitrl.core.link_meter import LinkMeter
from splitrl.core.metrics import Metrics
from splitrl.core.redial import FAILURES, Redial
from splitrl.core.service import BackgroundLoop, LoopService
from splitrl.environment.settings import EnvironmentSettings
from splitrl.v1 import rollout_pb2, rollout_pb2_grpc

log = logging.getLogger(__name__)


class EnvironmentService(LoopService):
    """Steps `num_envs` envs, in `env_groups` groups, until `max_steps` agent steps (or until stopped)."""

    service_names: Sequence[str] = ()
    serves_wan = False

    def __init__(self, settings: EnvironmentSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.meter = LinkMeter(metrics, "env-encoder")
        skip_unused_pygame_modules(settings.env)  # this process steps only these envs (or none: env workers)
        sizes = [len(part) for part in np.array_split(np.arange(settings.num_envs), settings.env_groups)]
        #: (first env's index, its vector env) per group; env i is seeded seed + i whatever the grouping.
        self.groups = [
            (
                sum(sizes[:g]),
                group_envs(
                    settings.env,
                    settings.env_kwargs,
                    n,
                    settings.frame_size,
                    settings.action_repeat,
                    worker=settings.env_workers,
                ),
            )
            for g, n in enumerate(sizes)
        ]
        self.action_spec = action_spec_from_space(self.groups[0][1].single_action_space)
        metrics.worker_cpu_seconds.set_function(lambda: sum(envs.usage().cpu_seconds for _, envs in self.groups))
        metrics.worker_resident_bytes.set_function(lambda: sum(envs.usage().resident_bytes for _, envs in self.groups))
        metrics.worker_peak_resident_bytes.set_function(
            lambda: sum(envs.usage().peak_resident_bytes for _, envs in self.groups)
        )
        self.steps_taken = 0
        self.loop = BackgroundLoop("environment loop")

    def register(self, server: grpc.aio.Server) -> None:
        pass  # health only: the environment serves no RPC of its own

    async def stop(self) -> None:
        await self.loop.cancel()
        # Off the event loop and side by side: a worker may take a moment to exit.
        await asyncio.gather(*(asyncio.to_thread(envs.close) for _, envs in self.groups))

    async def run(self) -> None:
        """Every group's rollout loop, concurrently; returns once max_steps agent steps are done. A group that
        fails ends the others (cancelled) and the error is raised as it is."""
        groups = [asyncio.create_task(self._run_group(first, envs)) for first, envs in self.groups]
        try:
            await asyncio.gather(*groups)
        finally:
            for group in groups:
                group.cancel()
            await asyncio.gather(*groups, return_exceptions=True)
        log.info("environment done after %d agent steps", self.steps_taken)

    async def _run_group(self, first_env: int, envs: GroupEnvs) -> None:
        """One group's rollout loop. Returns once max_steps agent steps are done; a lost edge-encoder is redialled.

        A lost stream does not end the loop: the step whose actions did not come back is sent again, as
        sequence 0 of a fresh stream with a new run id (the edge starts new frame stacks for it, and
        inference new trajectories), after the redial backoff. A refusal (core.redial) is raised.
        """
        settings = self.settings
        frames, _ = envs.reset(seed=settings.seed + first_env)
        group = _Group(envs, _Pending(frames, envs.num_envs))
        redial = Redial("edge-encoder", Backoff.of(settings), self.metrics)
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
                        await self._stream(call, group, redial)
                    finally:
                        call.cancel()
            except FAILURES as error:
                await redial.lost(error, f"rollout stream {run_id} to edge-encoder")

    def _done(self) -> bool:
        return bool(self.settings.max_steps) and self.steps_taken >= self.settings.max_steps

    async def _stream(self, call: grpc.aio.StreamStreamCall, group: _Group, redial: Redial) -> None:
        """Step in lockstep on one stream until max_steps; raises if the stream breaks or the edge goes quiet."""
        sequence = 0
        while not self._done():
            step = group.pending.message(sequence)
            sent_at = time.perf_counter()
            self.meter.sent(step, phase="rollout", payload="observation")
            reply = await rpc.exchange(call, step, self.settings.peer_timeout_s, "edge-encoder")
            self.meter.received(reply, phase="rollout", payload="action")
            self.metrics.hop_latency.labels(hop="environment-edge").observe(time.perf_counter() - sent_at)
            actions = self._actions(reply, sequence, group.envs.num_envs)
            redial.answered()
            stepped_at = time.perf_counter()
            frames, rewards, terminated, truncated, info = await group.envs.step(actions)
            self.metrics.hop_latency.labels(hop="environment-step").observe(time.perf_counter() - stepped_at)
            group.pending.advance(frames, rewards, terminated, truncated)
            self._record(info, group.envs.num_envs)
            self.steps_taken += group.envs.num_envs
            sequence += 1
        await call.done_writing()

    def _actions(self, reply: rollout_pb2.EnvAction, sequence: int, n: int) -> np.ndarray:
        if reply.sequence != sequence:
            raise ValueError(f"edge-encoder answered sequence {reply.sequence}, expected {sequence}")
        spec = self.action_spec
        dtype, shape = codecs.action_wire(spec, n)
        actions = wire.decode_array(reply.actions, expect_dtype=dtype, expect_shape=list(shape))
        if spec.kind == "discrete":
            if actions.min() < 0 or actions.max() >= spec.size:
                raise ValueError(f"action outside [0, {spec.size}): {actions.tolist()}")
            return actions.astype(np.int64)
        if not np.isfinite(actions).all():
            raise ValueError(f"action holds NaN or Inf: {actions.tolist()}")
        return np.clip(actions, spec.low, spec.high)

    def _record(self, info: dict, n: int) -> None:
        self.metrics.env_steps.inc(n)
        if "_episode" in info:
            for ret, length in zip(
                info["episode"]["r"][info["_episode"]], info["episode"]["l"][info["_episode"]], strict=True
            ):
                self.metrics.episode_return.observe(float(ret))
                self.metrics.episode_length.observe(int(length))


class _Group:
    """One group's envs and the step it sends next."""

    def __init__(self, envs: GroupEnvs, pending: _Pending) -> None:
        self.envs, self.pending = envs, pending


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
        """The EnvStep; an episode-end field goes empty when no env's episode ended (splitrl.core.lockstep),
        and the edge passes both on to inference as they are, so the WAN carries no flags on most steps."""
        return rollout_pb2.EnvStep(
            sequence=sequence,
            frames=wire.encode(self.frames),
            rewards=self.rewards.tolist(),
            terminated=self.terminated.tolist() if self.terminated.any() else [],
            truncated=self.truncated.tolist() if self.truncated.any() else [],
        )
