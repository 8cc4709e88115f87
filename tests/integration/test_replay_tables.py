"""A real replay server on a loopback port: rate-limited inserts, prioritized samples, UpdatePriorities, Info."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from splitrl.core import rpc, scrape
from splitrl.core.metrics import Metrics
from splitrl.core.service import ServiceHost
from splitrl.replay.selectors import importance_weights
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import replay_pb2, replay_pb2_grpc
from tests.chunks import tiny_chunk

# Prioritized primary table: sampling from 2 items, one sample per insert, diff kept in [0, 4]; a FIFO extra table.
SETTINGS = ReplaySettings(
    tls="plaintext",
    selector="prioritized",
    max_size=3,
    min_size_to_sample=2,
    samples_per_insert=1.0,
    error_buffer=2.0,
    seed=0,
    extra_tables='[{"name": "queue"}]',
)


def chunk(steps: int = 2) -> replay_pb2.Trajectory:
    return tiny_chunk(steps)


@pytest.fixture
async def replay():
    metrics = Metrics(CollectorRegistry())
    host = await ServiceHost.start(ReplayService(SETTINGS, metrics), SETTINGS, metrics)
    channel = rpc.insecure_channel(f"127.0.0.1:{host.grpc_port}")
    yield host, replay_pb2_grpc.ReplayStub(channel)
    await channel.close()
    await host.stop()


async def info(stub) -> dict[str, replay_pb2.TableInfo]:
    response = await stub.Info(replay_pb2.InfoRequest(), timeout=5)
    return {table.name: table for table in response.tables}


async def test_rate_limiter_priorities_and_info_over_grpc(replay):
    host, stub = replay
    insert = stub.Insert()
    for sequence in range(4):  # 2 free while filling, then diff 3 and 4 <= max_diff; the 4th evicts key 0
        await insert.write(
            replay_pb2.InsertRequest(table="rollouts", sequence=sequence, trajectory=chunk(), priority=1)
        )
        assert (await asyncio.wait_for(insert.read(), 5)).key == sequence

    # A 5th insert would take diff to 5 > max_diff 4: its acknowledgement waits for a sample.
    await insert.write(replay_pb2.InsertRequest(table="rollouts", sequence=4, trajectory=chunk(), priority=1))
    pending = asyncio.ensure_future(insert.read())
    await asyncio.sleep(0.3)
    assert not pending.done()
    state = (await info(stub))["rollouts"]
    assert (state.size, state.evictions, state.selector) == (3, 1, "prioritized")
    limiter = state.rate_limiter
    assert (limiter.min_size_to_sample, limiter.samples_per_insert, limiter.min_diff, limiter.max_diff) == (2, 1, 0, 4)
    assert (limiter.diff, limiter.blocked_inserts, limiter.blocked_samples, limiter.deletes) == (4, 1, 0, 1)

    sample = await stub.Sample(replay_pb2.SampleRequest(table="rollouts", num_items=1), timeout=5)
    [item] = sample.items
    assert (item.table_size, item.probability, item.priority, item.times_sampled) == (3, pytest.approx(1 / 3), 1, 1)
    assert importance_weights([item.probability], [item.table_size], beta=1.0).tolist() == [1.0]
    assert (await asyncio.wait_for(pending, 5)).key == 4
    await insert.done_writing()

    # Keys 2, 3, 4 are stored (0 and 1 evicted); 99 never existed.
    update = replay_pb2.UpdatePrioritiesRequest(
        table="rollouts", updates=[replay_pb2.KeyPriority(key=k, priority=p) for k, p in [(4, 0), (0, 5), (99, 1)]]
    )
    response = await stub.UpdatePriorities(update, timeout=5)
    assert (response.updated, response.unknown_keys) == (1, 2)
    sample = await stub.Sample(replay_pb2.SampleRequest(table="rollouts", num_items=3), timeout=5)
    assert {i.key for i in sample.items} <= {2, 3}  # key 4 now has priority 0
    assert all(i.probability == pytest.approx(0.5) for i in sample.items)

    text = scrape.fetch(host.metrics_port)
    assert 'splitrl_replay_rate_limiter_blocked_total{op="insert",table="rollouts"} 1.0' in text
    assert 'splitrl_replay_evictions_total{table="rollouts"} 2.0' in text
    assert 'splitrl_replay_priority_updates_total{outcome="unknown_key",table="rollouts"} 2.0' in text


@pytest.mark.parametrize("priority", [float("nan"), -1.0])
async def test_bad_priorities_are_invalid_argument_and_the_server_keeps_serving(replay, priority):
    _, stub = replay
    insert = stub.Insert()
    await insert.write(replay_pb2.InsertRequest(table="queue", sequence=0, trajectory=chunk(), priority=2))
    assert (await insert.read()).key == 0

    bad = replay_pb2.UpdatePrioritiesRequest(
        table="queue",
        updates=[replay_pb2.KeyPriority(key=0, priority=3), replay_pb2.KeyPriority(key=1, priority=priority)],
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.UpdatePriorities(bad, timeout=5)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "key 1" in raised.value.details() and str(priority) in raised.value.details()

    await insert.write(replay_pb2.InsertRequest(table="queue", sequence=1, trajectory=chunk(), priority=priority))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await insert.read()
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "InsertRequest.priority" in raised.value.details()

    tables = await info(stub)
    assert (tables["queue"].size, tables["queue"].selector, tables["queue"].max_times_sampled) == (1, "fifo", 1)
    sample = await stub.Sample(replay_pb2.SampleRequest(table="queue", num_items=5), timeout=5)
    assert [(i.key, i.priority) for i in sample.items] == [(0, 2.0)]  # the refused update changed nothing
