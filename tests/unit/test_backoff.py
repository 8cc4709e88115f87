"""splitrl.core.backoff: exponential caps, full jitter within them, reset, bad values."""

from __future__ import annotations

import random

import pytest

from splitrl.core.backoff import Backoff, RedialSettings


def test_caps_double_up_to_the_maximum_and_reset_starts_over():
    backoff = Backoff(0.1, 1.0, rng=random.Random(0))
    caps = []
    for _ in range(6):
        caps.append(backoff.cap())
        backoff.next_delay()
    assert caps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    backoff.reset()
    assert backoff.cap() == pytest.approx(0.1) and backoff.failures == 0


def test_delays_are_jittered_within_each_cap_and_reproducible_with_a_seed():
    first = Backoff(0.5, 4.0, rng=random.Random(7))
    second = Backoff(0.5, 4.0, rng=random.Random(7))
    delays = []
    for _ in range(200):
        cap = first.cap()
        delay = first.next_delay()
        assert 0.0 <= delay <= cap
        assert second.next_delay() == delay  # the same seed gives the same schedule
        delays.append(delay)
    late = delays[10:]  # all at the 4 s cap: full jitter spreads them over [0, 4]
    assert min(late) < 1.0 and max(late) > 3.0
    assert len(set(late)) == len(late)


def test_many_failures_stay_at_the_cap_without_overflow():
    backoff = Backoff(0.1, 2.0, multiplier=10.0, rng=random.Random(1))
    for _ in range(10_000):
        assert backoff.next_delay() <= 2.0
    assert backoff.cap() == 2.0


async def test_sleep_waits_the_delay_it_returns():
    backoff = Backoff(0.01, 0.02, rng=random.Random(3))
    expected = Backoff(0.01, 0.02, rng=random.Random(3)).next_delay()
    assert await backoff.sleep() == expected
    assert backoff.failures == 1


def test_settings_build_a_backoff_and_bad_values_fail_fast():
    backoff = Backoff.of(RedialSettings(redial_initial_s=0.3, redial_max_s=3.0))
    assert (backoff.initial_s, backoff.max_s) == (0.3, 3.0)
    assert Backoff.of(RedialSettings(redial_initial_s=2.0, redial_max_s=1.0)).max_s == 2.0
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(2.0, 1.0)
    with pytest.raises(ValueError, match="multiplier"):
        Backoff(0.1, 1.0, multiplier=0.5)
