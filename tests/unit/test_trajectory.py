"""TrajectoryCutter (when chunks come out and what lines up) and TrajectoryTensors' wire form."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
import zstandard

from splitrl.core import wire
from splitrl.core.rpc import BadRequest
from splitrl.core.trajectory import TrajectoryTensors, check, from_proto
from splitrl.inference.policy import Decisions
from splitrl.inference.trajectories import TrajectoryCutter

T, N, STEPS = 3, 2, 7
ENVS = torch.arange(N)


# Every value is a function of (step, env), so a misplaced row shows up as a wrong number.
def observation(step: int) -> torch.Tensor:
    return (10 * step + ENVS).to(torch.uint8)[:, None, None, None].expand(N, 2, 3, 3).clone()


def action(step: int) -> torch.Tensor:
    return 100 * step + ENVS


def log_prob(step: int) -> torch.Tensor:
    return -(step + ENVS / 10).float()


def value(step: int) -> torch.Tensor:
    return (1000 + 10 * step + ENVS).float()


def step_id(step: int) -> torch.Tensor:
    return 5000 + 10 * step + ENVS


def reward(step: int) -> torch.Tensor:
    return (step + ENVS / 4).float()


def terminated(step: int) -> torch.Tensor:
    return torch.tensor([step == 1, False])


def truncated(step: int) -> torch.Tensor:
    return torch.tensor([False, step == 4])


def policy_version(step: int) -> int:
    return step // 2


def encoder_version(step: int) -> int:
    return 70 + step


def add_step(cutter: TrajectoryCutter, step: int) -> list[TrajectoryTensors]:
    """Request `step`: acts on step's observation and completes step - 1 (zeros/False on the first request)."""
    previous = step - 1
    return cutter.add(
        observation(step),
        Decisions(action(step), log_prob(step), value(step), policy_version(step)),
        step_ids=step_id(step),
        encoder_version=encoder_version(step),
        previous_rewards=reward(previous) if step else torch.zeros(N),
        previous_terminated=terminated(previous) if step else torch.zeros(N, dtype=torch.bool),
        previous_truncated=truncated(previous) if step else torch.zeros(N, dtype=torch.bool),
    )


def run_cutter() -> dict[int, list[TrajectoryTensors]]:
    """Feed STEPS requests; map each request index to the chunks it returned."""
    cutter = TrajectoryCutter(T)
    return {step: add_step(cutter, step) for step in range(STEPS)}


def assert_chunk(chunk: TrajectoryTensors, env: int, first: int) -> None:
    """`chunk` is env's steps first .. first+T-1, bootstrapped on step first+T."""
    steps = range(first, first + T)
    with_bootstrap = range(first, first + T + 1)
    assert chunk.length == T
    assert torch.equal(chunk.observations, torch.stack([observation(s)[env] for s in with_bootstrap]))
    assert chunk.actions.tolist() == [action(s)[env].item() for s in steps]
    assert chunk.behaviour_log_probs.tolist() == [log_prob(s)[env].item() for s in steps]
    assert chunk.values.tolist() == [value(s)[env].item() for s in with_bootstrap]
    assert chunk.rewards.tolist() == [reward(s)[env].item() for s in steps]
    assert chunk.terminated.tolist() == [terminated(s)[env].item() for s in steps]
    assert chunk.truncated.tolist() == [truncated(s)[env].item() for s in steps]
    assert chunk.policy_versions.tolist() == [policy_version(s) for s in steps]
    assert chunk.step_ids.tolist() == [step_id(s)[env].item() for s in with_bootstrap]
    assert chunk.encoder_versions.tolist() == [encoder_version(s) for s in with_bootstrap]


def test_chunks_come_out_with_the_request_that_provides_the_bootstrap_row():
    produced = run_cutter()
    assert {step: len(chunks) for step, chunks in produced.items()} == {0: 0, 1: 0, 2: 0, 3: N, 4: 0, 5: 0, 6: N}


