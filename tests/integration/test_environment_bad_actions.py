"""The environment against an edge-encoder that answers with bad actions: each one drops that stream (counted
as a reconnect, with the reason in the log), the environment dials again, and it goes on stepping.

The edge here is a real gRPC server on a loopback port, scripted to answer the first EnvStep of stream k with
BAD_ACTIONS[k], then to act correctly."""

from __future__ import annotations

import asyncio
import logging

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from splitrl.core import scrape, wire
from splitrl.core.metrics import Metrics
from splitrl.environment.service import EnvironmentService
from splitrl.environment.settings import EnvironmentSettings
from splitrl.v1 import rollout_pb2, rollout_pb2_grpc
from tests.integration.stack import FAST_ENV, start

NUM_ENVS = 2
CATCH_ACTIONS = 3


def _actions(array: np.ndarray) -> wire.Tensor:
    return wire.encode(array)


#: (what is wrong, the actions message). Catch has 3 discrete actions (uint8 on the wire) and 2 envs.
BAD_ACTIONS: list[tuple[str, wire.Tensor]] = [
    ("out of range", _actions(np.array([0, CATCH_ACTIONS], dtype=np.uint8))),
    ("int64 where 3 choices cross as uint8", _actions(np.array([-1, 0], dtype=np.int64))),
    ("float for a discrete space", _actions(np.zeros(NUM_ENVS, dtype=np.float32))),
    ("one action for two envs", _actions(np.zeros(1, dtype=np.uint8))),
    ("truncated bytes", wire.Tensor(dtype=wire.DTYPE_UINT8, shape=[NUM_ENVS], data=b"\x00")),
    ("not zstd", wire.Tensor(dtype=wire.DTYPE_UINT8, shape=[NUM_ENVS], data=b"junk", compression=1)),
    ("bfloat16 (no numpy dtype)", wire.encode(np.zeros(NUM_ENVS, dtype=np.float32), wire.DTYPE_BFLOAT16)),
]


class ScriptedEdge(rollout_pb2_grpc.EdgeEncoderServicer):
    """Answers stream k's first step with BAD_ACTIONS[k] while any are left; otherwise always action 1."""

    def __init__(self) -> None:
        self.streams = 0
        self.good_steps = 0

    async def Rollout(self, request_iterator, context):
        stream = self.streams
        self.streams += 1
        async for step in request_iterator:
            if stream < len(BAD_ACTIONS):
                yield rollout_pb2.EnvAction(sequence=step.sequence, actions=BAD_ACTIONS[stream][1])
                continue
            self.good_steps += 1
            yield rollout_pb2.EnvAction(sequence=step.sequence, actions=_actions(np.ones(NUM_ENVS, dtype=np.uint8)))


@pytest.fixture
async def scripted_edge():
    edge = ScriptedEdge()
    server = grpc.aio.server()
    rollout_pb2_grpc.add_EdgeEncoderServicer_to_server(edge, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield edge, f"127.0.0.1:{port}"
    await server.stop(grace=None)


async def test_bad_actions_drop_the_stream_and_the_environment_goes_on(scripted_edge, caplog):
    edge, edge_address = scripted_edge
    settings = EnvironmentSettings(
        tls="plaintext",
        env=FAST_ENV,
        frame_size=36,
        num_envs=NUM_ENVS,
        encoder_address=edge_address,
        redial_initial_s=0.01,
        redial_max_s=0.02,
    )
    caplog.set_level(logging.INFO)
    host = await start(EnvironmentService, settings)
    try:
        for _ in range(500):  # bounded: about 10 s
            if edge.good_steps >= 20:
                break
            await asyncio.sleep(0.02)
        assert edge.streams == len(BAD_ACTIONS) + 1, caplog.text[-3000:]
        assert edge.good_steps >= 20
        assert host.service.failure() is None
        reconnects = scrape.total([scrape.fetch(host.metrics_port)], "splitrl_reconnects_total")
        assert reconnects == len(BAD_ACTIONS)
        for reason in ("action outside [0, 3)", "expected DTYPE_UINT8", "does not match expected", "needs 2"):
            assert reason in caplog.text, reason
    finally:
        await host.stop()


def test_a_continuous_action_with_nan_is_refused():
    """CarRacing's continuous actions: NaN or Inf never reaches the physics."""
    settings = EnvironmentSettings(tls="plaintext", env="CarRacing-v3", num_envs=2)
    service = EnvironmentService(settings, Metrics(CollectorRegistry()))
    good = rollout_pb2.EnvAction(sequence=4, actions=wire.encode(np.full((2, 3), 2.0, dtype=np.float32)))
    assert service._actions(good, 4, 2).tolist() == [[1.0, 1.0, 1.0]] * 2  # clipped into the box
    bad = rollout_pb2.EnvAction(sequence=4, actions=wire.encode(np.array([[0, np.nan, 0]] * 2, dtype=np.float32)))
    with pytest.raises(ValueError, match="NaN or Inf"):
        service._actions(bad, 4, 2)
