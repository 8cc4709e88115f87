"""Step ids: how an edge names its steps so that one learner can route each id back to its edge.

An id is `prefix << STEP_ID_BITS | counter`: the top bits hold the issuing
edge's random prefix, the low bits count its steps. Prefixes are drawn from
[1, MAX_PREFIX), so ids stay below 2**62, inside the int64 of trajectories.
A restarted edge draws a new prefix, so ids it issued before stay unknown.

On the training link ids travel as `StepIds` (first id, then deltas): `pack_step_ids` and
`unpack_step_ids` are the only code that builds or reads one.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Sequence

import torch

from splitrl.core.rpc import BadRequest
from splitrl.v1 import training_pb2

#: Low bits of a step id that count steps; the bits above hold the edge's prefix.
STEP_ID_BITS = 40
#: Exclusive upper bound of a prefix (and 0 is never drawn).
MAX_PREFIX = 1 << 22
#: Exclusive upper bound of any step id on the wire (they are int64 in trajectories).
ID_LIMIT = 1 << 63


def new_prefix() -> int:
    """A random prefix for this process's step ids, in [1, MAX_PREFIX)."""
    return 1 + secrets.randbelow(MAX_PREFIX - 1)


def first_id(prefix: int) -> int:
    """The first step id an edge with `prefix` issues."""
    return prefix << STEP_ID_BITS


def prefix_of_id(step_id: int) -> int:
    """The issuing edge's prefix of one step id."""
    return step_id >> STEP_ID_BITS


def prefix_of(step_ids: torch.Tensor) -> torch.Tensor:
    """The issuing edge's prefix of each int64 step id."""
    return step_ids >> STEP_ID_BITS


def pack_step_ids(ids: Sequence[int]) -> training_pb2.StepIds:
    """`ids` (at least one, in the order given) as a StepIds message; ascending ids pack smallest."""
    if not ids:
        raise ValueError("pack_step_ids needs at least one step id")
    values = [int(step_id) for step_id in ids]
    return training_pb2.StepIds(first=values[0], deltas=[b - a for a, b in itertools.pairwise(values)])


def unpack_step_ids(message: training_pb2.StepIds) -> list[int]:
    """The ids `message` names, in order. BadRequest if any falls outside [0, 2**63)."""
    ids = list(itertools.accumulate(message.deltas, initial=message.first))
    if not all(0 <= step_id < ID_LIMIT for step_id in ids):
        raise BadRequest("StepIds name an id outside [0, 2**63)")
    return ids
