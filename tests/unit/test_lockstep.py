"""One lockstep stream's invariants, as environment -> edge-encoder and edge-encoder -> inference both keep them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitrl.core.lockstep import Carried, LockstepStream, RewardBook, StepIdCursor, episode_ends
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


def header_round_trip(first_step_ids: list[int], versions: list[int]) -> tuple[list[int], list[int], list[int]]:
    """(first_step_id, encoder_version) pairs over one simulated stream: what arrives, and each message's bytes."""
    sent_ids, sent_versions, got_ids, got_versions = StepIdCursor(), Carried(), StepIdCursor(), Carried()
    arrived_ids, arrived_versions, sizes = [], [], []
    for first_step_id, version in zip(first_step_ids, versions, strict=True):
        request = rollout_pb2.ActRequest()
        sent_ids.put(request, first_step_id)
        sent_versions.put(request, "encoder_version", version)
        wire = rollout_pb2.ActRequest.FromString(request.SerializeToString())
        sizes.append(wire.ByteSize())
        arrived_ids.append(got_ids.get(wire))
        arrived_versions.append(got_versions.get(wire, "encoder_version"))
    return arrived_ids, arrived_versions, sizes


def test_step_ids_and_versions_arrive_as_sent_though_most_messages_leave_them_out():
    prefix = 3_000_000 << 40  # a real edge's ids are ~2**62
    ids = [prefix, prefix + 8, prefix + 16, prefix + 20, prefix + 36, prefix + 4, prefix + 5, prefix + 5]
    versions = [0, 0, 7, 7, 7, 300, 0, 0]
    arrived_ids, arrived_versions, sizes = header_round_trip(ids, versions)
    assert (arrived_ids, arrived_versions) == (ids, versions)
    assert sizes[0] == 10  # the stream's first message names its id in full (tag + 9-byte varint)
    assert sizes[1] == 2 and sizes[3] == 2  # later ones the advance, and no unchanged version
    assert sizes[2] == 4  # the version changed: it crosses once
    assert sizes[5] > 10 and sizes[7] == 10  # an id that does not grow crosses in full (ids grow on a real edge)


def test_a_stream_that_starts_with_an_advance_or_names_no_step_is_refused():
    with pytest.raises(BadRequest, match="first ActRequest sets first_step_id"):
        StepIdCursor().get(rollout_pb2.ActRequest(step_id_advance=4))
    with pytest.raises(BadRequest, match="neither first_step_id nor step_id_advance"):
        StepIdCursor().get(rollout_pb2.ActRequest())
    cursor = StepIdCursor()
    assert cursor.get(rollout_pb2.ActRequest(first_step_id=0)) == 0  # id 0, explicitly set, is an id
    with pytest.raises(BadRequest, match="step_id_advance is 0; step ids only grow"):
        cursor.get(rollout_pb2.ActRequest(step_id_advance=0))
    assert cursor.get(rollout_pb2.ActRequest(first_step_id=2**63 - 2)) == 2**63 - 2
    with pytest.raises(BadRequest, match="is not below 2\\*\\*63"):  # a sum past uint64 is refused, not an error
        cursor.get(rollout_pb2.ActRequest(step_id_advance=2**64 - 1))


def test_an_unchanged_policy_version_is_left_out_and_read_back():
    sender, receiver = Carried(), Carried()
    arrived = []
    for version in (0, 0, 5, 5, 5, 6):
        response = rollout_pb2.ActResponse()
        sender.put(response, "policy_version", version)
        arrived.append((receiver.get(response, "policy_version"), response.HasField("policy_version")))
    assert arrived == [(0, False), (0, False), (5, True), (5, False), (5, False), (6, True)]


def reward_round_trip(steps: list[list[float]]) -> tuple[list[list[float]], list[int]]:
    """Each step's rewards through a sender's and a receiver's RewardBook and the wire: what arrives, and the
    bytes of the reward fields of each message."""
    sender, receiver = RewardBook(), RewardBook()
    arrived, sizes = [], []
    for rewards in steps:
        request = rollout_pb2.ActRequest()
        sender.put(request, rewards)
        sizes.append(request.ByteSize())
        wire = rollout_pb2.ActRequest.FromString(request.SerializeToString())
        receiver.get(wire, len(rewards))
        arrived.append(list(wire.rewards))
    return arrived, sizes


def float32s(values: list[float]) -> list[float]:
    return np.asarray(values, np.float32).tolist()


def test_repeated_rewards_cross_as_one_byte_each():
    tile = float32s([1000 / 287 - 0.4])[0]  # CarRacing, 4 frames a step: -0.1 each, one tile's 1000 / tiles
    frame = float32s([-0.4])[0]
    steps = [[frame] * 4, [frame, tile, frame, frame], [frame] * 4, [tile, tile, frame, -100.0]]
    arrived, sizes = reward_round_trip(steps)
    assert arrived == steps
    assert sizes[0] == 2 + 4 + 2 + 4  # codes (tag, length, 4 bytes), one new value (tag, length, float32)
    assert sizes[1] == 6 + 6 and sizes[2] == 6  # a second new value; then only codes: 6 bytes, not 18
    assert sizes[3] == 6 + 6


def test_a_full_book_forgets_its_oldest_value_alike_at_both_ends():
    values = float32s([i * 0.25 for i in range(RewardBook.SLOTS + 40)])
    steps = [values[i : i + 3] for i in range(0, len(values), 3)] + [values[:3], values[-3:]]
    arrived, sizes = reward_round_trip(steps)
    assert arrived == steps
    assert sizes[-1] == 5  # the newest values are still in the book
    assert sizes[-2] == 5 + 2 + 12  # the oldest were overwritten: they cross again


@given(st.lists(st.lists(st.sampled_from(float32s([0.0, -0.0, 1.0, -0.1, 3.1, 1e30, -7.5])), min_size=1, max_size=6)))
def test_rewards_arrive_bit_for_bit(steps):
    arrived, _ = reward_round_trip(steps)
    assert [np.asarray(s, np.float32).tobytes() for s in arrived] == [
        np.asarray(s, np.float32).tobytes() for s in steps
    ]


def test_the_plain_form_is_read_as_it_is():
    request = rollout_pb2.ActRequest(rewards=[1.5, -2.0])
    RewardBook().get(request, 2)
    assert list(request.rewards) == [1.5, -2.0]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rewards": [1.0], "reward_codes": b"\x00", "new_rewards": [1.0]}, "both rewards and reward_codes"),
        ({"reward_codes": b"\x00\x00", "new_rewards": [1.0]}, "2 zero codes for 1 new_rewards"),
        ({"reward_codes": b"\x01", "new_rewards": [1.0]}, "0 zero codes for 1 new_rewards"),
        ({"reward_codes": b"\x00\x02", "new_rewards": [1.0]}, "names slot 2; this stream has filled 1"),
        ({"reward_codes": b"\xff"}, "names slot 255; this stream has filled 0"),
        ({"reward_codes": b"\x00\x01\x01", "new_rewards": [1.0]}, "has 3 codes for 2 envs"),
        # Refused by its length before one code is read: the message's size is no bound on the work.
        ({"reward_codes": b"\x00" + b"\x01" * 10**6, "new_rewards": [1.0]}, "has 1000001 codes for 2 envs"),
    ],
)
def test_a_coded_form_that_does_not_add_up_is_refused(fields, message):
    envs = 2 if len(fields["reward_codes"]) != 1 else 1
    with pytest.raises(BadRequest, match=message):
        RewardBook().get(rollout_pb2.ActRequest(**fields), envs)