def test_chunk_row_counts_are_t_and_t_plus_one():
    chunk = run_cutter()[3][0]
    rows = {f.name: getattr(chunk, f.name).shape[0] for f in fields(chunk)}
    assert rows == {
        "observations": T + 1,
        "actions": T,
        "behaviour_log_probs": T,
        "values": T + 1,
        "rewards": T,
        "terminated": T,
        "truncated": T,
        "policy_versions": T,
        "step_ids": T + 1,
        "encoder_versions": T + 1,
    }
    assert chunk.observations.shape == (T + 1, 2, 3, 3)


@pytest.mark.parametrize("env", range(N))
def test_first_chunk_holds_steps_0_to_2_bootstrapped_on_step_3(env):
    assert_chunk(run_cutter()[3][env], env, first=0)


@pytest.mark.parametrize("env", range(N))
def test_second_chunk_starts_at_the_first_chunks_bootstrap_step(env):
    assert_chunk(run_cutter()[6][env], env, first=3)


def test_reward_and_episode_end_belong_to_the_step_before_the_request():
    first, second = run_cutter()[3][0], run_cutter()[6][1]
    # reward(1) + terminated(1) arrive with request 2 and belong to step 1 (row 1 of the first chunk).
    assert first.rewards.tolist() == [0.0, 1.0, 2.0]
    assert first.terminated.tolist() == [False, True, False]
    # truncated(4) of env 1 arrives with request 5 and belongs to step 4 (row 1 of the second chunk).
    assert second.truncated.tolist() == [False, True, False]
    assert second.rewards.tolist() == [3.25, 4.25, 5.25]


def test_bootstrap_row_is_the_next_steps_observation_and_value():
    chunk = run_cutter()[3][1]
    assert torch.equal(chunk.observations[-1], observation(3)[1])
    assert chunk.values[-1].item() == value(3)[1].item()
    assert chunk.step_ids[-1].item() == step_id(3)[1].item()


def test_continuous_actions_keep_their_action_dimension():
    cutter = TrajectoryCutter(1)
    for step in range(2):
        chunks = cutter.add(
            observation(step),
            Decisions(torch.full((N, 3), float(step)), log_prob(step), value(step), 0),
            step_ids=step_id(step),
            encoder_version=0,
            previous_rewards=torch.zeros(N),
            previous_terminated=torch.zeros(N, dtype=torch.bool),
            previous_truncated=torch.zeros(N, dtype=torch.bool),
        )
    assert [chunk.actions.shape for chunk in chunks] == [(1, 3)] * N


def test_cutter_rejects_a_non_positive_unroll_length():
    with pytest.raises(ValueError, match="got 0"):
        TrajectoryCutter(0)


# --- wire form -----------------------------------------------------------------------------------


def chunk_proto():
    return run_cutter()[6][1].to_proto()


def test_to_proto_from_proto_round_trips_exactly():
    chunk = run_cutter()[6][1]
    decoded = from_proto(chunk.to_proto())
    for field in fields(chunk):
        original, back = getattr(chunk, field.name), getattr(decoded, field.name)
        assert back.dtype == original.dtype, field.name
        assert torch.equal(back, original), field.name


def test_to_proto_uses_the_documented_wire_dtypes():
    message = chunk_proto()
    assert message.values.dtype == wire.DTYPE_FLOAT32
    assert message.terminated.dtype == wire.DTYPE_BOOL
    assert message.step_ids.dtype == wire.DTYPE_INT64
    assert message.observations.dtype == wire.DTYPE_UINT8


@pytest.fixture(params=[from_proto, check], ids=["from_proto", "check"])
def read(request):
    """Both readers of a Trajectory: the learner's (decodes to tensors) and replay's (checks, no torch)."""
    return request.param


def test_check_reads_compressed_fields_to_the_end():
    message = chunk_proto()
    # A sender may compress even where zstd does not shrink the data (splitrl's encoder then does not).
    zeros = wire.encode(torch.zeros(T))
    message.rewards.CopyFrom(zeros)
    message.rewards.data = zstandard.ZstdCompressor().compress(zeros.data)
    message.rewards.compression = wire.COMPRESSION_ZSTD
    check(message)
    message.rewards.data = message.rewards.data[:-2]  # a valid zstd header, a truncated body
    with pytest.raises(wire.WireError, match=r"Trajectory\.rewards: tensor data does not decompress"):
        check(message)


