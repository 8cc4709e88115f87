"""splitrl.replay.table.QueueTable: FIFO, sample-once, eviction, and the min-size wait."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from splitrl.core import wire
from splitrl.replay.table import QueueTable
from splitrl.v1 import replay_pb2


def trajectory(tag: int) -> replay_pb2.Trajectory:
    """A Trajectory recognisable by its tag (stored in step_ids)."""
    return replay_pb2.Trajectory(step_ids=wire.encode(torch.tensor([tag, tag + 1])))


def tag(item) -> int:
    return int(wire.decode(item.trajectory.step_ids)[0])


async def fill(table: QueueTable, tags) -> list[int]:
    return [await table.insert(trajectory(t)) for t in tags]


async def test_items_come_out_oldest_first():
    table = QueueTable("queue", max_size=10)
    await fill(table, [10, 20, 30, 40])
    first = await table.sample(2, timeout_s=1)
    second = await table.sample(5, timeout_s=1)
    assert [tag(item) for item in first] == [10, 20]
    assert [tag(item) for item in second] == [30, 40]


async def test_each_item_is_sampled_once():
    table = QueueTable("queue", max_size=10)
    await fill(table, range(5))
    taken = await table.sample(10, timeout_s=1)
    assert [tag(item) for item in taken] == [0, 1, 2, 3, 4]
    assert all(item.times_sampled == 1 for item in taken)
    assert table.size == 0
    assert await table.sample(1, timeout_s=0.01) == []
    assert (table.inserts, table.samples) == (5, 5)


async def test_keys_strictly_increase_across_samples_and_evictions():
    table = QueueTable("queue", max_size=2)
    keys = await fill(table, range(3))
    await table.sample(2, timeout_s=1)
    keys += await fill(table, range(2))
    assert keys == [0, 1, 2, 3, 4]


async def test_inserting_into_a_full_table_evicts_the_oldest():
    table = QueueTable("queue", max_size=3)
    await fill(table, [1, 2, 3, 4, 5])
    assert table.size == 3
    assert table.evictions == 2
    taken = await table.sample(10, timeout_s=1)
    assert [tag(item) for item in taken] == [3, 4, 5]
    assert [item.key for item in taken] == [2, 3, 4]


async def test_sample_returns_empty_after_the_timeout_below_min_size():
    table = QueueTable("queue", max_size=10, min_size_to_sample=3)
    await fill(table, [1, 2])
    started = time.monotonic()
    assert await table.sample(1, timeout_s=0.05) == []
    assert time.monotonic() - started >= 0.04
    assert table.size == 2
    assert table.samples == 0


async def test_sample_is_allowed_once_min_size_is_reached():
    table = QueueTable("queue", max_size=10, min_size_to_sample=3)
    await fill(table, [1, 2, 3])
    taken = await table.sample(1, timeout_s=0.05)
    assert [tag(item) for item in taken] == [1]
    assert table.size == 2


async def test_a_waiting_sample_is_woken_by_an_insert():
    table = QueueTable("queue", max_size=10, min_size_to_sample=2)
    await table.insert(trajectory(1))
    waiter = asyncio.create_task(table.sample(5, timeout_s=10))
    await asyncio.sleep(0.01)
    assert not waiter.done()

    started = time.monotonic()
    await table.insert(trajectory(2))
    taken = await asyncio.wait_for(waiter, timeout=2)
    assert [tag(item) for item in taken] == [1, 2]
    assert time.monotonic() - started < 1


async def test_a_timed_out_sample_leaves_the_table_usable():
    table = QueueTable("queue", max_size=10)
    assert await table.sample(1, timeout_s=0.01) == []
    await table.insert(trajectory(7))
    assert [tag(item) for item in await table.sample(1, timeout_s=0.5)] == [7]


async def test_sample_rejects_num_items_below_one():
    with pytest.raises(ValueError, match="got 0"):
        await QueueTable("queue", max_size=1).sample(0, timeout_s=0)


async def test_info_reports_the_counters():
    table = QueueTable("queue", max_size=2)
    await fill(table, [1, 2, 3])
    await table.sample(1, timeout_s=1)
    info = table.info()
    assert (info.name, info.size, info.max_size, info.inserts, info.samples) == ("queue", 1, 2, 3, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "", "max_size": 1}, "name must not be empty"),
        ({"name": "q", "max_size": 0}, "max_size must be >= 1, got 0"),
        ({"name": "q", "max_size": -5}, "got -5"),
        ({"name": "q", "max_size": 4, "min_size_to_sample": 0}, r"\[1, max_size=4\], got 0"),
        ({"name": "q", "max_size": 4, "min_size_to_sample": 5}, r"\[1, max_size=4\], got 5"),
    ],
)
def test_constructor_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QueueTable(**kwargs)
