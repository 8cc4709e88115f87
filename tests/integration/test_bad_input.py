"""Malformed input gets a clear gRPC status, is counted, and the server keeps serving."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitrl.core import rpc, scrape, wire
from splitrl.edge_encoder.service import EdgeEncoderService
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.inference.service import InferenceService
from splitrl.inference.settings import InferenceSettings
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import replay_pb2, replay_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from tests.integration.stack import FAST_ENV, address, start

WIDTH = 4096
ACTIVATION = (("splitrl-codec", "activation"),)


@pytest.fixture
async def cloud_side():
    """Replay and a split-mode inference, as the edge sees them."""
    replay = await start(ReplayService, ReplaySettings(tls="plaintext"))
    inference = await start(
        InferenceService, InferenceSettings(tls="plaintext", env=FAST_ENV, mode="split", replay_address=address(replay))
    )
    channel = rpc.insecure_channel(address(inference))
    yield inference, replay, channel
    await channel.close()
    await inference.stop()
    await replay.stop()


def act_request(n: int = 2, data: bytes | None = None) -> rollout_pb2.ActRequest:
    observations = wire.encode(torch.rand(n, WIDTH), wire.DTYPE_BFLOAT16)
    if data is not None:
        observations.data = data
    return rollout_pb2.ActRequest(
        observations=observations,
        rewards=[0.0] * n,
        terminated=[False] * n,
        truncated=[False] * n,
        first_step_id=0,
    )


def coded_rewards(codes: bytes, *new_rewards: float) -> Callable[[rollout_pb2.ActRequest], None]:
    """A mutation: the request's rewards in the coded form (core.lockstep.RewardBook), as given."""

    def mutate(request: rollout_pb2.ActRequest) -> None:
        request.ClearField("rewards")
        request.reward_codes = codes
        request.new_rewards[:] = new_rewards

    return mutate


async def one_exchange(channel, request, metadata=ACTIVATION):
    call = rollout_pb2_grpc.InferenceStub(channel).Act(metadata=metadata)
    await call.write(request)
    return await call.read()


async def assert_still_serves(channel) -> None:
    response = await one_exchange(channel, act_request())
    assert wire.decode(response.actions).shape == (2,)


async def expect_status(code: grpc.StatusCode, coroutine) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await coroutine
    assert raised.value.code() == code, raised.value.details()
    return raised.value.details()


@pytest.mark.parametrize("codec", wire.FLOAT_CODECS)
async def test_split_inference_accepts_activations_in_every_float_codec(cloud_side, codec):
    _, _, channel = cloud_side
    request = act_request()
    request.observations.CopyFrom(wire.encode_float(torch.rand(2, WIDTH), codec))
    response = await one_exchange(channel, request)
    assert wire.decode(response.actions).shape == (2,)


