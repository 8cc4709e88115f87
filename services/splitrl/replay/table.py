"""A replay table in the spirit of Reverb's Table: stored items, a selector, a rate limiter.

Invariants:
- 0 <= size <= max_size; keys strictly increase with insertion, from 0;
- the remover is FIFO: inserting into a full table first evicts the oldest item (`evictions`);
- an item sampled `max_times_sampled` times (0 = unlimited; fifo: always 1) is removed
  as it is handed out, so it is never handed out again;
- the rate limiter admits one item at a time: an insert waits, with no timeout, until it
  may proceed (backpressure on the writer); a sample call waits up to its timeout for the
  first item, then takes items while the limiter allows, up to the number asked for;
- size == rate_limiter.size, and the Prometheus series match the counters, between calls;
- with a journal (`on_insert` / `on_sample` / `on_priorities`, see persistence.py) every change is
  handed to it in the same atomic step that makes it, so the journal's order is the table's order;
  an `on_insert` that raises stores nothing (the insert is refused, its key is not used).

Everything runs on one asyncio loop; methods without an `await` are atomic.
The `restore_*` methods rebuild a table from a snapshot and log (no rate limiter, no journal).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from splitrl.core.metrics import Metrics
from splitrl.replay.rate_limiter import RateLimiter
from splitrl.replay.selectors import SelectorName, make_selector
from splitrl.v1 import replay_pb2, replay_store_pb2

#: Called with (key, priority) just before an item is stored; raising refuses the insert.
InsertHook = Callable[[int, float], None]


@dataclass
class Item:
    key: int
    trajectory: replay_pb2.Trajectory
    priority: float
    times_sampled: int = 0


@dataclass(frozen=True)
class Sampled:
    """One item as it was when drawn: `probability` of drawing it, from `table_size` items."""

    key: int
    trajectory: replay_pb2.Trajectory
    priority: float
    probability: float
    times_sampled: int
    table_size: int


class Table:
    """Named table of trajectory chunks; see the module docstring for what it guarantees."""

    def __init__(
        self,
        name: str,
        max_size: int,
        *,
        selector: SelectorName = "fifo",
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int = 0,
        priority_exponent: float = 1.0,
        seed: int | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """`rate_limiter` defaults to RateLimiter.min_size(1); `seed` fixes the selector's draws;
        `metrics` receives this table's series (a private registry when None)."""
        if not name:
            raise ValueError("table name must not be empty")
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        limiter = RateLimiter.min_size(1) if rate_limiter is None else rate_limiter
        if not 1 <= limiter.min_size_to_sample <= max_size:
            raise ValueError(
                f"min_size_to_sample must be in [1, max_size={max_size}], got {limiter.min_size_to_sample}"
            )
        if limiter.inserts or limiter.samples or limiter.deletes:
            raise ValueError(f"rate_limiter {limiter!r} has already counted operations; give each table a new one")
        if not (math.isfinite(priority_exponent) and priority_exponent >= 0):
            raise ValueError(f"priority_exponent must be finite and >= 0, got {priority_exponent!r}")
        if max_times_sampled < 0:
            raise ValueError(f"max_times_sampled must be >= 0 (0 = unlimited), got {max_times_sampled}")
        if selector == "fifo" and max_times_sampled not in (0, 1):
            raise ValueError(
                f"a fifo table hands each item out once; max_times_sampled must be 0 or 1, got {max_times_sampled}"
            )
        self._selector = make_selector(selector, random.Random(seed), priority_exponent)
        self.name, self.max_size, self.selector = name, max_size, selector
        self.max_times_sampled = 1 if selector == "fifo" else max_times_sampled
        self.priority_exponent = float(priority_exponent)
        self.rate_limiter = limiter
        self.evictions = 0
        self._max_priority: float | None = None
        self._items: OrderedDict[int, Item] = OrderedDict()
        self._next_key = 0
        self._changed = asyncio.Condition()
        #: Journal of samples and priority updates (persistence); None: nothing is recorded.
        self.on_sample: Callable[[list[int]], None] | None = None
        self.on_priorities: Callable[[list[tuple[int, float]]], None] | None = None
        self._metrics = Metrics(CollectorRegistry()) if metrics is None else metrics
        for series in (
            self._metrics.replay_inserts,
            self._metrics.replay_samples,
            self._metrics.replay_evictions,
            self._metrics.replay_duplicates,
        ):
            series.labels(table=name)  # every series exists, at 0, from the start
        for op in ("insert", "sample"):
            self._metrics.replay_rate_limiter_blocked.labels(table=name, op=op)
        self._metrics.replay_max_size.labels(table=name).set(max_size)
        self._export()

    @property
    def size(self) -> int:
        return len(self._items)

    @property
    def inserts(self) -> int:
        return self.rate_limiter.inserts

    @property
    def samples(self) -> int:
        return self.rate_limiter.samples

    async def insert(
        self, trajectory: replay_pb2.Trajectory, priority: float | None = None, *, on_insert: InsertHook | None = None
    ) -> int:
        """Store an item once the rate limiter allows; returns its key. ValueError for a bad priority.

        `priority` None: the largest priority this table has been given so far, 1.0 if none.
        `on_insert(key, priority)` runs after the wait, right before the item is stored, in the same
        atomic step (a write-ahead log appends there; a deduplicator re-checks there); if it raises,
        nothing is stored and the exception propagates.
        """
        priority = self._selector.validate(self._default_priority() if priority is None else priority)
        limiter = self.rate_limiter
        async with self._changed:
            if not limiter.can_insert():
                limiter.blocked_inserts += 1
                self._metrics.replay_rate_limiter_blocked.labels(table=self.name, op="insert").inc()
                await self._changed.wait_for(limiter.can_insert)
            key = self._next_key
            if on_insert is not None:
                on_insert(key, priority)
            self._store(key, trajectory, priority)
            self._metrics.replay_inserts.labels(table=self.name).inc()
            self._export()
            self._changed.notify_all()
            return key

    def _store(self, key: int, trajectory: replay_pb2.Trajectory, priority: float, times_sampled: int = 0) -> None:
        """Store an item under `key` (>= the next key), evicting the oldest if the table is full."""
        self._seen(priority)
        if len(self._items) == self.max_size:
            self._remove(next(iter(self._items)))
            self.evictions += 1
            self._metrics.replay_evictions.labels(table=self.name).inc()
        self._next_key = key + 1
        self._items[key] = Item(key, trajectory, priority, times_sampled)
        self._selector.insert(key, priority)
        self.rate_limiter.insert()

    async def sample(self, num_items: int, timeout_s: float | None) -> list[Sampled]:
        """Wait up to `timeout_s` (None: forever) until one item may be sampled, then draw up to `num_items`.

        Returns [] if the timeout passes first; fewer than `num_items` when the
        rate limiter (or, for fifo, the table running dry) stops the batch early.
        """
        if num_items < 1:
            raise ValueError(f"num_items must be >= 1, got {num_items}")
        limiter = self.rate_limiter
        async with self._changed:
            if not limiter.can_sample():
                limiter.blocked_samples += 1
                self._metrics.replay_rate_limiter_blocked.labels(table=self.name, op="sample").inc()
                try:
                    await asyncio.wait_for(self._changed.wait_for(limiter.can_sample), timeout_s)
                except TimeoutError:
                    return []
            taken: list[Sampled] = []
            while len(taken) < num_items and limiter.can_sample():
                taken.append(self._draw())
            if self.on_sample is not None and taken:
                self.on_sample([item.key for item in taken])
            self._metrics.replay_samples.labels(table=self.name).inc(len(taken))
            self._export()
            self._changed.notify_all()  # samples and removals may have opened the limiter to inserts
            return taken

    def update_priorities(self, updates: Iterable[tuple[int, float]]) -> tuple[int, int]:
        """Set the priorities of stored items; returns (updated, unknown keys).

        All-or-nothing: every priority is validated (ValueError naming the key and
        value) before any is applied. Keys no longer stored (evicted, sampled out)
        are counted, not refused. Fifo and uniform tables store the priority but
        do not select by it.
        """
        checked = []
        for key, priority in updates:
            try:
                checked.append((key, self._selector.validate(priority)))
            except ValueError as error:
                raise ValueError(f"key {key}: {error}") from None
        updated = self._apply_priorities(checked)
        if self.on_priorities is not None and updated:
            self.on_priorities(checked)
        unknown = len(checked) - updated
        self._metrics.replay_priority_updates.labels(table=self.name, outcome="applied").inc(updated)
        self._metrics.replay_priority_updates.labels(table=self.name, outcome="unknown_key").inc(unknown)
        return updated, unknown

    def _apply_priorities(self, checked: list[tuple[int, float]]) -> int:
        updated = 0
        for key, priority in checked:
            item = self._items.get(key)
            if item is None:
                continue
            item.priority = priority
            self._selector.update(key, priority)
            self._seen(priority)
            updated += 1
        return updated

    def items(self) -> Iterator[Item]:
        """The stored items, oldest first (for snapshots: read them without an await in between)."""
        return iter(self._items.values())

    def state(self) -> replay_store_pb2.TableState:
        """The counters a snapshot keeps beside the items."""
        limiter = self.rate_limiter
        return replay_store_pb2.TableState(
            name=self.name,
            next_key=self._next_key,
            inserts=limiter.inserts,
            samples=limiter.samples,
            deletes=limiter.deletes,
            evictions=self.evictions,
            blocked_inserts=limiter.blocked_inserts,
            blocked_samples=limiter.blocked_samples,
            max_priority=self._max_priority,
        )

    def restore_snapshot(
        self, state: replay_store_pb2.TableState, items: Iterable[replay_store_pb2.LoggedInsert]
    ) -> None:
        """Load a snapshot's counters and items (oldest first) into this new, empty table.

        Items beyond max_size (the table was made smaller) are evicted, oldest first, and counted.
        """
        limiter = self.rate_limiter
        if self._items or limiter.inserts:
            raise ValueError(f"table {self.name!r}: a snapshot can only be restored into a new table")
        for item in items:
            priority = self._selector.validate(item.priority)
            self._items[item.key] = Item(item.key, item.trajectory, priority, item.times_sampled)
            self._selector.insert(item.key, priority)
        limiter.inserts, limiter.deletes, limiter.samples = state.inserts, state.deletes, state.samples
        limiter.blocked_inserts, limiter.blocked_samples = state.blocked_inserts, state.blocked_samples
        self.evictions, self._next_key = state.evictions, state.next_key
        self._max_priority = state.max_priority if state.HasField("max_priority") else None
        if limiter.size != len(self._items):
            raise ValueError(
                f"table {self.name!r}: snapshot holds {len(self._items)} items but its counters say "
                f"{limiter.inserts} inserts - {limiter.deletes} deletes"
            )
        while len(self._items) > self.max_size:
            self._remove(next(iter(self._items)))
            self.evictions += 1

    def restore_item(self, item: replay_store_pb2.LoggedInsert) -> None:
        """Replay one logged insert under its original key (ValueError if keys would go backwards)."""
        if item.key < self._next_key:
            raise ValueError(f"table {self.name!r}: logged key {item.key} is below the next key {self._next_key}")
        self._store(item.key, item.trajectory, self._selector.validate(item.priority))

    def restore_samples(self, keys: Iterable[int]) -> None:
        """Replay one logged Sample call: count each key's sample, removing items sampled out."""
        for key in keys:
            item = self._items.get(key)
            self.rate_limiter.sample()
            if item is None:  # cannot happen with a consistent log; counting it keeps `samples` exact
                continue
            item.times_sampled += 1
            if item.times_sampled == self.max_times_sampled:
                self._remove(key)

    def restore_priorities(self, updates: Iterable[tuple[int, float]]) -> None:
        """Replay one logged priority update."""
        self._apply_priorities([(key, self._selector.validate(priority)) for key, priority in updates])

    def restored(self) -> None:
        """Restore is over: export the restored size and diff."""
        self._export()

    def info(self) -> replay_pb2.TableInfo:
        return replay_pb2.TableInfo(
            name=self.name,
            size=self.size,
            max_size=self.max_size,
            inserts=self.inserts,
            samples=self.samples,
            selector=self.selector,
            max_times_sampled=self.max_times_sampled,
            priority_exponent=self.priority_exponent,
            rate_limiter=self.rate_limiter.info(),
            evictions=self.evictions,
        )

    def _draw(self) -> Sampled:
        size = len(self._items)
        key, probability = self._selector.sample()
        item = self._items[key]
        item.times_sampled += 1
        self.rate_limiter.sample()
        sampled = Sampled(key, item.trajectory, item.priority, probability, item.times_sampled, size)
        if item.times_sampled == self.max_times_sampled:
            self._remove(key)
        return sampled

    def _default_priority(self) -> float:
        return 1.0 if self._max_priority is None else self._max_priority

    def _seen(self, priority: float) -> None:
        self._max_priority = priority if self._max_priority is None else max(self._max_priority, priority)

    def _remove(self, key: int) -> None:
        del self._items[key]
        self._selector.delete(key)
        self.rate_limiter.delete()

    def _export(self) -> None:
        self._metrics.replay_size.labels(table=self.name).set(self.size)
        self._metrics.replay_acknowledged.labels(table=self.name).set(self.inserts)
        self._metrics.replay_rate_limiter_diff.labels(table=self.name).set(self.rate_limiter.diff)
