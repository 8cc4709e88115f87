"""Content a peer may send in form but not in substance: replay refuses chunks no run of its spec could make
(INVALID_ARGUMENT with the reason, counted) before storing or acknowledging them, and goes on serving."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from splitrl.core import rpc, scrape
from splitrl.core.metrics import Metrics
from splitrl.core.service import ServiceHost
from splitrl.core.spec import ActionSpec
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import replay_pb2, replay_pb2_grpc
from tests.chunks import chunk_of

FEATURES = 4


def chunk(**fields) -> replay_pb2.Trajectory:
    """A well-formed 3-step chunk of [FEATURES] observations and 3 discrete actions, with `fields` replaced."""
    tensors = chunk_of(torch.zeros(4, FEATURES, dtype=torch.uint8))
    tensors.actions = torch.tensor([0, 1, 2])
    tensors.behaviour_log_probs = torch.full((3,), -1.1)
    for name, value in fields.items():
        setattr(tensors, name, value)
    return tensors.to_proto()


POISON = {
    "action outside the action space": (chunk(actions=torch.tensor([0, 3, 1])), "indices in [0, 3)"),
    "negative action": (chunk(actions=torch.tensor([0, -1, 1])), "indices in [0, 3)"),
    "continuous actions for a discrete space": (
        chunk(actions=torch.zeros(3, 3)),
        "this run acts with 3 discrete actions",
    ),
    "NaN reward": (chunk(rewards=torch.tensor([0.0, float("nan"), 0.0])), "rewards holds NaN"),
    "absurd reward": (chunk(rewards=torch.tensor([0.0, 1e30, 0.0])), "rewards holds |1e+30|"),
    "infinite value": (chunk(values=torch.full((4,), float("inf"))), "values holds NaN or Inf"),
    "absurd value": (chunk(values=torch.full((4,), 1e12)), "values holds |1e+12|"),
    "a probability above 1": (chunk(behaviour_log_probs=torch.full((3,), 0.5)), "not a discrete probability"),
    "NaN log-probability": (chunk(behaviour_log_probs=torch.full((3,), float("nan"))), "log_probs holds NaN"),
    # exp(new - old) of PPO's ratio would overflow float32 and lose every step that reads it
    "a log-probability no sampled action has": (chunk(behaviour_log_probs=torch.full((3,), -100.0)), "|100|"),
    "negative version": (chunk(policy_versions=torch.tensor([0, -5, 0])), "policy_versions holds negative"),
    "observations of another shape": (
        chunk_of(torch.zeros(4, FEATURES + 1, dtype=torch.uint8)).to_proto(),
        f"this run's are [{FEATURES}]",
    ),
}


async def insert(channel: grpc.aio.Channel, trajectory: replay_pb2.Trajectory) -> replay_pb2.InsertResponse:
    call = replay_pb2_grpc.ReplayStub(channel).Insert()
    await call.write(replay_pb2.InsertRequest(table="rollouts", trajectory=trajectory))
    try:
        return await asyncio.wait_for(call.read(), 5)
    finally:
        call.cancel()


async def test_replay_refuses_poisonous_chunks_before_storing_them_and_keeps_serving():
    settings = ReplaySettings(
        tls="plaintext",
        action_space=ActionSpec("discrete", 3),
        observation_shape=[FEATURES],
        max_abs_reward=1e3,
    )
    metrics = Metrics(CollectorRegistry())
    host = await ServiceHost.start(ReplayService(settings, metrics), settings, metrics)
    try:
        async with rpc.insecure_channel(f"127.0.0.1:{host.grpc_port}") as channel:
            for case, (trajectory, reason) in POISON.items():
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await insert(channel, trajectory)
                assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, case
                assert reason in error.value.details(), (case, error.value.details())
            assert (await insert(channel, chunk())).key == 0  # the next good chunk is the first stored
        text = generate_latest(metrics.registry).decode()
        refused = [
            value
            for name, labels, value in scrape.samples(text)
            if name == "splitrl_rejected_requests_total" and labels == {"method": "Insert", "code": "INVALID_ARGUMENT"}
        ]
        assert refused == [len(POISON)]
        assert scrape.total([text], "splitrl_replay_inserts_total") == 1
    finally:
        await host.stop()


def test_settings_take_the_action_space_and_shape_as_json_and_name_a_bad_one():
    settings = ReplaySettings.model_validate(
        {
            "tls": "plaintext",
            "action_space": '{"kind": "continuous", "size": 2, "low": [-1, 0], "high": [1, 1]}',
            "observation_shape": "[4, 96, 96]",
        }
    )
    limits = settings.chunk_limits()
    assert limits.action_spec == ActionSpec("continuous", 2, (-1.0, 0.0), (1.0, 1.0))
    assert limits.observation_shape == (4, 96, 96)
    with pytest.raises(ValueError, match="action_space must be JSON"):
        ReplaySettings.model_validate({"tls": "plaintext", "action_space": "{discrete"})


async def test_a_chunk_replay_refuses_is_dropped_and_the_writer_goes_on():
    """Replay reads a writer's chunks in order: one it refuses, sent again, would be refused again and hold back
    every chunk after it. Inference's writer drops that one (counted, logged) and delivers the rest."""
    from splitrl.core.config import TransportSettings
    from splitrl.inference.replay_writer import ReplayWriter

    settings = ReplaySettings(tls="plaintext", action_space=ActionSpec("discrete", 3))
    replay_metrics = Metrics(CollectorRegistry())
    host = await ServiceHost.start(ReplayService(settings, replay_metrics), settings, replay_metrics)
    metrics = Metrics(CollectorRegistry())
    writer = ReplayWriter(f"127.0.0.1:{host.grpc_port}", "rollouts", metrics, 8, TransportSettings(tls="plaintext"))
    task = asyncio.create_task(writer.run())
    try:
        await writer.put(chunk())
        await writer.put(chunk(actions=torch.tensor([0, 9, 1])))
        await writer.put(chunk())
        assert await writer.flush(timeout_s=20)
        assert not task.done(), "the writer stopped"
        assert writer.acknowledged == 2
        text = generate_latest(metrics.registry).decode()
        dropped = scrape.samples(text)
        assert [v for n, labels, v in dropped if n == "splitrl_trajectory_chunks_dropped_total"] == [1.0]
        assert scrape.total([generate_latest(replay_metrics.registry).decode()], "splitrl_replay_inserts_total") == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await host.stop()
