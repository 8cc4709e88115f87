"""splitrl.replay.selectors: uniform and prioritized draws (seeded, so deterministic), IS weights."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from splitrl.replay.selectors import MAX_WEIGHT, Prioritized, Uniform, importance_weights
from splitrl.replay.table import Table
from splitrl.v1 import replay_pb2

DRAWS = 40_000


def frequencies(selector, draws: int = DRAWS) -> dict[int, float]:
    counts = Counter(selector.sample()[0] for _ in range(draws))
    return {key: n / draws for key, n in counts.items()}


def prioritized(priorities, exponent: float = 1.0, seed: int = 0) -> Prioritized:
    selector = Prioritized(random.Random(seed), exponent, initial_capacity=2)
    for key, priority in enumerate(priorities):
        selector.insert(key, priority)
    return selector


def test_uniform_covers_every_item_evenly_with_replacement():
    selector = Uniform(random.Random(0))
    for key in range(10):
        selector.insert(key, 0.0)
    selector.delete(3)
    freq = frequencies(selector)
    assert sorted(freq) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert all(abs(f - 1 / 9) < 0.01 for f in freq.values())
    assert selector.sample()[1] == pytest.approx(1 / 9)


@pytest.mark.parametrize(
    ("priorities", "exponent", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 1.0, [0.1, 0.2, 0.3, 0.4]),
        ([1.0, 4.0, 0.0], 0.5, [1 / 3, 2 / 3, 0.0]),
        ([1.0, 4.0, 0.0], 0.0, [0.5, 0.5, 0.0]),  # as Reverb: priority 0 weighs 0 for every exponent
        ([0.0, 0.0], 0.0, [0.5, 0.5]),  # all zero: uniform again
        ([0.0, 0.0, 0.0, 0.0], 1.0, [0.25, 0.25, 0.25, 0.25]),  # all zero: uniform, no crash
    ],
)
def test_prioritized_frequencies_follow_priorities(priorities, exponent, expected):
    selector = prioritized(priorities, exponent)
    freq = frequencies(selector)
    # Chi-square against the expected distribution; 16.3 is the 0.999 quantile for 3 degrees of freedom.
    chi2 = sum((freq.get(k, 0.0) - p) ** 2 / p * DRAWS for k, p in enumerate(expected) if p > 0)
    assert chi2 < 16.3, (freq, expected)
    assert all(freq.get(k, 0.0) == 0.0 for k, p in enumerate(expected) if p == 0)
    for _ in range(50):
        key, probability = selector.sample()
        assert probability == pytest.approx(expected[key])


def test_priority_updates_and_deletes_change_frequencies():
    selector = prioritized([1.0, 1.0, 1.0])
    selector.update(0, 8.0)
    selector.delete(1)
    freq = frequencies(selector)
    assert sorted(freq) == [0, 2]
    assert abs(freq[0] - 8 / 9) < 0.01
    selector.update(0, 0.0)
    assert frequencies(selector, 1000) == {2: 1.0}


def test_the_sum_tree_grows_and_reuses_slots():
    selector = prioritized([float(k) for k in range(100)])  # capacity 2 -> 128
    for key in range(0, 100, 2):
        selector.delete(key)
    for key in range(100, 150):
        selector.insert(key, 1.0)
    total = sum(range(1, 100, 2)) + 50
    key, probability = selector.sample()
    weight = key if key < 100 else 1.0
    assert probability == pytest.approx(weight / total)
    assert all(k % 2 == 1 or k >= 100 for k in frequencies(selector, 5000))


def test_prioritized_refuses_weights_it_cannot_sum():
    selector = prioritized([], exponent=2.0)
    with pytest.raises(ValueError, match=r"priority 1e\+300 \*\* exponent 2.0"):
        selector.validate(1e300)
    assert selector.validate(1e49) == 1e49
    assert MAX_WEIGHT == 1e100


async def test_priority_updates_change_what_a_table_samples():
    table = Table("per", 10, selector="prioritized", seed=3)
    keys = [await table.insert(replay_pb2.Trajectory(), 1.0) for _ in range(4)]
    before = Counter(item.key for item in await table.sample(4000, timeout_s=1))
    table.update_priorities([(keys[3], 97.0)])
    after = Counter(item.key for item in await table.sample(4000, timeout_s=1))
    assert all(900 < before[k] < 1100 for k in keys)
    assert after[keys[3]] > 3800


def test_importance_weights():
    weights = importance_weights([0.5, 0.25, 0.125], table_sizes=4, beta=1.0)
    assert weights.dtype == torch.float32
    assert weights.tolist() == pytest.approx([0.25, 0.5, 1.0])
    assert importance_weights(torch.tensor([0.5, 0.25]), [2, 4], beta=0.5).tolist() == pytest.approx([1.0, 1.0])
    assert importance_weights([0.1, 0.9], 10, beta=0.0).tolist() == [1.0, 1.0]
    assert importance_weights([], 1, beta=0.4).shape == (0,)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([0.5], 2, 1.5), "beta must be in \\[0, 1\\], got 1.5"),
        (([0.0], 2, 0.5), "probabilities must be in \\(0, 1\\], got \\[0.0\\]"),
        (([0.5], 0, 0.5), "table sizes must be >= 1, got 0"),
    ],
)
def test_importance_weights_reject_bad_values(args, message):
    with pytest.raises(ValueError, match=message):
        importance_weights(*args)
