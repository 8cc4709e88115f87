"""Fuzzing every RPC's request path against real servers: the servers, and how a call is judged.

Every fuzzed call must end OK or with a client-error status carrying a message, never UNKNOWN / INTERNAL /
UNAVAILABLE, and the server must still answer a well-formed request afterwards (`fuzz_once`). The servers
(`hosts`) start once per module; each test's budget (`FUZZ`) is small so CI stays fast. The requests are built
in strategies.py; test_messages.py fuzzes with protobuf messages, test_raw_bytes.py with bytes that need not
parse.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from typing import Any

import grpc
import pytest_asyncio
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, settings

from splitrl.core import rpc, scrape, wire
from splitrl.core.config import VideoSettings
from splitrl.core.service import ServiceHost
from splitrl.core.video import VideoStreamEncoder
from splitrl.edge_encoder.service import EdgeEncoderService
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.inference.service import InferenceService
from splitrl.inference.settings import InferenceSettings
from splitrl.learner.service import LearnerService
from splitrl.learner.settings import LearnerSettings
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import (
    replay_pb2,
    replay_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    tensor_pb2,
    training_pb2,
    training_pb2_grpc,
)
from tests.integration.stack import FAST_ENV, address, start

WIDTH = 256
FRAME_SIZE = 36
FRAME_STACK = 4
CALL_TIMEOUT_S = 10.0
#: A refusal must be one of these; UNKNOWN / INTERNAL mean an unhandled exception, UNAVAILABLE a dead server.
CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
}
FUZZ = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def hosts():
    """Replay, split inference (width 256, 36x36 frames), its edge-encoder, a split learner's Train service, and
    a cloud inference that takes H.264 video ("video")."""
    shared: dict[str, Any] = {"env": FAST_ENV, "width": WIDTH, "frame_size": FRAME_SIZE, "tls": "plaintext"}
    started: dict[str, ServiceHost] = {}
    try:
        started["replay"] = await start(ReplayService, ReplaySettings(tls="plaintext"))
        started["inference"] = await start(
            InferenceService, InferenceSettings(**shared, mode="split", replay_address=address(started["replay"]))
        )
        started["video"] = await start(
            InferenceService,
            InferenceSettings(**shared, mode="cloud", codec="h264", replay_address=address(started["replay"])),
        )
        started["edge"] = await start(
            EdgeEncoderService,
            EdgeEncoderSettings(
                **shared, mode="split", inference_address=address(started["inference"]), learner_address="127.0.0.1:1"
            ),
        )
        # The learner's own loop dials nothing reachable: only its EncoderTraining server is under test.
        started["learner"] = await start(
            LearnerService,
            LearnerSettings(**shared, mode="split", replay_address="127.0.0.1:1", inference_address="127.0.0.1:1"),
        )
        # Nothing may import on a server's thread while hypothesis runs: describing a lambda strategy iterates
        # sys.modules unguarded ("dictionary changed size during iteration", seen in CI). The
        # learner builds its trainer on its training thread (torch.optim imports torch._dynamo, ~800 modules),
        # and the video inference imports PyAV at its first packet, so both happen here first.
        await asyncio.wait_for(started["learner"].service.ready(), 120)
        importlib.import_module("av")
        yield started
    finally:
        for name in ("learner", "edge", "video", "inference", "replay"):
            if name in started:
                await started[name].stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def channels(hosts):
    opened = {name: rpc.insecure_channel(address(host)) for name, host in hosts.items()}
    yield opened
    for channel in opened.values():
        await channel.close()


# -- calling and checking ------------------------------------------------------------------------------


async def outcome(call: Any) -> tuple[grpc.StatusCode, str]:
    """Drain a call (unary or streaming) and return how it ended."""
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    return await call.code(), await call.details() or ""


def assert_clean(code: grpc.StatusCode, details: str) -> None:
    assert code == grpc.StatusCode.OK or code in CLIENT_ERRORS, f"{code.name}: {details}"
    if code != grpc.StatusCode.OK:
        assert details.strip(), f"{code.name} without a message"


def activation_step(n: int = 2) -> rollout_pb2.ActRequest:
    observations = wire.encode(torch.rand(n, WIDTH), wire.DTYPE_BFLOAT16)
    return rollout_pb2.ActRequest(
        observations=observations, rewards=[0.0] * n, terminated=[False] * n, truncated=[False] * n, first_step_id=0
    )


async def still_serves(channels: dict[str, grpc.aio.Channel], name: str) -> None:
    """The fuzzed server answers its health check and one well-formed request of its own kind."""
    health = health_pb2_grpc.HealthStub(channels[name])
    status = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=CALL_TIMEOUT_S)
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    if name == "replay":
        info = await replay_pb2_grpc.ReplayStub(channels[name]).Info(replay_pb2.InfoRequest(), timeout=CALL_TIMEOUT_S)
        assert [t.name for t in info.tables] == ["rollouts"]
    elif name == "inference":
        call = rollout_pb2_grpc.InferenceStub(channels[name]).Act(
            iter([activation_step()]), metadata=(("splitrl-codec", "activation"),), timeout=CALL_TIMEOUT_S
        )
        answers = [wire.decode(response.actions).shape async for response in call]
        assert answers == [(2,)]
    elif name == "video":  # a new stream from a fresh encoder decodes, whatever the last one sent
        call = rollout_pb2_grpc.InferenceStub(channels[name]).Act(
            iter([video_step(2)]), metadata=VIDEO, timeout=CALL_TIMEOUT_S
        )
        answers = [wire.decode(response.actions).shape async for response in call]
        assert answers == [(2,)]
    elif name == "edge":
        frames = wire.encode(torch.zeros(1, FRAME_SIZE, FRAME_SIZE, dtype=torch.uint8))
        step = rollout_pb2.EnvStep(frames=frames, rewards=[0.0], terminated=[False], truncated=[False])
        call = rollout_pb2_grpc.EdgeEncoderStub(channels[name]).Rollout(iter([step]), timeout=CALL_TIMEOUT_S)
        answers = [wire.decode(action.actions).shape async for action in call]
        assert answers == [(1,)]
    elif name == "learner":
        hello = training_pb2.EdgeHello(step_id_prefix=7, edge_id="check", width=WIDTH)
        call = training_pb2_grpc.EncoderTrainingStub(channels[name]).Train(
            iter([training_pb2.EdgeMessage(hello=hello)]), timeout=CALL_TIMEOUT_S
        )
        assert await outcome(call) == (grpc.StatusCode.OK, "")


VIDEO = (("splitrl-codec", "video"),)


def video_step(n: int, observations: tensor_pb2.Tensor | None = None) -> rollout_pb2.ActRequest:
    """One step of a video stream: by default n envs' first frames, each a keyframe of a fresh encoder."""
    if observations is None:
        frames = torch.zeros(n, FRAME_SIZE, FRAME_SIZE, dtype=torch.uint8)
        observations = VideoStreamEncoder(FRAME_SIZE, VideoSettings()).encode(frames)
    return rollout_pb2.ActRequest(
        observations=observations, rewards=[0.0] * n, terminated=[False] * n, truncated=[False] * n, first_step_id=0
    )


#: What grpc.aio's client reports when it writes a message just as the server ends the call: the server's own
#: status is lost on the client, so the server's rejected counter is checked instead.
CLIENT_WRITE_RACE = (grpc.StatusCode.INTERNAL, "Internal error from Core")


def rejected(host: ServiceHost) -> float:
    return scrape.total([scrape.fetch(host.metrics_port)], "splitrl_rejected_requests_total")


async def fuzz_once(
    hosts: dict[str, ServiceHost], channels: dict[str, grpc.aio.Channel], name: str, make_call: Callable[[], Any]
) -> None:
    before = rejected(hosts[name])
    code, details = await outcome(make_call())
    if (code, details) == CLIENT_WRITE_RACE:
        assert rejected(hosts[name]) > before, "the client saw its write fail, but the server refused nothing"
    else:
        assert_clean(code, details)
    await still_serves(channels, name)
