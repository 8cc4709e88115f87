"""Selectors: which stored item a replay table hands out next, and with what probability.

Every selector holds the keys of the items in its table and answers
`sample() -> (key, probability)` without removing anything; the table decides
what is removed. Priorities are finite and >= 0 (`check_priority`).

- `Fifo`: the oldest key, probability 1 (Reverb's Queue, when the table removes what it samples).
- `Uniform`: any key with probability 1 / size, with replacement.
- `Prioritized`: key i with probability p_i^exponent / sum_j p_j^exponent.
  If that sum is 0 (every priority 0), it samples uniformly, probability
  1 / size, as Reverb does; otherwise an item of priority 0 is never drawn.
  An item of priority 0 weighs 0 for every exponent, as in Reverb (not
  0^0 = 1): exponent 0 is uniform over the items of nonzero priority.

`validate(priority)` refuses, before anything changes, a value the selector
cannot store: negative, NaN, Inf, or (prioritized) a weight above MAX_WEIGHT.
"""

from __future__ import annotations

import math
import random
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import torch

SelectorName = Literal["fifo", "uniform", "prioritized"]
#: Largest p^exponent a prioritized table stores, so sums over any table stay finite.
MAX_WEIGHT = 1e100


def check_priority(priority: float) -> float:
    """Return `priority` if it is finite and >= 0; ValueError with the value otherwise."""
    if not (math.isfinite(priority) and priority >= 0):
        raise ValueError(f"priority must be finite and >= 0, got {priority!r}")
    return float(priority)


class Selector(Protocol):
    name: SelectorName

    def validate(self, priority: float) -> float: ...
    def insert(self, key: int, priority: float) -> None: ...
    def delete(self, key: int) -> None: ...
    def update(self, key: int, priority: float) -> None: ...
    def sample(self) -> tuple[int, float]: ...


class Fifo:
    """Oldest key first; priorities are ignored."""

    name: SelectorName = "fifo"

    def __init__(self) -> None:
        self._keys: OrderedDict[int, None] = OrderedDict()

    def validate(self, priority: float) -> float:
        return check_priority(priority)

    def insert(self, key: int, priority: float) -> None:
        self._keys[key] = None

    def delete(self, key: int) -> None:
        del self._keys[key]

    def update(self, key: int, priority: float) -> None:
        pass

    def sample(self) -> tuple[int, float]:
        return next(iter(self._keys)), 1.0


class Uniform:
    """Any key, each with probability 1 / size; priorities are ignored."""

    name: SelectorName = "uniform"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._keys: list[int] = []
        self._position: dict[int, int] = {}

    def validate(self, priority: float) -> float:
        return check_priority(priority)

    def insert(self, key: int, priority: float) -> None:
        self._position[key] = len(self._keys)
        self._keys.append(key)

    def delete(self, key: int) -> None:
        position = self._position.pop(key)
        last = self._keys.pop()
        if last != key:  # move the last key into the hole
            self._keys[position] = last
            self._position[last] = position

    def update(self, key: int, priority: float) -> None:
        pass

    def sample(self) -> tuple[int, float]:
        return self._keys[self._rng.randrange(len(self._keys))], 1.0 / len(self._keys)


