"""One lockstep stream's invariants, as environment -> edge-encoder and edge-encoder -> inference both keep them."""

from __future__ import annotations

import pytest

from splitrl.core.lockstep import LockstepStream, episode_ends
from splitrl.core.rpc import BadRequest
from splitrl.v1 import rollout_pb2

FIELDS = ("rewards", "terminated", "truncated")


def step(sequence: int, envs: int = 2, **fields) -> rollout_pb2.EnvStep:
    values = {"rewards": [0.0] * envs, "terminated": [False] * envs, "truncated": [False] * envs} | fields
    return rollout_pb2.EnvStep(sequence=sequence, **values)


def test_every_env_starts_an_episode_on_the_first_message_then_only_those_that_ended():
    stream = LockstepStream("EnvStep")
    assert stream.accept(step(0), 2, FIELDS).tolist() == [True, True]
    assert stream.accept(step(1, terminated=[False, True]), 2, FIELDS).tolist() == [False, True]
    assert stream.accept(step(2, truncated=[True, False]), 2, FIELDS).tolist() == [True, False]
    assert (stream.num_envs, stream.next_sequence) == (2, 3)


@pytest.mark.parametrize(
    ("message", "envs", "refusal"),
    [
        (step(0), 0, "EnvStep has no envs"),
        (step(3), 2, "EnvStep.sequence is 3, expected 1"),
        (step(1, envs=3), 3, "EnvStep has 3 envs; this stream has 2"),
        (step(1, rewards=[0.0]), 2, "EnvStep.rewards has 1 entries for 2 envs"),
        (step(1, rewards=[0.0, float("nan")]), 2, "EnvStep.rewards holds NaN or Inf"),
        (step(1, terminated=[True]), 2, "EnvStep.terminated has 1 entries for 2 envs"),
        (step(1, rewards=[]), 2, "EnvStep.rewards has 0 entries for 2 envs"),  # only episode ends may be empty
    ],
)
def test_a_refused_message_names_the_broken_invariant_and_changes_nothing(message, envs, refusal):
    stream = LockstepStream("EnvStep")
    stream.accept(step(0), 2, FIELDS)
    with pytest.raises(BadRequest, match=refusal.replace(".", r"\.")):
        stream.accept(message, envs, FIELDS)
    assert (stream.num_envs, stream.next_sequence) == (2, 1)
    assert stream.accept(step(1), 2, FIELDS).tolist() == [False, False]  # the stream goes on


def test_empty_episode_end_fields_mean_no_env_ended():
    """What the environment sends on most steps: no flags at all."""
    stream = LockstepStream("EnvStep")
    assert stream.accept(step(0, terminated=[], truncated=[]), 2, FIELDS).tolist() == [True, True]
    assert stream.accept(step(1, terminated=[], truncated=[]), 2, FIELDS).tolist() == [False, False]
    assert stream.accept(step(2, terminated=[], truncated=[False, True]), 2, FIELDS).tolist() == [False, True]
    quiet, ended = step(3, terminated=[], truncated=[]), step(3, terminated=[True, False])
    assert episode_ends(quiet, "terminated", 2).tolist() == [False, False]
    assert episode_ends(ended, "terminated", 2).tolist() == [True, False]
    assert quiet.ByteSize() < ended.ByteSize() - 4
