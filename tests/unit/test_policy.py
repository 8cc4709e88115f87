"""Inference's Policy (inference.policy): the versions it swaps in never go back, whichever stream brings them."""

from __future__ import annotations

import pytest
import torch

from splitrl.core.rpc import BadRequest
from splitrl.core.spec import ActionSpec, ModelConfig
from splitrl.inference.policy import Policy

MODEL = ModelConfig(2, 36, 16, "relu")


def shifted(policy: Policy, by: float) -> dict[str, torch.Tensor]:
    return {name: value + by for name, value in policy.network.state_dict().items()}


def test_an_older_version_is_refused_and_changes_nothing_and_the_same_one_again_is_taken():
    policy = Policy("split", MODEL, ActionSpec("discrete", 3), seed=0, runtime="torch")
    newer = shifted(policy, 1.0)
    policy.load(policy.prepare(newer), version=3)
    with pytest.raises(BadRequest, match=r"Weights\.version 2 is older than 3"):
        policy.load(policy.prepare(shifted(policy, 5.0)), version=2)
    assert policy.version == 3
    assert all(torch.equal(policy.network.state_dict()[name], value) for name, value in newer.items())
    # a learner resumed from its checkpoint re-publishes its version
    policy.load(policy.prepare(shifted(policy, 1.0)), version=3)
    assert policy.version == 3


def test_weights_whose_samples_are_infinite_are_refused_before_acting():
    """A Gaussian takes an infinite scale without complaint: exp(log_std) of a finite, in-bound log_std of 100
    overflows, and every action sampled would be +-inf (the environment, replay and learner downstream)."""
    policy = Policy("split", MODEL, ActionSpec("continuous", 3, (-1.0,) * 3, (1.0,) * 3), seed=0, runtime="torch")
    state = policy.network.state_dict()
    policy.check_outputs(state)
    with pytest.raises(BadRequest, match="non-finite actions"):
        policy.check_outputs({**state, "log_std": torch.full((3,), 100.0)})
