"""The state both ends of a lockstep rollout stream keep: environment -> edge-encoder (EnvStep) and
edge-encoder -> inference (ActRequest).

Invariants of one stream, checked on every message (a refused message is answered INVALID_ARGUMENT and ends
its stream, so no state is read after one):
- message k of the stream carries `sequence` k (one message in flight, answered before the next);
- the env count N is fixed by the stream's first message, and is never 0;
- every per-env field has exactly N entries, and rewards are finite; an episode-end field (terminated,
  truncated) may instead be empty, meaning no env's episode ended: the common step sends no flags.
Episode starts follow: every env starts one on the stream's first message (nothing spans a reconnect), then
exactly those whose previous episode ended (terminated or truncated).

At tens of WAN bytes per env step a header field matters, so a number the stream's previous message implies
does not cross again: Carried (ActRequest.encoder_version, ActResponse.policy_version: absent = unchanged) and
StepIdCursor (ActRequest's step ids: the advance since the previous message, not the ~10-byte id). Each end
keeps one per stream; a new stream starts them over.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from splitrl.core.rpc import BadRequest
from splitrl.core.step_ids import ID_LIMIT

#: Per-env bool fields a sender leaves empty when every entry is False (most steps: no episode ends).
EPISODE_END_FIELDS = ("terminated", "truncated")


def episode_ends(message: Any, field: str, envs: int) -> torch.Tensor:
    """bool [envs]: `message.field` (one of EPISODE_END_FIELDS) with its empty form read as all False."""
    values = getattr(message, field)
    return torch.tensor(values, dtype=torch.bool) if len(values) else torch.zeros(envs, dtype=torch.bool)


class LockstepStream:
    """Sequence and env count of one stream. `accept` validates a message and advances past it."""

    def __init__(self, message_name: str) -> None:
        """`message_name` names the message in refusals (e.g. "EnvStep")."""
        self.message_name = message_name
        self.num_envs: int | None = None  # fixed by the first message
        self.next_sequence = 0

    def accept(self, message: Any, envs: int, per_env_fields: Sequence[str]) -> torch.Tensor:
        """Check `message` (whose payload decoded to `envs` rows) and advance; returns bool [envs]: which rows
        start an episode. BadRequest, with the state unchanged, if it breaks an invariant."""
        name = self.message_name
        if envs == 0:
            raise BadRequest(f"{name} has no envs")
        if self.num_envs is not None and envs != self.num_envs:
            raise BadRequest(f"{name} has {envs} envs; this stream has {self.num_envs}")
        if message.sequence != self.next_sequence:
            raise BadRequest(f"{name}.sequence is {message.sequence}, expected {self.next_sequence}")
        for field in per_env_fields:
            entries = len(getattr(message, field))
            if entries != envs and not (entries == 0 and field in EPISODE_END_FIELDS):
                raise BadRequest(f"{name}.{field} has {len(getattr(message, field))} entries for {envs} envs")
        if not all(math.isfinite(reward) for reward in message.rewards):
            raise BadRequest(f"{name}.rewards holds NaN or Inf")
        first = self.num_envs is None
        self.num_envs = envs
        self.next_sequence += 1
        if first:
            return torch.ones(envs, dtype=torch.bool)
        return episode_ends(message, "terminated", envs) | episode_ends(message, "truncated", envs)


class Carried:
    """One number of a stream's messages that crosses only when it changes: a proto3 `optional` field whose
    absence means "as in this stream's previous message" (0 before any). Each end keeps one per stream and
    field; a refused message ends its stream, so nothing reads the state after one."""

    def __init__(self) -> None:
        self.value = 0

    def put(self, message: Any, field: str, value: int) -> None:
        """Sender: set `message.field` to `value` if it changed since the stream's previous message, else clear it."""
        message.ClearField(field)
        if value != self.value:
            setattr(message, field, value)
        self.value = value

    def get(self, message: Any, field: str) -> int:
        """Receiver: `message.field`, or the stream's last value when the message leaves it out."""
        if message.HasField(field):
            self.value = getattr(message, field)
        return self.value


class StepIdCursor:
    """Row 0's step id of each ActRequest of one stream, as its `first_step` oneof: first_step_id (~10 bytes)
    on the stream's first message, then step_id_advance, the growth since the previous message (~2 bytes)."""

    def __init__(self) -> None:
        self.first_step_id: int | None = None  # of the stream's previous message

    def put(self, request: Any, first_step_id: int) -> None:
        """Sender: set `request`'s first_step for `first_step_id` (in full where it does not grow)."""
        previous, self.first_step_id = self.first_step_id, first_step_id
        if previous is None or first_step_id <= previous:
            request.first_step_id = first_step_id
        else:
            request.step_id_advance = first_step_id - previous

    def get(self, request: Any) -> int:
        """Receiver: `request`'s row-0 step id. BadRequest if it names none, an advance on a first message, an
        advance of 0 (ids only grow) or an id past ID_LIMIT."""
        kind = request.WhichOneof("first_step")
        if kind is None:
            raise BadRequest("ActRequest sets neither first_step_id nor step_id_advance")
        if kind == "first_step_id":
            first_step_id = request.first_step_id
        elif self.first_step_id is None:
            raise BadRequest("a stream's first ActRequest sets first_step_id, not step_id_advance")
        elif request.step_id_advance == 0:
            raise BadRequest("ActRequest.step_id_advance is 0; step ids only grow")
        else:
            first_step_id = self.first_step_id + request.step_id_advance
        if first_step_id >= ID_LIMIT:
            raise BadRequest(f"ActRequest's first step id {first_step_id} is not below 2**63")
        self.first_step_id = first_step_id
        return first_step_id
