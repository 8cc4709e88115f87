"""The learner service's guards around its trainer: no checkpoint of non-finite weights, and no sampled chunk
its run could not have made."""

from __future__ import annotations

import torch

from splitrl.learner.settings import LearnerSettings

WIDTH = 16


def test_the_learner_never_writes_a_checkpoint_of_non_finite_weights(tmp_path):
    from prometheus_client import CollectorRegistry

    from splitrl.core import checkpoint
    from splitrl.core.metrics import Metrics
    from splitrl.learner.service import LearnerService

    settings = LearnerSettings(mode="cloud", tls="plaintext", env="splitrl/Catch-v0", checkpoint_dir=tmp_path)
    service = LearnerService(settings, Metrics(CollectorRegistry()))
    service._build_trainer()
    service.version = 3
    service._checkpoint()
    path = tmp_path / "learner.pt"
    good = checkpoint.load(path)
    with torch.no_grad():
        next(service.trainer.network.parameters()).fill_(float("nan"))
    service.version = 4
    service._checkpoint()
    kept = checkpoint.load(path)
    assert kept["version"] == 3 and all(
        torch.equal(kept["network"][name], value) for name, value in good["network"].items()
    )


async def test_the_learner_refuses_a_sampled_chunk_no_run_makes_and_trains_on_the_rest():
    """Replay started without the run's spec stores any action index and observation shape: the learner, which
    knows both, drops such a chunk (counted) instead of crashing on it."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from splitrl.core.metrics import Metrics
    from splitrl.learner.service import LearnerService
    from tests.chunks import chunk_of

    settings = LearnerSettings(mode="split", tls="plaintext", env="splitrl/Catch-v0", width=WIDTH)
    metrics = Metrics(CollectorRegistry())
    service = LearnerService(settings, metrics)
    good, bad = (
        chunk_of(torch.zeros(3, WIDTH, dtype=torch.bfloat16)),
        chunk_of(torch.zeros(3, WIDTH, dtype=torch.bfloat16)),
    )
    bad.actions = torch.tensor([0, 7])
    wide = chunk_of(torch.zeros(3, WIDTH + 1, dtype=torch.bfloat16))  # would break the batch's stacking
    items = [SimpleNamespace(key=key, trajectory=chunk.to_proto()) for key, chunk in enumerate((bad, wide, good))]

    class Replay:
        async def sample(self, count):
            return [(items.pop(0), None) for _ in range(min(count, len(items)))]

    chunks, _ = await service._collect(Replay(), 1)
    assert len(chunks) == 1 and torch.equal(chunks[0].actions, good.actions)
    assert metrics.refused_chunks._value.get() == 2
