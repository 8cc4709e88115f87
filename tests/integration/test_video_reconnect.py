"""Cloud h264 across a restart of inference: the edge reopens its Act stream with fresh encoders, and the new
inference decodes from the first message (a keyframe), with no decode error, while the environment's stream
to the edge never breaks."""

from __future__ import annotations

import asyncio

import torch

from splitrl.core import rpc, scrape, wire
from splitrl.edge_encoder.service import EdgeEncoderService
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.inference.service import InferenceService
from splitrl.inference.settings import InferenceSettings
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import rollout_pb2, rollout_pb2_grpc
from tests.integration.stack import FAST_ENV, address, start

SIZE, ENVS = 36, 2
SHARED = {"env": FAST_ENV, "frame_size": SIZE, "width": 64, "tls": "plaintext", "mode": "cloud", "codec": "h264"}


def env_step(sequence: int) -> rollout_pb2.EnvStep:
    """Frames that change every step (a moving bar), so every packet after a keyframe depends on the last."""
    frames = torch.zeros(ENVS, SIZE, SIZE, dtype=torch.uint8)
    frames[:, :, sequence % SIZE] = 255
    return rollout_pb2.EnvStep(
        sequence=sequence, frames=wire.encode(frames), rewards=[0.0] * ENVS, terminated=[False] * ENVS,
        truncated=[False] * ENVS,
    )  # fmt: skip


def inference_settings(replay, port: int = 0) -> InferenceSettings:
    return InferenceSettings(**SHARED, port=port, replay_address=address(replay))


def received(host, name: str) -> float:
    return scrape.total([scrape.fetch(host.metrics_port)], name)


async def test_a_restarted_inference_decodes_the_edges_new_stream_from_its_keyframes():
    replay = await start(ReplayService, ReplaySettings(tls="plaintext"))
    inference = await start(InferenceService, inference_settings(replay))
    port = inference.grpc_port
    edge = await start(
        EdgeEncoderService,
        EdgeEncoderSettings(**SHARED, inference_address=address(inference), redial_initial_s=0.05, redial_max_s=0.2),
    )
    channel = rpc.insecure_channel(address(edge))
    call = rollout_pb2_grpc.EdgeEncoderStub(channel).Rollout()
    try:
        for sequence in range(10):
            await call.write(env_step(sequence))
            assert (await call.read()).sequence == sequence
        await inference.stop()
        inference = await start(InferenceService, inference_settings(replay, port))  # same port: the edge redials
        for sequence in range(10, 20):  # the first of these is held by the edge until the new stream answers
            await call.write(env_step(sequence))
            answer = await asyncio.wait_for(call.read(), timeout=30)
            assert answer.sequence == sequence
        assert received(inference, "splitrl_video_decode_errors_total") == 0
        assert received(inference, "splitrl_inference_batch_size_count") == 10  # every step after the restart
        assert received(edge, "splitrl_reconnects_total") >= 1
    finally:
        call.cancel()
        await channel.close()
        for host in (edge, inference, replay):
            await host.stop()
