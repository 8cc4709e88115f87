"""The single-process references: the stack's envs and model in one Python loop, no gRPC, no processes.

Per vector step: stack the newest frames (FrameStacker, as the edge does), run encoder + head on the
whole batch and sample actions (inference's Policy, cloud form), step every env. Two references share
that loop:

- `act-only` (`run_baseline`): no training; the rollout path the stack splits across services, at its
  fastest.
- `sync-ppo` (`run_sync_ppo`): CleanRL's shape, rollout then update, in one process: steps are cut into
  chunks of unroll_length as inference cuts them (TrajectoryCutter), and once chunks_per_update chunks are
  in, the learner's own Trainer runs one PPO update on them with the network that acts. Same network,
  same PPO code, same hyperparameters, one update per unroll_length x chunks_per_update agent steps as in
  the stack: what separates it from the stack is only the stack.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from splitrl.core.envs import action_spec_from_space, make_vector_env
from splitrl.core.framestack import FrameStacker
from splitrl.core.trajectory import TrajectoryTensors
from splitrl.inference.policy import Decisions, Policy
from splitrl.inference.trajectories import TrajectoryCutter
from splitrl.learner.batch import Batch
from splitrl.learner.network import to_training_layout
from splitrl.learner.settings import LearnerSettings
from splitrl.learner.trainer import Trainer
from splitrl.run.plan import shared_values
from splitrl.run.settings import RunSettings

#: A progress point: cumulative (env steps, seconds, ...counters).
P = TypeVar("P", bound=Sequence[float])


@dataclass(frozen=True)
class BaselineResult:
    """`steps` agent steps (and `updates` PPO updates) in `seconds` after the warm-up; the time split is per
    agent step, in microseconds (None: not measured); `wall_seconds` is the whole run, set-up included, to
    `total_steps`. `cpu_seconds`: the CPU time its process spent (every thread) over the same `steps`; None
    where not every process of the run is counted (SB3's SubprocVecEnv workers) or not measured."""

    steps: int
    seconds: float
    env_us_per_step: float | None
    model_us_per_step: float | None
    update_us_per_step: float | None = 0.0
    updates: int = 0
    wall_seconds: float = 0.0
    total_steps: int = 0
    cpu_seconds: float | None = None
    #: The learner's own pace (update_pace): updates from the first to the last completed in the window, and the
    #: seconds between those two (0: fewer than 2 completed).
    paced_updates: int = 0
    paced_seconds: float = 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def cpu_ms_per_step(self) -> float | None:
        """CPU milliseconds per agent step after the warm-up, every thread of the run counted (None: unknown)."""
        return None if self.cpu_seconds is None else 1e3 * self.cpu_seconds / self.steps


def steady_span(points: Sequence[P], warmup_fraction: float) -> tuple[P, P]:
    """(first, last): the first point past `warmup_fraction` of the steps, and the last point.

    `points` are cumulative (env_steps, seconds, ...) in time order; further counters (e.g. updates) ride
    along. ValueError if the span holds no steps or no time.
    """
    if len(points) < 2:
        raise ValueError(f"need at least 2 progress points to measure a rate, got {len(points)}")
    total = points[-1][0]
    first = next(p for p in points if p[0] >= warmup_fraction * total)
    steps, seconds = points[-1][0] - first[0], points[-1][1] - first[1]
    if steps <= 0 or seconds <= 0:
        raise ValueError(f"no progress after the warm-up: {steps} steps in {seconds:.3f} s")
    return first, points[-1]


def update_pace(points: Sequence[P], first: P, last: P, *, completed_at: int = 1) -> tuple[int, float]:
    """(updates, seconds) from the first to the last PPO update completed inside the window [first, last] of
    cumulative (steps, seconds, updates, ...) `points` (`first` and `last` among them, as steady_span returns
    them): the learner's own pace, unlike the updates counted against the window's steps, which are off by the
    part of an update that straddles each end (+-1 of the ~14 updates in a CarRacing bench run) and by how far
    a stack's envs run ahead of its learner.

    `completed_at` is the field of a point that times its latest update: 1, the point's own seconds, times a
    completion at the first point that shows it, up to one point's interval late (the references take a point
    every vector step: well under 1% of their pace); a field holding when the learner completed it, on its own
    clock (a stack's curve: `last_update_at`), times it exactly whenever the points were taken. Updates shown
    by the window's first point completed before it and do not count. (0, 0.0) when fewer than 2 points in the
    window show a new update."""
    at = {id(point): index for index, point in enumerate(points)}
    if id(first) not in at or id(last) not in at:
        raise ValueError("update_pace: `first` and `last` must be points of `points` (as steady_span returns them)")
    inside = points[at[id(first)] : at[id(last)] + 1]
    changes = [later for earlier, later in itertools.pairwise(inside) if later[2] > earlier[2]]
    if len(changes) < 2:
        return 0, 0.0
    return int(changes[-1][2] - changes[0][2]), changes[-1][completed_at] - changes[0][completed_at]


def run_baseline(run: RunSettings, warmup_fraction: float) -> BaselineResult:
    """Step `run.num_envs` envs for `run.steps` agent steps with batched actions from one policy; no training."""
    return _loop(run, warmup_fraction, train=False)


def run_sync_ppo(run: RunSettings, warmup_fraction: float) -> BaselineResult:
    """`run_baseline` plus one PPO update (cloud mode's Trainer) per `run.chunks_per_update` chunks, in turn."""
    return _loop(run, warmup_fraction, train=True)


def _loop(run: RunSettings, warmup_fraction: float, train: bool) -> BaselineResult:
    torch.set_num_threads(run.torch_threads)
    started = time.perf_counter()
    n = run.num_envs
    envs = make_vector_env(run.env, run.env_kwargs, n, run.frame_size, run.action_repeat)
    try:
        spec = action_spec_from_space(envs.single_action_space)
        # torch acting, as CleanRL's loop does; the sync learner trains this very network in place.
        policy = Policy("cloud", model=run.network_config(), action_spec=spec, seed=run.seed, runtime="torch")
        learner = _SyncLearner(policy, run) if train else None
        stacker = FrameStacker(n, run.frame_stack, run.frame_size, run.frame_size)
        frames, _ = envs.reset(seed=run.seed)
        episode_start = torch.ones(n, dtype=torch.bool)
        rewards, terminated, truncated = (
            torch.zeros(n),
            torch.zeros(n, dtype=torch.bool),
            torch.zeros(n, dtype=torch.bool),
        )
        clock = time.perf_counter()  # rates count from here: set-up (envs, network, Adam) is in wall_seconds only
        cpu_clock = time.process_time()  # every thread of this process: torch's intra-op threads too
        #: (agent steps, seconds, updates, CPU seconds), cumulative.
        points: list[tuple[float, float, float, float]] = [(0, 0.0, 0, 0.0)]
        env_s = model_s = 0.0
        while points[-1][0] < run.steps:
            before_model = time.perf_counter()
            observations = stacker.push(torch.from_numpy(frames), episode_start)
            decisions = policy.act(observations)
            if learner is not None:
                learner.add(observations, decisions, rewards, terminated, truncated)
            actions = decisions.actions.numpy()
            if spec.kind == "continuous":
                actions = np.clip(actions, spec.low, spec.high)
            before_env = time.perf_counter()
            frames, reward, ended, cut, _ = envs.step(actions)
            after = time.perf_counter()
            rewards = torch.as_tensor(reward, dtype=torch.float32)
            terminated, truncated = torch.from_numpy(ended), torch.from_numpy(cut)
            episode_start = terminated | truncated
            model_s += before_env - before_model
            env_s += after - before_env
            updates = learner.updates if learner is not None else 0
            points.append((points[-1][0] + n, after - clock, updates, time.process_time() - cpu_clock))
        if learner is not None:
            # The last rollout's update, as SB3 (and CleanRL) run it: its chunks are cut once their bootstrap
            # step is acted on, without stepping the envs again.
            before_model = time.perf_counter()
            observations = stacker.push(torch.from_numpy(frames), episode_start)
            learner.add(observations, policy.act(observations), rewards, terminated, truncated)
            model_s += time.perf_counter() - before_model
            points.append(
                (points[-1][0], time.perf_counter() - clock, learner.updates, time.process_time() - cpu_clock)
            )
    finally:
        envs.close()
    first, last = steady_span(points, warmup_fraction)
    total = int(points[-1][0])
    update_s = learner.seconds if learner is not None else 0.0
    paced_updates, paced_seconds = update_pace(points, first, last)
    return BaselineResult(
        steps=int(last[0] - first[0]),
        seconds=last[1] - first[1],
        env_us_per_step=env_s / total * 1e6,
        model_us_per_step=(model_s - update_s) / total * 1e6,
        update_us_per_step=update_s / total * 1e6,
        updates=int(last[2] - first[2]),
        wall_seconds=time.perf_counter() - started,
        total_steps=total,
        cpu_seconds=last[3] - first[3],
        paced_updates=paced_updates,
        paced_seconds=paced_seconds,
    )


class _SyncLearner:
    """Cuts the acted steps into chunks and trains on every `chunks_per_update` of them, before acting on."""

    def __init__(self, policy: Policy, run: RunSettings) -> None:
        settings = LearnerSettings(**(shared_values(run, LearnerSettings) | {"mode": "cloud"}))
        self.policy = policy
        # The acting network itself (no weights to ship), in the layout the stack's learner trains in.
        self.trainer = Trainer(to_training_layout(policy.network), settings)
        self.cutter = TrajectoryCutter(run.unroll_length)
        self.chunks_per_update = run.chunks_per_update
        self.chunks: list[TrajectoryTensors] = []
        self.step_ids = torch.arange(run.num_envs, dtype=torch.int64)
        self.updates = 0
        self.seconds = 0.0  # spent in updates

    def add(
        self,
        observations: torch.Tensor,
        decisions: Decisions,
        previous_rewards: torch.Tensor,
        previous_terminated: torch.Tensor,
        previous_truncated: torch.Tensor,
    ) -> None:
        """Record a step acted on (the `previous_*` complete the step before it); update once enough chunks."""
        self.chunks += self.cutter.add(
            observations, decisions, self.step_ids, 0, previous_rewards, previous_terminated, previous_truncated
        )
        self.step_ids = self.step_ids + len(self.step_ids)
        if len(self.chunks) < self.chunks_per_update:
            return
        started = time.perf_counter()
        batch, self.chunks = self.chunks[: self.chunks_per_update], self.chunks[self.chunks_per_update :]
        self.trainer.update(Batch.stack(batch), version=self.updates)
        self.updates += 1
        self.policy.version = self.updates
        self.seconds += time.perf_counter() - started
