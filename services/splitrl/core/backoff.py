"""The one backoff policy every redial loop uses: exponential growth, full jitter, reset on success.

The n-th consecutive failure (n = 0, 1, ...) waits a delay drawn uniformly from
[0, min(max_s, initial_s * multiplier**n)] seconds ("full jitter", AWS
architecture blog, 2015): many edges that lost the same peer at the same
moment spread their redials over the whole window instead of arriving together
when it comes back. `reset()` after a successful connection starts over.
"""

from __future__ import annotations

import asyncio
import random

from pydantic import Field

from splitrl.core.config import Settings


class RedialSettings(Settings):
    """How a service redials a peer it lost (mixed into the settings of every service that dials out)."""

    redial_initial_s: float = Field(
        0.2, gt=0, le=60, description="Longest wait (s) before the first redial of a lost peer (jittered down)."
    )
    redial_max_s: float = Field(
        5.0, gt=0, le=600, description="Longest wait (s) between redials, however many failed in a row."
    )


class Backoff:
    """Delays for consecutive failures. Not thread-safe: one per redial loop.

    Invariant: every delay is in [0, max_s], and the cap of the n-th delay is
    min(max_s, initial_s * multiplier**n), which never decreases until `reset()`.
    """

    def __init__(
        self, initial_s: float, max_s: float, *, multiplier: float = 2.0, rng: random.Random | None = None
    ) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got initial_s={initial_s}, max_s={max_s}")
        if multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {multiplier}")
        self.initial_s, self.max_s, self.multiplier = initial_s, max_s, multiplier
        self._rng = rng or random.Random()
        self.failures = 0

    @classmethod
    def of(cls, settings: RedialSettings) -> Backoff:
        """The backoff a service's redial settings describe."""
        return cls(settings.redial_initial_s, max(settings.redial_initial_s, settings.redial_max_s))

    def cap(self) -> float:
        """The largest delay the next failure may wait (s)."""
        # min() before the power overflows: the exponent stops mattering once the cap reaches max_s.
        growth = self.multiplier ** min(self.failures, 64)
        return min(self.max_s, self.initial_s * growth)

    def next_delay(self) -> float:
        """Record one more failure and return how long to wait before the next try (s)."""
        delay = self._rng.uniform(0.0, self.cap())
        self.failures += 1
        return delay

    async def sleep(self) -> float:
        """Record a failure, wait its delay, and return the delay (s)."""
        delay = self.next_delay()
        await asyncio.sleep(delay)
        return delay

    def reset(self) -> None:
        """A connection succeeded: the next failure waits at most `initial_s` again."""
        self.failures = 0
