"""Inference replicas: the edge spreads its environment streams over every replica, the learner keeps
each one on the newest weights, and the streams of a lost replica move to the others. Real gRPC servers on
loopback, from a run's plan with --inference-replicas."""

from __future__ import annotations

import asyncio

from splitrl.core import scrape
from splitrl.core.metrics import STREAMS_OPENED
from splitrl.inference.service import InferenceService
from splitrl.run.plan import amended, service_of
from tests.integration.stack import Stack, start

LEARNER = {"chunks_per_update": 4, "epochs": 1, "minibatches": 2, "max_policy_lag": 50}


def opened_per_replica(edge_text: str) -> dict[str, float]:
    """The edge's Act streams opened to each inference replica, by its address."""
    return {
        labels["replica"]: value
        for name, labels, value in scrape.samples(edge_text)
        if name == f"{STREAMS_OPENED}_total" and labels["service"] == "inference"
    }


async def test_streams_spread_evenly_over_three_replicas_and_each_serves_its_share() -> None:
    environment = {"env_groups": 9}
    stack = await Stack.start(
        "split", num_envs=9, steps=1800, unroll_length=8, width=64, environment=environment, inference_replicas=3
    )
    replicas = ["inference", "inference-1", "inference-2"]
    try:
        await _wait_for_steps(stack.hosts["environment"].metrics_port, 450)
        assert open_act_streams(stack) == dict.fromkeys(replicas, 3)  # 9 streams, exactly 1/3 each
        opened = opened_per_replica(stack.scrape()["edge-encoder"])
        assert sorted(opened.values()) == [3.0, 3.0, 3.0], opened  # placed evenly at once: nothing moved
        await stack.wait_done()
        texts = stack.scrape()
    finally:
        await stack.stop()
    rows = {name: scrape.total([texts[name]], "splitrl_inference_batch_size_sum") for name in replicas}
    steps = scrape.total([texts["environment"]], "splitrl_env_steps_total")
    assert sum(rows.values()) == steps  # every env step was acted on by exactly one replica
    for name in replicas:  # each replica served its third, within ±10%
        assert abs(rows[name] / steps - 1 / 3) <= 0.1 / 3, rows
        assert scrape.total([texts[name]], "splitrl_trajectories_total") > 0


async def test_every_replica_holds_the_learners_newest_version() -> None:
    stack = await Stack.start(
        "split",
        num_envs=4,
        steps=0,
        unroll_length=8,
        width=64,
        learner={**LEARNER, "max_updates": 4},
        environment={"env_groups": 2},
        inference_replicas=2,
    )
    try:
        await stack.wait_learner_done()
        learner = stack.hosts["learner"].service
        # The learner finished only once every replica acknowledged its last version (WeightsBroadcast.delivered).
        assert [inference.policy.version for inference in stack.inference_replicas] == [learner.version] * 2
        texts = stack.scrape()
        assert learner.version == 4
        assert scrape.total([texts["learner"]], "splitrl_stale_chunks_dropped_total") == 0  # lag stayed bounded
        weights_received = {
            name: scrape.link_counts([texts[name]])["learner-inference"]["weights"]["weights"]["received"]["messages"]
            for name in ("inference", "inference-1")
        }
        assert min(weights_received.values()) >= 1, weights_received  # each replica got weights on its own stream
    finally:
        await stack.stop()


async def test_a_lost_replicas_streams_move_to_the_other_and_come_back_when_it_returns() -> None:
    stack = await Stack.start(
        "split", num_envs=4, steps=0, unroll_length=8, width=64, environment={"env_groups": 4}, inference_replicas=2
    )
    try:
        environment_metrics = stack.hosts["environment"].metrics_port
        await _wait_for_steps(environment_metrics, 200)
        assert open_act_streams(stack) == {"inference": 2, "inference-1": 2}
        lost = stack.hosts.pop("inference-1")
        await lost.stop()
        steps_at_stop = scrape.total([scrape.fetch(environment_metrics)], "splitrl_env_steps_total")
        await _wait_for_steps(environment_metrics, steps_at_stop + 400)  # all four streams are served again...
        assert open_act_streams(stack) == {"inference": 4}  # ...by the survivor
        # The replica comes back at its address (as a restarted pod or process does): two streams move back.
        stack.hosts["inference-1"] = await start(InferenceService, amended(lost.settings, port=lost.grpc_port))
        for _ in range(300):  # bounded: 30 s
            if open_act_streams(stack) == {"inference": 2, "inference-1": 2}:
                break
            await asyncio.sleep(0.1)
        assert open_act_streams(stack) == {"inference": 2, "inference-1": 2}
        steps_at_return = scrape.total([scrape.fetch(environment_metrics)], "splitrl_env_steps_total")
        await _wait_for_steps(environment_metrics, steps_at_return + 400)
        assert stack.environment.failure() is None
        assert scrape.total([stack.scrape()["inference-1"]], "splitrl_inference_batch_size_sum") > 0
        opened = opened_per_replica(stack.scrape()["edge-encoder"])
        assert sum(opened.values()) >= 4 + 2 + 2, opened  # first streams, the lost replica's twice, moved back
    finally:
        await stack.stop()


def open_act_streams(stack: Stack) -> dict[str, int]:
    """Act streams each live inference instance serves now (its splitrl_streams_open gauge), by instance."""
    counts = {}
    for name, text in stack.scrape().items():
        if service_of(name) == "inference":
            for family, labels, value in scrape.samples(text):
                if family == "splitrl_streams_open" and labels["method"] == "Act" and value:
                    counts[name] = int(value)
    return counts


async def _wait_for_steps(metrics_port: int, steps: float, timeout_s: float = 60.0) -> None:
    """Poll the environment's env-step counter until it reaches `steps` (bounded by `timeout_s`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while scrape.total([scrape.fetch(metrics_port)], "splitrl_env_steps_total") < steps:
        assert loop.time() < deadline, f"the environment did not reach {steps} steps within {timeout_s} s"
        await asyncio.sleep(0.1)
