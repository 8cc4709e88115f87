"""Resume after a restart: the learner's checkpoint reaches a fresh inference; the edge keeps its trained encoder."""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from splitrl.core import checkpoint
from splitrl.core.metrics import Metrics
from splitrl.edge_encoder.service import EdgeEncoderService
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.inference.service import InferenceService
from splitrl.inference.settings import InferenceSettings
from splitrl.learner.service import LearnerService
from splitrl.learner.settings import LearnerSettings
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from tests.integration.stack import FAST_ENV, Stack, address, start

TLS: dict[str, Any] = {"tls": "plaintext"} if "tls" in ReplaySettings.model_fields else {}
LEARNER = {"chunks_per_update": 4, "epochs": 1, "minibatches": 2, "max_policy_lag": 50}


async def test_restarted_learner_and_edge_resume_and_inference_picks_up_the_weights(tmp_path):
    learner_dir, edge_dir = tmp_path / "learner", tmp_path / "edge"
    learner_settings = {**LEARNER, "checkpoint_dir": learner_dir, "checkpoint_every": 1, "max_updates": 2}
    stack = await Stack.start(
        "split", num_envs=2, unroll_length=8, learner=learner_settings, edge={"checkpoint_dir": edge_dir}
    )
    try:
        await stack.wait_learner_done(120)
        first = stack.hosts["learner"].service
        edge = stack.hosts["edge-encoder"].service
        assert first.version == 2 and first.samples_consumed >= 8
    finally:
        await stack.stop()  # the edge saves its encoder on the way down
    trained = {name: value.clone() for name, value in first.trainer.network.state_dict().items()}
    saved = checkpoint.load(learner_dir / "learner.pt")
    assert saved is not None and saved["replay"]["samples_consumed"] == first.samples_consumed

    # The edge restarts: same encoder weights and version, not the seed weights.
    assert edge.trainer.version > 0
    restarted_edge = EdgeEncoderService(
        EdgeEncoderSettings(**TLS, env=FAST_ENV, mode="split", checkpoint_dir=edge_dir), Metrics(CollectorRegistry())
    )
    assert restarted_edge.trainer.version == edge.trainer.version
    for name, value in restarted_edge.trainer.encoder.state_dict().items():
        assert torch.equal(value, edge.trainer.encoder.state_dict()[name]), name

    # A fresh replay and inference (policy version 0), and the learner restarted on its checkpoint_dir.
    replay = await start(ReplayService, ReplaySettings(**TLS))
    inference = await start(
        InferenceService, InferenceSettings(**TLS, env=FAST_ENV, mode="split", replay_address=address(replay))
    )
    learner = None
    try:
        assert inference.service.policy.version == 0
        learner = await start(
            LearnerService,
            LearnerSettings(
                **TLS,
                **LEARNER,
                env=FAST_ENV,
                mode="split",
                checkpoint_dir=learner_dir,
                replay_address=address(replay),
                inference_address=address(inference),
            ),
        )
        resumed = learner.service
        await resumed.ready()  # the trainer is built, and the checkpoint restored, once the learner serves
        assert (resumed.version, resumed.samples_consumed) == (2, first.samples_consumed)
        assert torch.equal(resumed.trainer.generator.get_state(), first.trainer.generator.get_state())
        for _ in range(200):  # bounded: at most ~20 s
            if inference.service.policy.version == 2:
                break
            await asyncio.sleep(0.1)
        assert inference.service.policy.version == 2, "inference did not pick up the resumed learner's weights"
        for name, value in inference.service.policy.network.state_dict().items():
            assert torch.equal(value, trained[name]), name
    finally:
        for host in (learner, inference, replay):
            if host is not None:
                await host.stop()
