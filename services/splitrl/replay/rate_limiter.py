"""Reverb's rate limiter: when a replay table may be inserted into or sampled from.

The limiter counts `inserts`, `samples` (items handed out) and `deletes`
(items removed for any reason), so `size = inserts - deletes`, and tracks

    diff = inserts * samples_per_insert - samples

Rules (one item at a time, exactly as Reverb's RateLimiter::CanInsert / CanSample):

- sample allowed  iff  size >= min_size_to_sample  and  diff - 1 >= min_diff;
- insert allowed  iff  size + 1 <= min_size_to_sample  (free while filling up)
                  or   diff + samples_per_insert <= max_diff.

Invariants: an allowed sample never takes diff below min_diff; an allowed
insert past min size never takes diff above max_diff. With
max_diff - min_diff >= 2 * max(1, samples_per_insert) (checked at
construction) some operation is always allowed, so writers and samplers
cannot deadlock each other. `min_size` (the default) has no ratio at all:
inserts never wait, samples wait only for `min_size_to_sample` items.
"""

from __future__ import annotations

import math

from splitrl.v1 import replay_pb2


class RateLimiter:
    """Bookkeeping and admission rules only; waiting is the table's job (it holds the lock)."""

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        min_diff: float,
        max_diff: float,
    ) -> None:
        if isinstance(min_size_to_sample, bool) or not isinstance(min_size_to_sample, int) or min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be an integer >= 1, got {min_size_to_sample!r}")
        if not (math.isfinite(samples_per_insert) and samples_per_insert > 0):
            raise ValueError(f"samples_per_insert must be finite and > 0, got {samples_per_insert!r}")
        if math.isnan(min_diff) or math.isnan(max_diff) or min_diff > max_diff:
            raise ValueError(f"need min_diff <= max_diff, got min_diff={min_diff!r}, max_diff={max_diff!r}")
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise ValueError(
                f"error buffer [{min_diff}, {max_diff}] (width {max_diff - min_diff}) must be at least "
                f"2 * max(1, samples_per_insert={samples_per_insert}) wide, or inserts and samples can both block"
            )
        if min_diff > samples_per_insert * min_size_to_sample:
            raise ValueError(
                f"min_diff={min_diff} is above samples_per_insert * min_size_to_sample = "
                f"{samples_per_insert * min_size_to_sample}: sampling would never start"
            )
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = min_size_to_sample
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)
        self.inserts = 0
        self.samples = 0
        self.deletes = 0
        #: Insert / sample calls that found the limiter closed and had to wait (each call counted once).
        self.blocked_inserts = 0
        self.blocked_samples = 0

    @classmethod
    def min_size(cls, min_size_to_sample: int) -> RateLimiter:
        """No ratio: inserts never wait; samples wait until the table holds `min_size_to_sample` items."""
        return cls(1.0, min_size_to_sample, -math.inf, math.inf)

    @classmethod
    def sample_to_insert_ratio(
        cls, samples_per_insert: float, min_size_to_sample: int, error_buffer: float | tuple[float, float]
    ) -> RateLimiter:
        """Keep samples / inserts near `samples_per_insert` once `min_size_to_sample` items are in.

        A number `error_buffer` allows diff in offset +/- error_buffer, with
        offset = samples_per_insert * min_size_to_sample (the diff at the end of
        the fill-up); a pair is (min_diff, max_diff) taken as is.
        """
        if isinstance(error_buffer, tuple):
            min_diff, max_diff = error_buffer
        else:
            if not error_buffer >= 0:
                raise ValueError(f"error_buffer must be >= 0, got {error_buffer!r}")
            offset = samples_per_insert * min_size_to_sample
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        return cls(samples_per_insert, min_size_to_sample, min_diff, max_diff)

    @property
    def size(self) -> int:
        """Items the table holds, as the limiter counts them (inserts - deletes)."""
        return self.inserts - self.deletes

    @property
    def diff(self) -> float:
        """inserts * samples_per_insert - samples."""
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self) -> bool:
        """Whether one more item may be inserted now."""
        if self.size + 1 <= self.min_size_to_sample:
            return True
        return self.diff + self.samples_per_insert <= self.max_diff

    def can_sample(self) -> bool:
        """Whether one more item may be sampled now."""
        return self.size >= self.min_size_to_sample and self.diff - 1 >= self.min_diff

    def insert(self) -> None:
        """Record one insert; the caller has checked `can_insert`."""
        self.inserts += 1

    def sample(self) -> None:
        """Record one sampled item; the caller has checked `can_sample`."""
        self.samples += 1

    def delete(self) -> None:
        """Record one item leaving the table (evicted, or sampled `max_times_sampled` times)."""
        self.deletes += 1

    def info(self) -> replay_pb2.RateLimiterInfo:
        return replay_pb2.RateLimiterInfo(
            min_size_to_sample=self.min_size_to_sample,
            samples_per_insert=self.samples_per_insert,
            min_diff=self.min_diff,
            max_diff=self.max_diff,
            diff=self.diff,
            blocked_inserts=self.blocked_inserts,
            blocked_samples=self.blocked_samples,
            deletes=self.deletes,
        )

    def __repr__(self) -> str:
        return (
            f"RateLimiter(samples_per_insert={self.samples_per_insert}, min_size_to_sample={self.min_size_to_sample}, "
            f"min_diff={self.min_diff}, max_diff={self.max_diff})"
        )
