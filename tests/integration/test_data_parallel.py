"""Data-parallel learners: ranks in real processes, meeting over a real TCPStore with gloo.

Each rank trains on its own batch; after every update the ranks hold identical weights, and those weights
are what one learner gets from the mean gradient of both batches, not what either batch alone gives.
"""

from __future__ import annotations

import pytest
import torch

from splitrl.core.models import cloud_network
from splitrl.core.spec import ActionSpec, ModelConfig
from splitrl.learner.batch import Batch
from splitrl.learner.distributed import DataParallel, weights_checksum
from splitrl.learner.settings import LearnerSettings
from splitrl.learner.trainer import Trainer
from tests.chunks import training_batch
from tests.integration.ranks import run_ranks

CHUNKS, HORIZON = 2, 8
SPEC = ActionSpec("discrete", 3)
MODEL = ModelConfig(2, 36, 16, "relu")
SETTINGS = {"mode": "cloud", "epochs": 2, "minibatches": 2, "chunks_per_update": 2, "tls": "plaintext"}


def batch(seed: int) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (CHUNKS, HORIZON + 1, 2, 36, 36), dtype=torch.uint8, generator=generator)
    return training_batch(frames, seed=seed)


def trainer(world_size: int, rank: int = 0) -> Trainer:
    torch.manual_seed(0)  # identical initial weights, as every learner builds them from the run's seed
    settings = LearnerSettings(**SETTINGS, world_size=world_size, rank=rank)
    return Trainer(cloud_network("cloud", MODEL, SPEC), settings)


def rank_main(rank: int, endpoint: str) -> tuple[int, list[float], dict[str, torch.Tensor]]:
    learner = trainer(2, rank)
    if rank == 0:  # rank 0 resumed from somewhere else: the group must take its weights and version
        with torch.no_grad():
            next(learner.network.parameters()).add_(1.0)
    parallel = DataParallel(rank, 2, endpoint, timeout_s=60)
    version = parallel.sync_state(learner.network, learner.optimizer, 7 if rank == 0 else 0)
    learner.parallel = parallel
    checksums = [weights_checksum(learner.network)]
    for update in range(2):
        learner.update(batch(seed=100 * update + rank), version=update)  # each rank its own chunks
        checksums.append(weights_checksum(learner.network))
    parallel.close()
    return version, checksums, learner.network.state_dict()


@pytest.mark.timeout(180)
def test_two_ranks_hold_identical_weights_after_every_update_and_train_on_the_mean_gradient():
    got = run_ranks(rank_main)
    (version_0, sums_0, state_0), (version_1, sums_1, state_1) = got[0], got[1]
    assert version_0 == version_1 == 7  # rank 0's version, taken by rank 1
    assert sums_0 == sums_1  # identical from the sync on, after each of the two updates
    assert all(torch.equal(state_0[name], state_1[name]) for name in state_0)
    # Not rank 0's batch alone: one learner trained on only that batch ends elsewhere.
    alone = trainer(1)
    with torch.no_grad():
        next(alone.network.parameters()).add_(1.0)
    for update in range(2):
        alone.update(batch(seed=100 * update), version=update)
    assert weights_checksum(alone.network) != sums_0[-1]


def test_a_rank_outside_the_group_an_uneven_share_a_bad_endpoint_or_a_short_split_timeout_is_refused():
    with pytest.raises(ValueError, match="rank=2 must be below world_size=2"):
        LearnerSettings(world_size=2, rank=2, mode="cloud", chunks_per_update=2)
    with pytest.raises(ValueError, match="must divide among world_size=2"):
        LearnerSettings(world_size=2, mode="cloud", chunks_per_update=3)
    with pytest.raises(ValueError, match="expected one host:port, got 'a:1,b:2'"):
        LearnerSettings(rendezvous_endpoint="a:1,b:2")
    with pytest.raises(ValueError, match="rendezvous_timeout_s=90 must be at least twice the 60 s a split step"):
        LearnerSettings(world_size=2, mode="split", chunks_per_update=2, rendezvous_timeout_s=90)
    LearnerSettings(world_size=2, mode="cloud", chunks_per_update=2, rendezvous_timeout_s=30)  # no edge to wait on
