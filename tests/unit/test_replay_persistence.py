"""Replay's write-ahead log and snapshots: framing, torn tails, CRC, restore of items, keys, counters, writers.

The service's own insert path (dedup hook, log, fsync) is driven directly, without a server;
tests/integration/test_replay_persistence.py does the same over gRPC with a killed process.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from splitrl.core.metrics import Metrics
from splitrl.core.rpc import BadRequest
from splitrl.replay.dedup import Writers
from splitrl.replay.persistence import ReplayStore
from splitrl.replay.records import MAGIC_LOG, CorruptData, RecordReader, frame, segment_path
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import replay_pb2
from tests.chunks import tiny_chunk


def chunk(marker: int, steps: int = 2) -> replay_pb2.Trajectory:
    return tiny_chunk(steps, marker=marker)


def settings(data_dir: Path, **overrides) -> ReplaySettings:
    values = {"data_dir": data_dir, "fsync": "never", "selector": "uniform", "max_size": 6, "seed": 0}
    return ReplaySettings(**(values | overrides))


def replay(data_dir: Path, **overrides) -> ReplayService:
    return ReplayService(settings(data_dir, **overrides), Metrics(CollectorRegistry()))


async def insert(service: ReplayService, *requests: replay_pb2.InsertRequest) -> list[replay_pb2.InsertResponse]:
    async def stream():
        for request in requests:
            yield request

    return [ack async for ack in service.Insert(stream(), None)]


def request(sequence: int, writer: str = "w", marker: int | None = None) -> replay_pb2.InsertRequest:
    marker = sequence if marker is None else marker
    return replay_pb2.InsertRequest(table="rollouts", sequence=sequence, writer_id=writer, trajectory=chunk(marker))


def crash(service: ReplayService) -> None:
    """What SIGKILL leaves: whatever reached the OS, no last snapshot, the lock released."""
    assert service.store is not None and service.store.log is not None
    service.store.log._file.close()
    service.store._lock_file.close()


def stored(service: ReplayService) -> dict[int, tuple[int, int]]:
    """key -> (observation marker, times sampled)."""
    table = service.tables["rollouts"]
    return {item.key: (item.trajectory.observations.data[0], item.times_sampled) for item in table.items()}


def test_reader_stops_at_a_short_or_corrupt_record(tmp_path):
    path = tmp_path / "f.wal"
    whole = [frame(b"first"), frame(b"second")]
    path.write_bytes(MAGIC_LOG + b"".join(whole) + frame(b"third")[:-2])
    reader = RecordReader(path, MAGIC_LOG)
    assert list(reader) == [b"first", b"second"]
    assert reader.torn and reader.end == len(MAGIC_LOG) + sum(map(len, whole))

    bad_crc = bytearray(frame(b"third"))
    bad_crc[-1] ^= 0xFF
    path.write_bytes(MAGIC_LOG + whole[0] + bytes(bad_crc) + whole[1])
    reader = RecordReader(path, MAGIC_LOG)
    assert list(reader) == [b"first"] and reader.torn  # nothing after a bad record is trusted

    path.write_bytes(MAGIC_LOG + struct.pack("<II", 2**31, 0))  # absurd length: corruption, not an allocation
    reader = RecordReader(path, MAGIC_LOG)
    assert list(reader) == [] and reader.torn

    path.write_bytes(b"something else entirely")
    with pytest.raises(CorruptData, match="not a splitrl replay file"):
        list(RecordReader(path, MAGIC_LOG))


async def test_restore_after_a_crash_gives_back_items_keys_counters_and_writers(tmp_path):
    first = replay(tmp_path, max_times_sampled=2)
    acks = await insert(first, *(request(s) for s in range(8)))  # max_size 6: keys 0 and 1 are evicted
    assert [a.key for a in acks] == list(range(8))
    table = first.tables["rollouts"]
    sampled = await table.sample(3, timeout_s=1)
    table.update_priorities([(7, 5.0)])
    before = (table.info(), stored(first))
    assert table.samples == len(sampled) == 3 and any(times for _, times in before[1].values())
    crash(first)

    second = replay(tmp_path, max_times_sampled=2)
    restored = second.tables["rollouts"]
    assert (restored.info(), stored(second)) == before
    assert restored.info().inserts == 8 and restored.info().evictions == 2 and restored.samples == len(sampled)
    assert next(i for i in restored.items() if i.key == 7).priority == 5.0
    # Keys continue; the writer's next sequence is 8, a re-send of 5 is a duplicate with its original key.
    (ack,) = await insert(second, request(8))
    assert (ack.key, ack.duplicate) == (8, False)
    (ack,) = await insert(second, request(5))
    assert (ack.key, ack.duplicate) == (5, True)
    assert second.tables["rollouts"].inserts == 9
    with pytest.raises(BadRequest, match="skips ahead"):
        await insert(second, request(11))
    crash(second)


async def test_torn_last_record_is_dropped_and_the_file_truncated(tmp_path):
    first = replay(tmp_path)
    await insert(first, *(request(s) for s in range(3)))
    crash(first)
    (segment,) = tmp_path.glob("log-*.wal")
    whole = segment.stat().st_size
    with segment.open("ab") as file:  # a fourth insert, cut off mid-write by the crash
        file.write(frame(b"\x0a\x05" + b"x" * 100)[:40])

    second = replay(tmp_path)
    assert sorted(stored(second)) == [0, 1, 2]
    assert segment.stat().st_size == whole  # truncated: a later restore does not meet it mid-log
    (ack,) = await insert(second, request(3))
    assert ack.key == 3 and not ack.duplicate  # it was never acknowledged: stored now
    crash(second)
    third = replay(tmp_path)
    assert sorted(stored(third)) == [0, 1, 2, 3]
    crash(third)


async def test_crc_mismatch_in_an_earlier_segment_refuses_to_start(tmp_path):
    first = replay(tmp_path)
    await insert(first, request(0))
    await first.store.snapshot(first.tables, first.writers)  # rotates: segment 1 is now the open one
    await insert(first, request(1))
    crash(first)
    second = replay(tmp_path)  # opens segment 2
    crash(second)
    data = bytearray(segment_path(tmp_path, 1).read_bytes())
    data[-1] ^= 0xFF
    segment_path(tmp_path, 1).write_bytes(bytes(data))
    with pytest.raises(CorruptData, match="later segments follow"):
        replay(tmp_path)


async def test_snapshot_covers_the_log_it_replaces(tmp_path):
    first = replay(tmp_path, selector="fifo", max_size=100)
    await insert(first, *(request(s) for s in range(5)))
    await first.tables["rollouts"].sample(2, timeout_s=1)  # fifo: keys 0 and 1 leave
    await first.store.snapshot(first.tables, first.writers)
    assert [p.name for p in sorted(tmp_path.glob("log-*.wal"))] == ["log-00000001.wal"]
    await insert(first, *(request(s) for s in range(5, 7)))
    crash(first)

    second = replay(tmp_path, selector="fifo", max_size=100)
    assert sorted(stored(second)) == [2, 3, 4, 5, 6]
    info = second.tables["rollouts"].info()
    assert (info.inserts, info.samples, info.rate_limiter.deletes) == (7, 2, 2)
    await second.stop()  # graceful: a last snapshot; the log back to the older kept snapshot stays
    assert sorted(p.name for p in tmp_path.glob("snapshot-*")) == ["snapshot-00000001.bin", "snapshot-00000003.bin"]
    assert sorted(p.name for p in tmp_path.glob("log-*.wal")) == ["log-00000001.wal", "log-00000002.wal"]
    third = replay(tmp_path, selector="fifo", max_size=100)
    assert sorted(stored(third)) == [2, 3, 4, 5, 6]
    assert third.metrics.replay_acknowledged.labels(table="rollouts")._value.get() == 7
    await third.stop()


async def test_a_data_dir_serves_one_replay_at_a_time(tmp_path):
    first = replay(tmp_path)
    with pytest.raises(RuntimeError, match="in use by another replay"):
        ReplayStore(tmp_path, "never", Metrics(CollectorRegistry()))
    await first.stop()
    await replay(tmp_path).stop()


async def test_an_unknown_table_on_disk_refuses_to_start(tmp_path):
    first = replay(tmp_path, extra_tables='[{"name": "other"}]')
    await insert(first, replay_pb2.InsertRequest(table="other", sequence=0, trajectory=chunk(0)))
    crash(first)
    with pytest.raises(CorruptData, match="'other'"):
        replay(tmp_path)


def test_writers_dedup_rules():
    writers = Writers(window=2, max_writers=2)
    assert writers.check("a", 7) is None  # an unknown writer starts anywhere
    writers.record("a", 7, key=70)
    writers.record("a", 8, key=80)
    writers.record("a", 9, key=90)
    assert (writers.check("a", 9), writers.check("a", 8), writers.check("a", 7)) == (90, 80, 0)  # 7: forgotten key
    assert writers.check("a", 10) is None
    with pytest.raises(BadRequest, match="skips ahead"):
        writers.check("a", 11)
    writers.record("b", 0, key=1)
    writers.record("c", 0, key=2)  # a third writer: the least recently active ("a") is forgotten
    assert writers.check("a", 11) is None
    restored = Writers(window=2)
    restored.restore(writers.state())
    assert (restored.check("b", 0), restored.check("c", 0), restored.check("c", 1)) == (1, 2, None)


async def test_concurrent_resend_while_waiting_is_stored_once(tmp_path):
    """Two streams of one writer both wait on the rate limiter with the same chunk: one stores it."""
    service = replay(tmp_path, selector="fifo", samples_per_insert=1.0, error_buffer=1.0, min_size_to_sample=1)
    await insert(service, request(0), request(1))  # the limiter now refuses inserts until a sample
    first = asyncio.ensure_future(insert(service, request(2)))
    second = asyncio.ensure_future(insert(service, request(2)))
    await asyncio.sleep(0.1)
    assert not first.done() and not second.done()
    await service.tables["rollouts"].sample(2, timeout_s=1)
    (a,), (b,) = await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert a.key == b.key == 2 and sorted([a.duplicate, b.duplicate]) == [False, True]
    assert service.tables["rollouts"].inserts == 3
    await service.stop()