async def test_truncated_tensor_is_invalid_argument_and_server_keeps_serving(cloud_side):
    inference, _, channel = cloud_side
    details = await expect_status(
        grpc.StatusCode.INVALID_ARGUMENT, one_exchange(channel, act_request(data=b"\x00" * 100))
    )
    assert "100 bytes" in details and "16384" in details
    await assert_still_serves(channel)
    rejected = scrape.total([scrape.fetch(inference.metrics_port)], "splitrl_rejected_requests_total")
    assert rejected == 1


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda r: r.observations.ClearField("shape") or r.observations.shape.extend([2, 1000]), "shape"),
        (lambda r: setattr(r.observations, "dtype", 99), "unsupported tensor dtype"),
        (lambda r: setattr(r.observations, "dtype", wire.DTYPE_INT64), "DTYPE_INT64 is not a float encoding"),
        (
            lambda r: (
                r.observations.CopyFrom(wire.encode_float(torch.rand(2, WIDTH), "int8+zstd"))
                or setattr(r.observations, "row_scale_bf16", r.observations.row_scale_bf16[:2] + b"\x80\x7f")
            ),
            "row_scale_bf16 holds a negative, NaN or Inf",
        ),
        (lambda r: setattr(r.observations, "compression", wire.COMPRESSION_ZSTD), "not a zstd frame"),
        (lambda r: r.observations.shape.__setitem__(0, -2), "negative"),
        (
            coded_rewards(b"\x02\x00", 2.0),
            "names slot 2; this stream has filled 0",  # slot 1 fills at the second env, slot 2 never
        ),
        (lambda r: setattr(r, "reward_codes", b"\x00\x00"), "both rewards and reward_codes"),
        (
            coded_rewards(b"\x00\x00", 2.0),
            "2 zero codes for 1 new_rewards",
        ),
        (
            coded_rewards(b"\x00", 2.0),
            "reward_codes has 1 codes for 2 envs",
        ),
        (
            coded_rewards(b"\x00\x01", float("inf")),
            "rewards holds NaN or Inf",
        ),
        (lambda r: r.rewards.append(1.0), "rewards has 3 entries for 2 envs"),
        (lambda r: r.rewards.__setitem__(0, float("inf")), "rewards holds NaN or Inf"),
        (lambda r: r.rewards.__setitem__(1, -2e6), "reward of |2e+06|, above --max-abs-reward"),
        (lambda r: setattr(r, "first_step_id", 2**63 - 1), "below 2**63"),  # its 2nd row is 2**63
        (lambda r: setattr(r, "step_id_advance", 4), "first ActRequest sets first_step_id, not step_id_advance"),
        (lambda r: r.ClearField("first_step"), "neither first_step_id nor step_id_advance"),
        (
            lambda r: r.observations.CopyFrom(wire.encode(torch.full((2, WIDTH), float("nan")), wire.DTYPE_BFLOAT16)),
            "NaN",
        ),
        (
            # finite but absurd: bf16 2**121 once reached the value loss as -3.2e35 and made it infinite
            lambda r: r.observations.CopyFrom(wire.encode(torch.full((2, WIDTH), 2.0**121), wire.DTYPE_BFLOAT16)),
            "beyond this link's bound 6.55e+04",
        ),
        (
            lambda r: r.observations.CopyFrom(wire.encode_float(torch.full((2, WIDTH), 1e6), "int8")),
            "|value| 9.997e+05, beyond this link's bound",  # 1e6 through a bfloat16 scale
        ),
    ],
    ids=[
        "wrong-width",
        "unknown-dtype",
        "wrong-dtype",
        "bad-row-scale",
        "not-zstd",
        "negative-dim",
        "reward-slot-unfilled",
        "reward-both-forms",
        "reward-codes-vs-values",
        "reward-codes-short",
        "reward-coded-inf",
        "ragged",
        "inf-reward",
        "absurd-reward",
        "huge-step-id",
        "advance-first",
        "no-step-id",
        "nan",
        "absurd-bf16",
        "absurd-int8-scale",
    ],
)
async def test_each_malformed_act_request_is_refused_clearly(cloud_side, mutate, fragment):
    _, _, channel = cloud_side
    request = act_request()
    mutate(request)
    details = await expect_status(grpc.StatusCode.INVALID_ARGUMENT, one_exchange(channel, request))
    assert fragment in details
    await assert_still_serves(channel)


@pytest.mark.parametrize(
    ("advance", "fragment"), [(2**64 - 1, "is not below 2**63"), (0, "step_id_advance is 0; step ids only grow")]
)
async def test_a_bad_step_id_advance_after_a_good_message_is_refused_clearly(cloud_side, advance, fragment):
    _, _, channel = cloud_side
    call = rollout_pb2_grpc.InferenceStub(channel).Act(metadata=ACTIVATION)
    await call.write(act_request())
    await call.read()
    second = act_request()
    second.step_id_advance = advance
    await call.write(second)
    details = await expect_status(grpc.StatusCode.INVALID_ARGUMENT, call.read())
    assert fragment in details
    await assert_still_serves(channel)


async def test_stream_with_the_wrong_codec_is_refused(cloud_side):
    _, _, channel = cloud_side
    details = await expect_status(
        grpc.StatusCode.FAILED_PRECONDITION,
        one_exchange(channel, act_request(), metadata=(("splitrl-codec", "frame"),)),
    )
    assert "expects codec 'activation'" in details
    await assert_still_serves(channel)


async def test_oversize_message_is_refused_by_the_server_which_keeps_serving(cloud_side):
    inference, _, channel = cloud_side
    huge = act_request(data=b"\x00" * (rpc.MAX_MESSAGE_BYTES + 1))
    # A raw client with gRPC's default (unlimited) send size: only the server's limit stands in the way.
    async with grpc.aio.insecure_channel(address(inference)) as raw:
        details = await expect_status(grpc.StatusCode.RESOURCE_EXHAUSTED, one_exchange(raw, huge))
    assert "larger than max" in details
    await assert_still_serves(channel)


