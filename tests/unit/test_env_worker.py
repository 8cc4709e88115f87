"""Env groups stepped in worker processes: the same frames, rewards and episode ends as stepping them here;
failures come back as errors, never as a hang."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from splitrl.core.env_worker import WorkerVectorEnv, group_envs
from splitrl.core.usage import NO_USAGE, ProcessUsage

FAST_ENV = "splitrl/Catch-v0"


@pytest.fixture
def worker() -> Iterator[WorkerVectorEnv]:
    """A worker of 2 Catch envs, reset; closed after the test (closing twice is harmless)."""
    started = WorkerVectorEnv(FAST_ENV, {}, 2, 36, 1)
    try:
        started.reset(seed=0)
        yield started
    finally:
        started.close()


async def _play(envs, steps: int) -> list[tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(3)
    frames, _ = envs.reset(seed=11)
    seen = [(frames,)]
    for _ in range(steps):
        actions = rng.integers(0, envs.single_action_space.n, size=envs.num_envs)
        frames, rewards, terminated, truncated, info = await envs.step(actions)
        seen.append((frames, rewards, terminated, truncated, info.get("_episode", np.zeros(envs.num_envs, bool))))
    return seen


def test_a_worker_steps_exactly_as_this_process_would() -> None:
    async def both() -> tuple[list[tuple[np.ndarray, ...]], list[tuple[np.ndarray, ...]]]:
        local = group_envs(FAST_ENV, {}, 3, 36, 2, worker=False)
        worker = group_envs(FAST_ENV, {}, 3, 36, 2, worker=True)
        try:
            return await _play(local, 60), await _play(worker, 60)  # 60 steps: several episodes end
        finally:
            local.close()
            worker.close()

    local, worker = asyncio.run(both())
    assert sum(int(step[2].sum()) for step in local[1:]) > 0, "no episode ended: the comparison saw no reset"
    for here, there in zip(local, worker, strict=True):
        for a, b in zip(here, there, strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_workers_cpu_and_memory_are_read_while_it_runs_and_kept_once_it_ends(worker: WorkerVectorEnv) -> None:
    async def run() -> tuple[ProcessUsage, ProcessUsage]:
        for _ in range(200):
            await worker.step(np.array([0, 1]))
        running = worker.usage()
        worker.close()
        return running, worker.usage()

    running, final = asyncio.run(run())
    assert running.cpu_seconds > 0 and running.resident_bytes > 10 * 2**20  # it imported gymnasium and numpy
    assert running.resident_bytes <= running.peak_resident_bytes  # its own VmHWM, read from /proc/PID/status
    assert final.cpu_seconds >= running.cpu_seconds and final.resident_bytes > 0
    assert final.peak_resident_bytes >= running.peak_resident_bytes
    local = group_envs(FAST_ENV, {}, 1, 36, 1, worker=False)
    assert local.usage() == NO_USAGE == (0.0, 0.0, 0.0)
    local.close()


def test_a_carracing_worker_draws_with_pygame_but_loads_neither_its_sound_nor_its_image_libraries() -> None:
    """The worker's process refuses envs.UNUSED_PYGAME_MODULES before it builds its envs (a small edge)."""
    worker = WorkerVectorEnv("CarRacing-v3", {"continuous": False}, 1, 96, 4)
    try:
        worker.reset(seed=0)
        maps = Path(f"/proc/{worker._process.pid}/maps").read_text()
    finally:
        worker.close()
    assert "libSDL2-2" in maps, "the worker never loaded pygame: the check below would prove nothing"
    assert "libSDL2_mixer" not in maps and "libSDL2_image" not in maps


def test_a_worker_that_cannot_build_its_envs_says_why() -> None:
    worker = WorkerVectorEnv("splitrl/NoSuchEnv-v0", {}, 2, 36, 1)
    try:
        with pytest.raises(RuntimeError, match=r"building the envs.*NoSuchEnv"):
            worker.single_action_space  # noqa: B018
    finally:
        worker.close()


def test_a_step_its_caller_stopped_waiting_for_leaves_the_env_refusing_further_use(worker: WorkerVectorEnv) -> None:
    async def run() -> None:
        stepping = asyncio.ensure_future(worker.step(np.array([0, 0])))
        await asyncio.sleep(0)  # the command is sent; its answer is not read
        stepping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stepping
        # Its answer would be read as the next step's: refused instead of silently one step behind.
        with pytest.raises(RuntimeError, match="stopped waiting"):
            await worker.step(np.array([1, 1]))

    asyncio.run(run())
    worker.close()
    assert not worker._process.is_alive()


def test_a_bad_action_is_an_error_reported_with_the_workers_name(worker: WorkerVectorEnv) -> None:
    async def run() -> None:
        with pytest.raises(RuntimeError, match=r"env worker \(2 x splitrl/Catch-v0\) failed"):
            await worker.step(np.array([0, 1, 2]))  # 3 actions for 2 envs

    asyncio.run(run())


def test_a_killed_worker_ends_the_step_with_eof_and_closes_without_hanging(worker: WorkerVectorEnv) -> None:
    assert worker._process.pid is not None
    os.kill(worker._process.pid, signal.SIGKILL)
    worker._process.join(timeout=10)
    with pytest.raises((EOFError, BrokenPipeError, ConnectionResetError)):
        asyncio.run(asyncio.wait_for(worker.step(np.array([0, 1])), 10))
    worker.close()
