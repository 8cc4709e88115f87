"""The state both ends of a lockstep rollout stream keep: environment -> edge-encoder (EnvStep) and
edge-encoder -> inference (ActRequest).

Invariants of one stream, checked on every message (a refused message is answered INVALID_ARGUMENT and ends
its stream, so no state is read after one):
- one message is in flight, answered before the next; an EnvStep (loopback or LAN) carries its place on the
  stream as `sequence` (0, 1, ...), checked; an ActRequest (WAN) carries none: gRPC keeps a stream's order;
- the env count N is fixed by the stream's first message, and is never 0;
- every per-env field has exactly N entries, and rewards are finite; an episode-end field (terminated,
  truncated) may instead be empty, meaning no env's episode ended: the common step sends no flags.
Episode starts follow: every env starts one on the stream's first message (nothing spans a reconnect), then
exactly those whose previous episode ended (terminated or truncated).

At tens of WAN bytes per env step a header field matters, so a number the stream's previous message implies
does not cross again: Carried (ActRequest.encoder_version, ActResponse.policy_version: absent = unchanged) and
StepIdCursor (ActRequest's step ids: the advance since the previous message, not the ~10-byte id), and a
repeated reward is named by a byte, not sent again (RewardBook). Each end keeps one of each per stream; a new
stream starts them over.
"""

from __future__ import annotations

import math
import struct
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

    def __init__(self, message_name: str, sequenced: bool = True) -> None:
        """`message_name` names the message in refusals (e.g. "EnvStep"); `sequenced`: its messages carry
        `sequence`, which must count 0, 1, ... (ActRequest has none)."""
        self.message_name, self.sequenced = message_name, sequenced
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
        if self.sequenced and message.sequence != self.next_sequence:
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


class RewardBook:
    """A stream's rewards in about a byte per env: ActRequest's reward_codes + new_rewards form (its comment
    in rollout.proto is the format). Each end keeps one per stream; both fill and evict slots alike, so the
    receiver's book is the sender's after every message. Values are float32s, matched by their bits."""

    SLOTS = 255  # a code is one byte, and 0 means "a new value"

    def __init__(self) -> None:
        self._slots: list[float] = []  # slot k's value at index k - 1
        self._slot_of: dict[bytes, int] = {}  # float32 bits -> slot, for the sender
        self._next_slot = 1  # the slot the next new value takes

    def _remember(self, bits: bytes) -> float:
        """Put the float32 `bits` in the next slot; returns its value."""
        (value,) = struct.unpack("<f", bits)
        slot = self._next_slot
        if slot <= len(self._slots):  # the book is full: the oldest value goes
            self._slot_of.pop(_bits(self._slots[slot - 1]), None)
            self._slots[slot - 1] = value
        else:
            self._slots.append(value)
        self._slot_of[bits] = slot
        self._next_slot = slot % self.SLOTS + 1
        return value

    def put(self, request: Any, rewards: Sequence[float]) -> None:
        """Sender: set `request`'s reward_codes and new_rewards for `rewards` (float32 values, one per env)."""
        codes = bytearray()
        new_rewards = []
        for reward in rewards:
            bits = _bits(reward)
            slot = self._slot_of.get(bits)
            if slot is None:
                codes.append(0)
                new_rewards.append(self._remember(bits))
            else:
                codes.append(slot)
        request.ClearField("rewards")
        request.reward_codes = bytes(codes)
        request.new_rewards[:] = new_rewards

    def get(self, request: Any, envs: int) -> None:
        """Receiver: fill `request.rewards` (the plain form, which LockstepStream.accept and the trajectory read)
        from its coded form for `envs` envs; a request in the plain form is left as it is. BadRequest if it mixes
        the forms, has other than `envs` codes (checked first: the message's size bounds nothing here), more or
        fewer new values than codes 0, or names an empty slot; new values are then in the book, but a refused
        message ends its stream, so it is never read again."""
        if not request.reward_codes and not request.new_rewards:
            return
        if request.rewards:
            raise BadRequest("ActRequest sets both rewards and reward_codes / new_rewards; one form only")
        codes = request.reward_codes
        if len(codes) != envs:
            raise BadRequest(f"ActRequest.reward_codes has {len(codes)} codes for {envs} envs")
        if codes.count(0) != len(request.new_rewards):
            raise BadRequest(
                f"ActRequest.reward_codes has {codes.count(0)} zero codes for {len(request.new_rewards)} new_rewards"
            )
        new_rewards = iter(request.new_rewards)
        rewards = []
        for code in codes:
            if code == 0:
                value = self._remember(_bits(next(new_rewards)))
            elif code <= len(self._slots):
                value = self._slots[code - 1]
            else:
                raise BadRequest(
                    f"ActRequest.reward_codes names slot {code}; this stream has filled {len(self._slots)}"
                )
            rewards.append(value)
        request.rewards[:] = rewards


def _bits(value: float) -> bytes:
    """`value` as float32 bytes: the key two equal rewards share (protobuf carries rewards as float32)."""
    return struct.pack("<f", value)