async def test_replay_refuses_bad_trajectories_and_unknown_tables(cloud_side):
    _, replay, _ = cloud_side
    async with rpc.insecure_channel(address(replay)) as channel:
        stub = replay_pb2_grpc.ReplayStub(channel)

        async def insert(request):
            call = stub.Insert()
            await call.write(request)
            return await call.read()

        details = await expect_status(
            grpc.StatusCode.INVALID_ARGUMENT,
            insert(replay_pb2.InsertRequest(table="rollouts", trajectory=replay_pb2.Trajectory())),
        )
        assert "Trajectory.observations is missing" in details
        details = await expect_status(grpc.StatusCode.INVALID_ARGUMENT, insert(replay_pb2.InsertRequest(table="nope")))
        assert "unknown table 'nope'" in details
        details = await expect_status(
            grpc.StatusCode.INVALID_ARGUMENT,
            stub.Sample(replay_pb2.SampleRequest(table="rollouts", num_items=0), timeout=5),
        )
        assert "num_items" in details
        info = await stub.Info(replay_pb2.InfoRequest(), timeout=5)
        assert [(t.name, t.size) for t in info.tables] == [("rollouts", 0)]


async def test_edge_encoder_refuses_bad_frames():
    # The edge-encoder's inference is never reached: validation fails first.
    settings = EdgeEncoderSettings(tls="plaintext", env=FAST_ENV, mode="split", inference_address="127.0.0.1:1")
    edge = await start(EdgeEncoderService, settings)
    try:
        async with rpc.insecure_channel(address(edge)) as channel:
            call = rollout_pb2_grpc.EdgeEncoderStub(channel).Rollout()
            frames = wire.encode(torch.zeros(2, 64, 64, dtype=torch.uint8))
            await call.write(rollout_pb2.EnvStep(frames=frames, rewards=[0, 0], terminated=[0, 0], truncated=[0, 0]))
            details = await expect_status(grpc.StatusCode.INVALID_ARGUMENT, call.read())
            assert "[2, 64, 64] does not match expected ['*', 96, 96]" in details
            health = health_pb2_grpc.HealthStub(channel)
            status = await health.Check(health_pb2.HealthCheckRequest(service="splitrl.v1.EdgeEncoder"), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await edge.stop()


async def test_sample_on_an_empty_table_answers_empty_before_the_deadline(cloud_side):
    _, replay, _ = cloud_side
    async with rpc.insecure_channel(address(replay)) as channel:
        stub = replay_pb2_grpc.ReplayStub(channel)
        for _ in range(3):
            response = await stub.Sample(replay_pb2.SampleRequest(table="rollouts", num_items=4), timeout=1.5)
            assert list(response.items) == []


async def test_edge_encoder_passes_inference_status_through():
    # An edge in split mode dialling a cloud-mode inference: inference refuses, the environment learns why.
    replay = await start(ReplayService, ReplaySettings(tls="plaintext"))
    inference = await start(
        InferenceService, InferenceSettings(tls="plaintext", env=FAST_ENV, mode="cloud", replay_address=address(replay))
    )
    edge = await start(
        EdgeEncoderService,
        EdgeEncoderSettings(tls="plaintext", env=FAST_ENV, mode="split", inference_address=address(inference)),
    )
    try:
        async with rpc.insecure_channel(address(edge)) as channel:
            call = rollout_pb2_grpc.EdgeEncoderStub(channel).Rollout()
            frames = wire.encode(torch.zeros(1, 96, 96, dtype=torch.uint8))
            await call.write(rollout_pb2.EnvStep(frames=frames, rewards=[0], terminated=[0], truncated=[0]))
            details = await expect_status(grpc.StatusCode.FAILED_PRECONDITION, call.read())
            assert details.startswith("inference: ") and "expects codec 'frame'" in details
    finally:
        for host in (edge, inference, replay):
            await host.stop()


async def test_a_layernorm_split_refuses_activations_beyond_sqrt_width():
    replay = await start(ReplayService, ReplaySettings(tls="plaintext"))
    inference = await start(
        InferenceService,
        InferenceSettings(
            tls="plaintext", env=FAST_ENV, mode="split", bottleneck="layernorm", replay_address=address(replay)
        ),
    )
    channel = rpc.insecure_channel(address(inference))
    try:
        healthy = act_request()
        healthy.observations.CopyFrom(wire.encode_float(torch.randn(2, WIDTH).clamp(-60, 60), "bf16"))
        assert wire.decode((await one_exchange(channel, healthy)).actions).shape == (2,)
        inflated = act_request()  # a new stream
        inflated.observations.CopyFrom(wire.encode_float(torch.full((2, WIDTH), 100.0), "bf16"))
        details = await expect_status(grpc.StatusCode.INVALID_ARGUMENT, one_exchange(channel, inflated))
        assert "bound 64.6" in details  # sqrt(4095) * 1.01
    finally:
        await channel.close()
        await inference.stop()
        await replay.stop()
