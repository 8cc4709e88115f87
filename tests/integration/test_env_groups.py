"""Double-buffered sampling: the environment's envs in groups, each on its own stream, stepped while others wait."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from splitrl.core import scrape
from splitrl.core.envs import make_vector_env
from splitrl.core.metrics import Metrics
from splitrl.environment.service import EnvironmentService
from splitrl.environment.settings import EnvironmentSettings
from tests.integration.stack import FAST_ENV, Stack


def test_grouping_keeps_every_env_on_its_own_seed() -> None:
    settings = EnvironmentSettings(env=FAST_ENV, frame_size=36, num_envs=5, env_groups=2, seed=7, tls="plaintext")
    service = EnvironmentService(settings, Metrics(CollectorRegistry()))
    whole = make_vector_env(FAST_ENV, {}, 5, 36, 1)
    try:
        assert [(first, envs.num_envs) for first, envs in service.groups] == [(0, 3), (3, 2)]
        grouped = np.concatenate([envs.reset(seed=7 + first)[0] for first, envs in service.groups])
        np.testing.assert_array_equal(grouped, whole.reset(seed=7)[0])
    finally:
        whole.close()
        for _, envs in service.groups:
            envs.close()


def test_more_groups_than_envs_is_refused() -> None:
    with pytest.raises(ValueError, match="env_groups=3 exceeds num_envs=2"):
        EnvironmentSettings(num_envs=2, env_groups=3)


@pytest.mark.parametrize("env_workers", [False, True], ids=["in-process", "env-workers"])
async def test_two_groups_stream_separately_and_count_every_step(env_workers: bool) -> None:
    environment = {"env_groups": 2, "env_workers": env_workers}
    stack = await Stack.start("split", num_envs=4, steps=400, unroll_length=8, width=256, environment=environment)
    try:
        await stack.wait_done()
        texts = stack.scrape()
    finally:
        await stack.stop()
    steps = scrape.total([texts["environment"]], "splitrl_env_steps_total")
    assert 400 <= steps <= 402  # the other group may finish the step it already had in flight
    # Each group is one Act stream of 2 envs: chunks are cut per stream, 2 per 8 vector steps of a group.
    assert scrape.total([texts["inference"]], "splitrl_inference_batch_size_count") > 0
    messages = scrape.link_totals(scrape.link_counts([texts["environment"]]), unit="messages")
    assert messages[("env-encoder", "rollout")] == steps / 2  # one EnvStep per group step of 2 envs
    # Workers' CPU and memory are exported beside the service's own process_* series.
    worker_cpu = scrape.total([texts["environment"]], "splitrl_worker_cpu_seconds")
    worker_bytes = scrape.total([texts["environment"]], "splitrl_worker_resident_memory_bytes")
    assert (worker_cpu > 0 and worker_bytes > 10 * 2**20) if env_workers else (worker_cpu == worker_bytes == 0)
    # The service's peak counts its workers' peaks too, so it is never below what it holds now.
    cost = scrape.process_cost(texts["environment"])
    worker_peak = scrape.total([texts["environment"]], "splitrl_worker_peak_resident_memory_bytes")
    assert (worker_peak >= worker_bytes) if env_workers else (worker_peak == 0)
    assert cost.resident_bytes <= cost.peak_resident_bytes