def test_from_proto_rejects_a_missing_field(read):
    message = chunk_proto()
    message.ClearField("rewards")
    with pytest.raises(BadRequest, match=r"Trajectory\.rewards is missing"):
        read(message)


@pytest.mark.parametrize(
    ("name", "rows", "expected"),
    [("values", T, T + 1), ("rewards", T + 1, T), ("observations", T, T + 1), ("policy_versions", T - 1, T)],
)
def test_from_proto_rejects_a_wrong_row_count(name, rows, expected, read):
    message = chunk_proto()
    if name == "observations":  # as whole stacks, with no index (test_trajectory_frames: a wrong index)
        message.ClearField("observation_index")
    tensor = wire.decode(getattr(message, name))
    getattr(message, name).CopyFrom(wire.encode(tensor.new_zeros((rows, *tensor.shape[1:]))))
    with pytest.raises(BadRequest, match=rf"Trajectory\.{name} has shape .*; expected {expected} rows"):
        read(message)


def test_from_proto_rejects_a_field_without_rows(read):
    message = chunk_proto()
    message.rewards.CopyFrom(wire.encode(torch.tensor(1.0)))
    with pytest.raises(BadRequest, match=r"Trajectory\.rewards has shape \[\]"):
        read(message)


def test_from_proto_rejects_values_of_the_wrong_dtype(read):
    message = chunk_proto()
    message.values.CopyFrom(wire.encode(torch.zeros(T + 1), dtype=wire.DTYPE_BFLOAT16))
    with pytest.raises(wire.WireError, match=r"Trajectory\.values: .*DTYPE_BFLOAT16, expected DTYPE_FLOAT32"):
        read(message)


def test_from_proto_rejects_a_broken_tensor_naming_its_field(read):
    message = chunk_proto()
    message.step_ids.data = message.step_ids.data[:-1]
    with pytest.raises(wire.WireError, match=r"Trajectory\.step_ids: tensor data is"):
        read(message)


def empty_chunk() -> TrajectoryTensors:
    return TrajectoryTensors(
        observations=torch.zeros(1, 2, 3, 3, dtype=torch.uint8),
        actions=torch.zeros(0, dtype=torch.int64),
        behaviour_log_probs=torch.zeros(0),
        values=torch.zeros(1),
        rewards=torch.zeros(0),
        terminated=torch.zeros(0, dtype=torch.bool),
        truncated=torch.zeros(0, dtype=torch.bool),
        policy_versions=torch.zeros(0, dtype=torch.int64),
        step_ids=torch.zeros(1, dtype=torch.int64),
        encoder_versions=torch.zeros(1, dtype=torch.int64),
    )


def test_from_proto_rejects_length_zero(read):
    with pytest.raises(BadRequest, match=r"Trajectory has 0 steps; expected 1\.\.4096"):
        read(empty_chunk().to_proto())


def test_from_proto_rejects_scalar_actions_as_length_zero(read):
    message = chunk_proto()
    message.actions.CopyFrom(wire.encode(torch.tensor(1)))
    with pytest.raises(BadRequest, match="Trajectory has 0 steps"):
        read(message)


def test_from_proto_enforces_max_length(read):
    message = chunk_proto()
    read(message, max_length=T)
    with pytest.raises(BadRequest, match=rf"Trajectory has {T} steps; expected 1\.\.{T - 1}"):
        read(message, max_length=T - 1)


def test_from_proto_rejects_per_step_fields_with_extra_dimensions(read):
    chunk = run_cutter()[T][0]  # the first chunk is cut by request T, its bootstrap row
    chunk.rewards = torch.zeros(T, 5)
    with pytest.raises(ValueError, match=r"rewards has shape \[3, 5\]; expected \[3\]"):
        read(chunk.to_proto())
