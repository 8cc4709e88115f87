"""splitrl.replay.rate_limiter: Reverb's admission rules, its invariant under any interleaving, bad values."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrl.replay.rate_limiter import RateLimiter
from splitrl.replay.table import Table
from splitrl.v1 import replay_pb2

# Dyadic values keep inserts * samples_per_insert - samples exact, so the bounds are tested exactly.
SAMPLES_PER_INSERT = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 4.0, 8.0])


@st.composite
def ratio_limiters(draw) -> RateLimiter:
    spi = draw(SAMPLES_PER_INSERT)
    min_size = draw(st.integers(1, 8))
    error_buffer = max(1.0, spi) + draw(st.integers(0, 16)) / 4
    return RateLimiter.sample_to_insert_ratio(spi, min_size, error_buffer)


def test_min_size_never_blocks_inserts_and_samples_from_min_size():
    limiter = RateLimiter.min_size(3)
    for _ in range(2):
        limiter.insert()
    assert not limiter.can_sample()
    limiter.insert()
    assert limiter.can_sample()
    for _ in range(100):
        assert limiter.can_insert()
        limiter.insert()
    for _ in range(103):
        limiter.sample()
    assert limiter.can_sample()  # no ratio: only the size matters


def test_the_exact_reverb_rules():
    # spi 2, min size 2, error buffer 2: min_diff 2, max_diff 6.
    limiter = RateLimiter.sample_to_insert_ratio(2.0, 2, 2.0)
    assert (limiter.min_diff, limiter.max_diff) == (2.0, 6.0)
    limiter.insert()
    limiter.insert()  # free while filling up: size + 1 <= min size
    assert limiter.diff == 4.0
    assert limiter.can_insert()  # 4 + 2 <= 6
    limiter.insert()
    assert not limiter.can_insert()  # 6 + 2 > 6
    for _ in range(4):
        assert limiter.can_sample()  # diff - 1 >= 2
        limiter.sample()
    assert limiter.diff == 2.0
    assert not limiter.can_sample()  # 2 - 1 < 2
    assert limiter.can_insert()


def test_inserts_are_free_again_below_min_size_after_deletes():
    limiter = RateLimiter.sample_to_insert_ratio(1.0, 3, 1.0)  # diff must stay in [2, 4]
    for _ in range(4):
        limiter.insert()
    assert not limiter.can_insert()
    limiter.delete()
    limiter.delete()
    assert limiter.size == 2
    assert limiter.can_insert()  # 2 + 1 <= min size 3, whatever the diff
    assert not limiter.can_sample()


@given(limiter=ratio_limiters(), ops=st.lists(st.sampled_from(["insert", "sample", "delete"]), max_size=200))
def test_reverb_invariant_under_any_interleaving(limiter, ops):
    deleted = False
    for op in ops:
        # Some operation is always allowed: writers and samplers never deadlock each other.
        assert limiter.can_insert() or limiter.can_sample()
        if op == "insert" and limiter.can_insert():
            filling = limiter.size + 1 <= limiter.min_size_to_sample
            limiter.insert()
            assert filling or limiter.diff <= limiter.max_diff
        elif op == "sample" and limiter.can_sample():
            limiter.sample()
            assert limiter.diff >= limiter.min_diff
        elif op == "delete" and limiter.size > 0:
            limiter.delete()
            deleted = True
        if not deleted and limiter.size >= limiter.min_size_to_sample:
            assert limiter.min_diff <= limiter.diff <= limiter.max_diff


@settings(max_examples=60, deadline=None)
@given(
    limiter=ratio_limiters(),
    selector=st.sampled_from(["fifo", "uniform", "prioritized"]),
    extra_capacity=st.integers(0, 8),
    ops=st.lists(st.one_of(st.just(0), st.integers(1, 5)), max_size=80),
)
def test_a_table_keeps_the_invariant(limiter, selector, extra_capacity, ops):
    """0 = try an insert, k > 0 = a Sample of k items that does not wait; evictions and fifo removals included."""

    async def run() -> None:
        max_size = limiter.min_size_to_sample + extra_capacity
        table = Table("t", max_size, selector=selector, rate_limiter=limiter, seed=0)
        for op in ops:
            if op == 0 and limiter.can_insert():
                filling = limiter.size + 1 <= limiter.min_size_to_sample
                await table.insert(replay_pb2.Trajectory(), 1.0)
                assert filling or limiter.diff <= limiter.max_diff
            elif op > 0:
                allowed = limiter.can_sample()
                taken = await table.sample(op, timeout_s=0)
                assert bool(taken) == allowed
                assert len(taken) <= op
                assert not taken or limiter.diff >= limiter.min_diff
            assert table.size == limiter.size <= max_size
            assert limiter.can_insert() or limiter.can_sample()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: RateLimiter.min_size(0), "min_size_to_sample must be an integer >= 1, got 0"),
        (lambda: RateLimiter(-1.0, 1, 0.0, 10.0), "samples_per_insert must be finite and > 0, got -1.0"),
        (lambda: RateLimiter(0.0, 1, 0.0, 10.0), "got 0.0"),
        (lambda: RateLimiter(math.nan, 1, 0.0, 10.0), "got nan"),
        (lambda: RateLimiter(1.0, 1, 5.0, 2.0), "min_diff=5.0, max_diff=2.0"),
        (lambda: RateLimiter(1.0, 1, math.nan, 2.0), "min_diff=nan"),
        (
            lambda: RateLimiter.sample_to_insert_ratio(4.0, 1, error_buffer=3.0),
            r"error buffer \[1.0, 7.0\] \(width 6.0\) must be at least 2 \* max\(1, samples_per_insert=4.0\)",
        ),
        (lambda: RateLimiter.sample_to_insert_ratio(1.0, 2, (0.0, 1.0)), r"error buffer \[0.0, 1.0\]"),
        (lambda: RateLimiter.sample_to_insert_ratio(1.0, 2, (3.0, 10.0)), "min_diff=3.0 is above .* = 2.0"),
        (lambda: RateLimiter.sample_to_insert_ratio(1.0, 2, -1.0), "error_buffer must be >= 0, got -1.0"),
    ],
)
def test_constructor_rejects_bad_values(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_info_reports_the_state():
    limiter = RateLimiter.sample_to_insert_ratio(2.0, 1, 3.0)
    limiter.insert()
    limiter.sample()
    limiter.blocked_samples += 1
    info = limiter.info()
    assert (info.min_size_to_sample, info.samples_per_insert, info.min_diff, info.max_diff) == (1, 2.0, -1.0, 5.0)
    assert (info.diff, info.blocked_inserts, info.blocked_samples, info.deletes) == (1.0, 0, 1, 0)
