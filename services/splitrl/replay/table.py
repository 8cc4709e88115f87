"""A FIFO queue table: items are handed out once each, oldest first (Reverb's Queue).

Invariants: 0 <= size <= max_size; keys strictly increase with insertion;
inserting into a full table evicts the oldest item; `sample` never returns
an item twice.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from splitrl.v1 import replay_pb2


@dataclass
class Item:
    key: int
    trajectory: replay_pb2.Trajectory
    times_sampled: int = 0


class QueueTable:
    """FIFO table with a minimum size before sampling is allowed."""

    def __init__(self, name: str, max_size: int, min_size_to_sample: int = 1) -> None:
        if not name:
            raise ValueError("table name must not be empty")
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        if not 1 <= min_size_to_sample <= max_size:
            raise ValueError(f"min_size_to_sample must be in [1, max_size={max_size}], got {min_size_to_sample}")
        self.name, self.max_size, self.min_size_to_sample = name, max_size, min_size_to_sample
        self._items: deque[Item] = deque()
        self._next_key = 0
        self._changed = asyncio.Condition()
        self.inserts = 0
        self.samples = 0
        self.evictions = 0

    @property
    def size(self) -> int:
        return len(self._items)

    async def insert(self, trajectory: replay_pb2.Trajectory) -> int:
        """Store an item; returns its key."""
        async with self._changed:
            if len(self._items) == self.max_size:
                self._items.popleft()
                self.evictions += 1
            key = self._next_key
            self._next_key += 1
            self._items.append(Item(key, trajectory))
            self.inserts += 1
            self._changed.notify_all()
            return key

    async def sample(self, num_items: int, timeout_s: float | None) -> list[Item]:
        """Wait until sampling is allowed (or `timeout_s` passes), then pop up to `num_items` oldest items."""
        if num_items < 1:
            raise ValueError(f"num_items must be >= 1, got {num_items}")
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: len(self._items) >= self.min_size_to_sample), timeout_s
                )
            except TimeoutError:
                return []
            taken = [self._items.popleft() for _ in range(min(num_items, len(self._items)))]
            for item in taken:
                item.times_sampled += 1
            self.samples += len(taken)
            return taken

    def info(self) -> replay_pb2.TableInfo:
        return replay_pb2.TableInfo(
            name=self.name, size=self.size, max_size=self.max_size, inserts=self.inserts, samples=self.samples
        )
