"""The single-process baseline: the stack's envs and model in one Python loop, no gRPC, no processes.

Per vector step: stack the newest frames (FrameStacker, as the edge does), run encoder + head on the
whole batch and sample actions (inference's Policy, cloud form), step every env. No training: the
baseline is the rollout path the stack splits across services, at its fastest.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from splitrl.bench.settings import ThroughputBenchSettings
from splitrl.core.envs import action_spec_from_space, make_vector_env
from splitrl.core.framestack import FrameStacker
from splitrl.inference.policy import Policy


@dataclass(frozen=True)
class BaselineResult:
    """`steps` env steps in `seconds` after the warm-up; the time split is per env step (microseconds)."""

    steps: int
    seconds: float
    env_us_per_step: float
    model_us_per_step: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds


def steady_window(points: Sequence[tuple[float, float]], warmup_fraction: float) -> tuple[int, float]:
    """(env steps, seconds) between the first point past `warmup_fraction` of the steps and the last point.

    `points` are cumulative (env_steps, seconds) in time order. ValueError if the window is empty.
    """
    if len(points) < 2:
        raise ValueError(f"need at least 2 progress points to measure a rate, got {len(points)}")
    total = points[-1][0]
    first = next(p for p in points if p[0] >= warmup_fraction * total)
    steps, seconds = points[-1][0] - first[0], points[-1][1] - first[1]
    if steps <= 0 or seconds <= 0:
        raise ValueError(f"no progress after the warm-up: {steps} steps in {seconds:.3f} s")
    return int(steps), seconds


def run_baseline(settings: ThroughputBenchSettings) -> BaselineResult:
    """Step `settings.num_envs` envs for `settings.steps` env steps with batched actions from one policy."""
    torch.set_num_threads(settings.torch_threads)
    n = settings.num_envs
    envs = make_vector_env(settings.env, settings.env_kwargs, n, settings.frame_size, action_repeat=1)
    try:
        spec = action_spec_from_space(envs.single_action_space)
        model = settings.network_config()
        policy = Policy("cloud", model=model, action_spec=spec, seed=0)
        stacker = FrameStacker(n, settings.frame_stack, settings.frame_size, settings.frame_size)
        started = time.perf_counter()
        frames, _ = envs.reset(seed=0)
        episode_start = torch.ones(n, dtype=torch.bool)
        points: list[tuple[float, float]] = [(0, 0.0)]
        env_s = model_s = 0.0
        while points[-1][0] < settings.steps:
            before_model = time.perf_counter()
            decisions = policy.act(stacker.push(torch.from_numpy(frames), episode_start))
            actions = decisions.actions.numpy()
            if spec.kind == "continuous":
                actions = np.clip(actions, spec.low, spec.high)
            before_env = time.perf_counter()
            frames, _, terminated, truncated, _ = envs.step(actions)
            after = time.perf_counter()
            episode_start = torch.from_numpy(terminated | truncated)
            model_s += before_env - before_model
            env_s += after - before_env
            points.append((points[-1][0] + n, after - started))
    finally:
        envs.close()
    steps, seconds = steady_window(points, settings.warmup_fraction)
    total = points[-1][0]
    return BaselineResult(steps, seconds, env_s / total * 1e6, model_s / total * 1e6)
