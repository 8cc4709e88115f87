"""splitrl.replay.table.Table: FIFO, eviction, max_times_sampled, the rate-limiter waits, priorities, info."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from splitrl.core import wire
from splitrl.core.metrics import Metrics
from splitrl.replay.rate_limiter import RateLimiter
from splitrl.replay.table import Table
from splitrl.v1 import replay_pb2


def trajectory(tag: int) -> replay_pb2.Trajectory:
    """A Trajectory recognisable by its tag (stored in step_ids)."""
    return replay_pb2.Trajectory(step_ids=wire.encode(torch.tensor([tag, tag + 1])))


def tag(item) -> int:
    return int(wire.decode(item.trajectory.step_ids)[0])


async def fill(table: Table, tags, priority: float = 0.0) -> list[int]:
    return [await table.insert(trajectory(t), priority) for t in tags]


def queue(max_size: int = 10, min_size_to_sample: int = 1) -> Table:
    return Table("queue", max_size, rate_limiter=RateLimiter.min_size(min_size_to_sample))


async def test_items_come_out_oldest_first():
    table = queue()
    await fill(table, [10, 20, 30, 40])
    first = await table.sample(2, timeout_s=1)
    second = await table.sample(5, timeout_s=1)
    assert [tag(item) for item in first] == [10, 20]
    assert [tag(item) for item in second] == [30, 40]


async def test_fifo_hands_each_item_out_exactly_once_in_order():
    table = queue(max_size=100)
    await fill(table, range(50))
    taken = []
    for size in (1, 7, 3, 100):
        taken += await table.sample(size, timeout_s=1)
    assert [tag(item) for item in taken] == list(range(50))
    assert all(item.times_sampled == 1 and item.probability == 1.0 for item in taken)
    assert table.size == 0
    assert await table.sample(1, timeout_s=0.01) == []
    assert (table.inserts, table.samples) == (50, 50)


async def test_keys_strictly_increase_across_samples_and_evictions():
    table = queue(max_size=2)
    keys = await fill(table, range(3))
    await table.sample(2, timeout_s=1)
    keys += await fill(table, range(2))
    assert keys == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("selector", ["fifo", "uniform", "prioritized"])
async def test_inserting_into_a_full_table_evicts_the_oldest(selector):
    metrics = Metrics(CollectorRegistry())
    table = Table("t", 3, selector=selector, metrics=metrics, seed=0)
    await fill(table, [1, 2, 3, 4, 5], priority=1.0)
    assert (table.size, table.evictions) == (3, 2)
    assert table.info().evictions == 2
    assert metrics.replay_evictions.labels(table="t")._value.get() == 2
    taken = await table.sample(30, timeout_s=1)
    assert {tag(item) for item in taken} == {3, 4, 5}
    assert {item.key for item in taken} == {2, 3, 4}


async def test_max_times_sampled_removes_an_item_after_that_many_samples():
    table = Table("t", 10, selector="uniform", max_times_sampled=2, seed=1)
    await fill(table, [1, 2, 3])
    taken = await table.sample(100, timeout_s=1)
    assert len(taken) == 6  # then the table is empty and the limiter stops the batch
    assert sorted(tag(item) for item in taken) == [1, 1, 2, 2, 3, 3]
    assert max(item.times_sampled for item in taken) == 2
    assert table.size == 0
    assert table.rate_limiter.deletes == 3


async def test_sample_reports_the_table_size_when_each_item_was_drawn():
    table = queue()
    await fill(table, [1, 2, 3])
    assert [item.table_size for item in await table.sample(3, timeout_s=1)] == [3, 2, 1]


async def test_sample_returns_empty_after_the_timeout_below_min_size():
    table = queue(min_size_to_sample=3)
    await fill(table, [1, 2])
    started = time.monotonic()
    assert await table.sample(1, timeout_s=0.05) == []
    assert time.monotonic() - started >= 0.04
    assert table.size == 2
    assert table.samples == 0
    assert table.rate_limiter.blocked_samples == 1


async def test_sample_is_allowed_once_min_size_is_reached():
    table = queue(min_size_to_sample=3)
    await fill(table, [1, 2, 3])
    taken = await table.sample(1, timeout_s=0.05)
    assert [tag(item) for item in taken] == [1]
    assert table.size == 2


async def test_a_waiting_sample_is_woken_by_an_insert():
    table = queue(min_size_to_sample=2)
    await table.insert(trajectory(1))
    waiter = asyncio.create_task(table.sample(5, timeout_s=10))
    await asyncio.sleep(0.01)
    assert not waiter.done()

    started = time.monotonic()
    await table.insert(trajectory(2))
    taken = await asyncio.wait_for(waiter, timeout=2)
    # Per item, as Reverb: once the first is handed out (and removed) the table is below min size again.
    assert [tag(item) for item in taken] == [1]
    assert time.monotonic() - started < 1


async def test_a_blocked_insert_waits_for_a_sample():
    limiter = RateLimiter.sample_to_insert_ratio(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=1.0)
    table = Table("t", 10, selector="uniform", rate_limiter=limiter, seed=0)
    await fill(table, [1, 2])  # diff 2 = max_diff: a third insert would exceed it
    writer = asyncio.create_task(table.insert(trajectory(3)))
    await asyncio.sleep(0.01)
    assert not writer.done()
    assert table.rate_limiter.blocked_inserts == 1
    assert len(await table.sample(1, timeout_s=1)) == 1
    assert await asyncio.wait_for(writer, timeout=2) == 2
    assert table.info().rate_limiter.diff == 2.0


async def test_a_timed_out_sample_leaves_the_table_usable():
    table = queue()
    assert await table.sample(1, timeout_s=0.01) == []
    await table.insert(trajectory(7))
    assert [tag(item) for item in await table.sample(1, timeout_s=0.5)] == [7]


async def test_sample_rejects_num_items_below_one():
    with pytest.raises(ValueError, match="got 0"):
        await queue(max_size=1).sample(0, timeout_s=0)


@pytest.mark.parametrize("priority", [float("nan"), -1.0, float("inf")])
async def test_insert_refuses_a_bad_priority_and_stores_nothing(priority):
    table = Table("t", 4, selector="prioritized")
    with pytest.raises(ValueError, match=str(priority)):
        await table.insert(trajectory(1), priority)
    assert (table.size, table.inserts) == (0, 0)


async def test_an_insert_without_a_priority_gets_the_largest_given_so_far():
    table = Table("t", 10, selector="prioritized", seed=0)
    first = await table.insert(trajectory(1))  # nothing given yet: 1.0
    await table.insert(trajectory(2), 0.5)
    table.update_priorities([(first, 3.0)])
    third = await table.insert(trajectory(3))
    taken = {item.key: item.priority for item in await table.sample(200, timeout_s=1)}
    assert taken[third] == 3.0
    assert sorted(taken.values()) == [0.5, 3.0, 3.0]


async def test_update_priorities_counts_unknown_keys_and_is_all_or_nothing():
    table = Table("t", 2, selector="prioritized", seed=0)
    keys = await fill(table, [1, 2, 3], priority=1.0)  # key 0 evicted
    assert table.update_priorities([(keys[0], 5.0), (keys[1], 2.0), (99, 1.0)]) == (1, 2)
    with pytest.raises(ValueError, match=r"key 2: .*got nan"):
        table.update_priorities([(keys[1], 7.0), (keys[2], float("nan"))])
    taken = await table.sample(1000, timeout_s=1)
    assert {item.priority for item in taken if item.key == keys[1]} == {2.0}  # the 7.0 was not applied


async def test_fifo_and_uniform_tables_accept_priorities_without_selecting_by_them():
    table = queue()
    keys = await fill(table, [1, 2])
    assert table.update_priorities([(keys[1], 100.0)]) == (1, 0)
    assert [tag(item) for item in await table.sample(2, timeout_s=1)] == [1, 2]


async def test_info_and_metrics_report_the_state():
    metrics = Metrics(CollectorRegistry())
    limiter = RateLimiter.sample_to_insert_ratio(2.0, 2, error_buffer=4.0)
    table = Table("t", 2, selector="uniform", rate_limiter=limiter, max_times_sampled=3, metrics=metrics, seed=0)
    await fill(table, [1, 2, 3])
    await table.sample(1, timeout_s=1)
    info = table.info()
    assert (info.name, info.size, info.max_size, info.inserts, info.samples, info.evictions) == ("t", 2, 2, 3, 1, 1)
    assert (info.selector, info.max_times_sampled) == ("uniform", 3)
    state = info.rate_limiter
    assert (state.min_size_to_sample, state.samples_per_insert, state.min_diff, state.max_diff) == (2, 2.0, 0.0, 8.0)
    assert (state.diff, state.blocked_inserts, state.blocked_samples, state.deletes) == (5.0, 0, 0, 1)
    text = generate_latest(metrics.registry).decode()
    assert 'splitrl_replay_rate_limiter_diff{table="t"} 5.0' in text
    assert 'splitrl_replay_table_size{table="t"} 2.0' in text
    assert 'splitrl_replay_rate_limiter_blocked_total{op="insert",table="t"} 0.0' in text


def test_info_of_the_default_limiter_has_no_ratio():
    state = Table("t", 4).info().rate_limiter
    assert (state.min_diff, state.max_diff) == (float("-inf"), float("inf"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "", "max_size": 1}, "name must not be empty"),
        ({"name": "q", "max_size": 0}, "max_size must be >= 1, got 0"),
        ({"name": "q", "max_size": -5}, "got -5"),
        ({"name": "q", "max_size": 4, "rate_limiter": RateLimiter.min_size(5)}, r"\[1, max_size=4\], got 5"),
        ({"name": "q", "max_size": 4, "selector": "lifo"}, "got 'lifo'"),
        ({"name": "q", "max_size": 4, "max_times_sampled": -1}, "got -1"),
        ({"name": "q", "max_size": 4, "max_times_sampled": 2}, "must be 0 or 1, got 2"),
        ({"name": "q", "max_size": 4, "selector": "prioritized", "priority_exponent": -0.5}, "got -0.5"),
        ({"name": "q", "max_size": 4, "selector": "prioritized", "priority_exponent": float("nan")}, "got nan"),
    ],
)
def test_constructor_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Table(**kwargs)


async def test_a_rate_limiter_is_not_shared_between_tables():
    limiter = RateLimiter.min_size(1)
    first = Table("a", 4, rate_limiter=limiter)
    await first.insert(trajectory(1))
    with pytest.raises(ValueError, match="already counted"):
        Table("b", 4, rate_limiter=limiter)
