"""Trajectory data for tests: the smallest well-formed chunk (to store), and a batch of chunks (to train on)."""

from __future__ import annotations

import math

import torch

from splitrl.core.trajectory import TrajectoryTensors
from splitrl.learner.batch import Batch
from splitrl.v1 import replay_pb2


def tiny_chunk(steps: int = 2, *, marker: int = 0, features: int = 4) -> replay_pb2.Trajectory:
    """A `steps`-step chunk whose observations are uint8 [steps + 1, features], every byte `marker` % 256
    (so a stored chunk can be told from another); everything else is zero, step ids count from 0."""
    return chunk_of(torch.full((steps + 1, features), marker % 256, dtype=torch.uint8)).to_proto()


def chunk_of(observations: torch.Tensor) -> TrajectoryTensors:
    """The chunk of T steps around `observations` [T+1, ...]: everything else zero, step ids counting from 0."""
    steps = observations.shape[0] - 1
    return TrajectoryTensors(
        observations=observations,
        actions=torch.zeros(steps, dtype=torch.int64),
        behaviour_log_probs=torch.zeros(steps),
        values=torch.zeros(steps + 1),
        rewards=torch.zeros(steps),
        terminated=torch.zeros(steps, dtype=torch.bool),
        truncated=torch.zeros(steps, dtype=torch.bool),
        policy_versions=torch.zeros(steps, dtype=torch.int64),
        step_ids=torch.arange(steps + 1),
        encoder_versions=torch.zeros(steps + 1, dtype=torch.int64),
    )


def training_batch(inputs: torch.Tensor, *, seed: int = 0, first_step_id: int = 0, actions: int = 3) -> Batch:
    """A Batch of B chunks of T steps over `inputs` [B, T+1, ...]: actions (of `actions` discrete ones) and
    standard-normal rewards drawn from `seed`, behaviour log-probs of the uniform policy, no episode end, policy
    and encoder version 0, step ids first_step_id, first_step_id + 1, ... in chunk order."""
    chunks, horizon = inputs.shape[0], inputs.shape[1] - 1
    generator = torch.Generator().manual_seed(seed)
    shape = (chunks, horizon)
    return Batch(
        inputs=inputs,
        actions=torch.randint(0, actions, shape, generator=generator),
        behaviour_log_probs=torch.full(shape, -math.log(actions)),
        values=torch.zeros(chunks, horizon + 1),
        rewards=torch.randn(shape, generator=generator),
        dones=torch.zeros(shape, dtype=torch.bool),
        policy_versions=torch.zeros(shape, dtype=torch.long),
        step_ids=first_step_id + torch.arange(chunks * (horizon + 1)).reshape(chunks, horizon + 1),
        encoder_versions=torch.zeros(chunks, horizon + 1, dtype=torch.long),
        weights=torch.ones(chunks),
    )
