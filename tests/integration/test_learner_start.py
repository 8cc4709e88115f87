"""The learner serves as soon as its port is open; its trainer (Adam, whose first parameters import
torch._dynamo, and the checkpoint) is built on the training thread meanwhile, so a restarted learner answers
edges and health checks without waiting for it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitrl.core import rpc
from splitrl.learner.service import LearnerService
from splitrl.learner.settings import LearnerSettings
from tests.integration.stack import FAST_ENV, address, start

pytestmark = pytest.mark.asyncio

#: Nothing listens on port 1: the learner only waits for replay and inference here.
SETTINGS = LearnerSettings(
    tls="plaintext", env=FAST_ENV, mode="split", replay_address="127.0.0.1:1", inference_address="127.0.0.1:1"
)


async def _health(host: Any) -> int:
    async with rpc.insecure_channel(address(host)) as channel:
        request = health_pb2.HealthCheckRequest(service="splitrl.v1.EncoderTraining")
        return (await health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)).status


async def test_the_learner_serves_while_its_trainer_is_being_built(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    build = LearnerService._build_trainer

    def slow_build(service: LearnerService) -> None:
        assert release.wait(30), "the test never released the build"
        build(service)

    monkeypatch.setattr(LearnerService, "_build_trainer", slow_build)
    learner = await start(LearnerService, SETTINGS)
    try:
        assert await _health(learner) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(RuntimeError, match="still being built"):
            learner.service.trainer  # noqa: B018
        release.set()
        await asyncio.wait_for(learner.service.ready(), 30)
        assert learner.service.trainer.optimizer.param_groups  # built, on the service's own network
        assert learner.service.failure() is None
    finally:
        release.set()
        await learner.stop()


async def test_a_trainer_that_cannot_be_built_fails_the_learner(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_build(service: LearnerService) -> None:
        raise OSError("checkpoint unreadable")

    monkeypatch.setattr(LearnerService, "_build_trainer", broken_build)
    learner = await start(LearnerService, SETTINGS)
    try:
        await asyncio.wait_for(learner.service.finished().wait(), 30)
        assert isinstance(learner.service.failure(), OSError)
        with pytest.raises(OSError, match="checkpoint unreadable"):
            await learner.service.ready()
    finally:
        await learner.stop()