class Prioritized:
    """P(i) = p_i^exponent / sum_j p_j^exponent, drawn from a sum tree (O(log size) per operation).

    The tree is a flat array: node n has children 2n and 2n+1, leaves start at
    `capacity` (a power of two, doubled when full). Each internal node is
    recomputed as the sum of its children, never adjusted by deltas, so float
    error does not accumulate however many updates are made.
    """

    name: SelectorName = "prioritized"

    def __init__(self, rng: random.Random, exponent: float, initial_capacity: int = 64) -> None:
        if not (math.isfinite(exponent) and exponent >= 0):
            raise ValueError(f"priority exponent must be finite and >= 0, got {exponent!r}")
        self._rng, self.exponent = rng, float(exponent)
        self._capacity = 1 << max(0, initial_capacity - 1).bit_length()
        self._tree = array("d", bytes(16 * self._capacity))
        self._slot: dict[int, int] = {}
        self._key_at: list[int] = [-1] * self._capacity
        self._free = list(range(self._capacity - 1, -1, -1))

    def validate(self, priority: float) -> float:
        self._weight(check_priority(priority))
        return float(priority)

    def insert(self, key: int, priority: float) -> None:
        weight = self._weight(priority)
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self._slot[key], self._key_at[slot] = slot, key
        self._set(slot, weight)

    def delete(self, key: int) -> None:
        slot = self._slot.pop(key)
        self._set(slot, 0.0)
        self._key_at[slot] = -1
        self._free.append(slot)

    def update(self, key: int, priority: float) -> None:
        self._set(self._slot[key], self._weight(priority))

    def sample(self) -> tuple[int, float]:
        total = self._tree[1]
        if total <= 0:  # every weight is 0: uniform, as documented
            keys = list(self._slot)
            return keys[self._rng.randrange(len(keys))], 1.0 / len(keys)
        target, node = self._rng.random() * total, 1
        while node < self._capacity:
            left = self._tree[2 * node]
            # Descend only into subtrees of positive weight, so a zero-weight leaf is never reached.
            if target < left or self._tree[2 * node + 1] <= 0:
                node = 2 * node
            else:
                target -= left
                node = 2 * node + 1
        return self._key_at[node - self._capacity], self._tree[node] / total

    def _weight(self, priority: float) -> float:
        if priority == 0:  # Reverb: zero priority, zero weight, whatever the exponent
            return 0.0
        try:
            weight = priority**self.exponent
        except OverflowError:
            weight = math.inf
        if not weight <= MAX_WEIGHT:
            raise ValueError(
                f"priority {priority!r} ** exponent {self.exponent} = {weight} exceeds the largest weight {MAX_WEIGHT}"
            )
        return weight

    def _set(self, slot: int, weight: float) -> None:
        node = self._capacity + slot
        self._tree[node] = weight
        node //= 2
        while node:
            self._tree[node] = self._tree[2 * node] + self._tree[2 * node + 1]
            node //= 2

    def _grow(self) -> None:
        old, old_capacity = self._tree, self._capacity
        self._capacity *= 2
        self._tree = array("d", bytes(16 * self._capacity))
        self._tree[self._capacity : self._capacity + old_capacity] = old[old_capacity:]
        for node in range(self._capacity - 1, 0, -1):
            self._tree[node] = self._tree[2 * node] + self._tree[2 * node + 1]
        self._key_at.extend([-1] * old_capacity)
        self._free = list(range(self._capacity - 1, old_capacity - 1, -1))


def make_selector(name: SelectorName, rng: random.Random, priority_exponent: float = 1.0) -> Selector:
    """The selector called `name`; `priority_exponent` is used by "prioritized" only."""
    if name == "fifo":
        return Fifo()
    if name == "uniform":
        return Uniform(rng)
    if name == "prioritized":
        return Prioritized(rng, priority_exponent)
    raise ValueError(f"selector must be one of fifo, uniform, prioritized; got {name!r}")


def importance_weights(
    probabilities: Sequence[float] | torch.Tensor, table_sizes: Sequence[int] | torch.Tensor | int, beta: float
) -> torch.Tensor:
    """Prioritized-replay importance weights w_i = (N_i * P(i))^-beta / max_j w_j (Schaul et al. 2016).

    `probabilities` and `table_sizes` are SampledItem.probability and
    SampledItem.table_size of the sampled items (or one size for all);
    beta in [0, 1] (1 fully corrects the sampling bias). Returns float32 weights in (0, 1].
    """
    import torch  # a learner-side helper: the replay server itself runs without torch

    if not 0 <= beta <= 1:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")
    p = torch.as_tensor(probabilities, dtype=torch.float64)
    n = torch.as_tensor(table_sizes, dtype=torch.float64)
    if p.numel() == 0:
        return torch.zeros(0, dtype=torch.float32)
    if not bool(((p > 0) & (p <= 1)).all()):
        raise ValueError(f"probabilities must be in (0, 1], got {p.tolist()}")
    if not bool((n >= 1).all()):
        raise ValueError(f"table sizes must be >= 1, got {n.tolist()}")
    weights = (n * p).pow(-beta)
    return (weights / weights.max()).to(torch.float32)
