"""Step ids: how an edge names its steps so that one learner can route each id back to its edge.

An id is `prefix << STEP_ID_BITS | counter`: the top bits hold the issuing
edge's random prefix, the low bits count its steps. Prefixes are drawn from
[1, MAX_PREFIX), so ids stay below 2**62, inside the int64 of trajectories.
A restarted edge draws a new prefix, so ids it issued before stay unknown.
"""

from __future__ import annotations

import secrets

import torch

#: Low bits of a step id that count steps; the bits above hold the edge's prefix.
STEP_ID_BITS = 40
#: Exclusive upper bound of a prefix (and 0 is never drawn).
MAX_PREFIX = 1 << 22


def new_prefix() -> int:
    """A random prefix for this process's step ids, in [1, MAX_PREFIX)."""
    return 1 + secrets.randbelow(MAX_PREFIX - 1)


def first_id(prefix: int) -> int:
    """The first step id an edge with `prefix` issues."""
    return prefix << STEP_ID_BITS


def prefix_of(step_ids: torch.Tensor) -> torch.Tensor:
    """The issuing edge's prefix of each int64 step id."""
    return step_ids >> STEP_ID_BITS
