"""Replay on disk: a write-ahead log of every change, periodic snapshots, restore at start.

Files in `data_dir`:

- `log-NNNNNNNN.wal`: log segments. Each is `MAGIC_LOG` then records framed as
  [u32 length][u32 crc32][LogRecord bytes] (little-endian). An insert is appended
  (os-level write, and with fsync="always" fsynced, several inserts sharing one
  fsync) BEFORE it is acknowledged; samples and priority updates are appended as
  they happen, without waiting for an fsync.
- `snapshot.bin`: `MAGIC_SNAPSHOT`, a SnapshotHeader (table counters, writers,
  the first log segment it does not cover), then one LoggedInsert per stored
  item. Written to `snapshot.tmp` off the event loop and renamed into place
  (atomic); the segments it covers are deleted afterwards.
- `LOCK`: held (flock) while a replay uses the directory; the kernel drops it when the process dies.

Restore = snapshot, then every later segment in order. A record cut short or
failing its CRC at the end of the last segment (a crash mid-write) is dropped
and the file truncated there; anywhere else it is corruption and replay refuses
to start, naming the file and offset. The framing, the reading of whole records and the open log segment
are splitrl.replay.records.

What restore gives back exactly: every acknowledged item, with its key,
priority and times sampled; keys continue (never reused); each table's inserts,
samples, deletes and evictions (so the rate limiter's diff); each writer's
highest sequence (deduplication). Not exact: a sample whose log record had not
reached the OS when the process died is handed out again (at-least-once to the
learner); blocked-call counts since the last snapshot; the uniform/prioritized
selectors' random state (draws after a restart differ).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from splitrl.core.metrics import Metrics
from splitrl.replay.dedup import Writers
from splitrl.replay.records import (
    MAGIC_LOG,
    CorruptData,
    FsyncPolicy,
    Log,
    RecordReader,
    frame,
    fsync_directory,
    log_segments,
    parse,
    segment_path,
)
from splitrl.replay.table import Table
from splitrl.v1 import replay_pb2, replay_store_pb2

log = logging.getLogger(__name__)

MAGIC_SNAPSHOT = b"SRLSNP1\n"
SNAPSHOT_FORMAT = 1


@dataclass
class _Captured:
    """A snapshot's content, taken in one atomic step on the event loop and written from a thread."""

    header: replay_store_pb2.SnapshotHeader
    #: (table, key, priority, times sampled, trajectory) as they were at capture; trajectories are never mutated.
    items: list[tuple[str, int, float, int, replay_pb2.Trajectory]] = field(default_factory=list)


class ReplayStore:
    """Persistence of one replay's tables in `directory`; see the module docstring for the guarantees.

    Use: `restore(tables, writers)` once, before serving (it also opens the log and attaches the
    journal to the tables); `log_insert` from an insert's on_insert hook, then `await log.durable()`
    before acknowledging; `await snapshot(...)` now and then; `await close(...)` at shutdown.
    """

    def __init__(self, directory: Path, fsync: FsyncPolicy, metrics: Metrics) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.fsync, self.metrics = directory, fsync, metrics
        self._lock_file = (directory / "LOCK").open("a")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise RuntimeError(f"{directory} is in use by another replay (its LOCK is held)") from None
        self.log: Log | None = None
        self._snapshotting = asyncio.Lock()
        self.appended_at_snapshot = 0
        self.restored_items = 0
        self._replayed = 0  # log records restore read: the next snapshot covers them too

    @property
    def snapshot_path(self) -> Path:
        return self.directory / "snapshot.bin"

    def restore(self, tables: dict[str, Table], writers: Writers) -> float:
        """Rebuild `tables` (new, empty) and `writers` from disk; open the log. Returns the seconds it took."""
        started = time.perf_counter()
        first_segment = self._restore_snapshot(tables, writers) if self.snapshot_path.exists() else 0
        segments = log_segments(self.directory)
        for segment in [s for s in segments if s < first_segment]:  # covered by the snapshot: a crash left them
            segment_path(self.directory, segment).unlink()
        later = [s for s in segments if s >= first_segment]
        for index, segment in enumerate(later):
            self._replay_segment(segment_path(self.directory, segment), tables, writers, last=index == len(later) - 1)
        for table in tables.values():
            table.restored()
            table.on_sample = lambda keys, name=table.name: self._append_sample(name, keys)
            table.on_priorities = lambda updates, name=table.name: self._append_priorities(name, updates)
        self.log = Log(self.directory, max([first_segment - 1, *later]) + 1, self.fsync, self.metrics)
        self.restored_items = sum(t.size for t in tables.values())
        elapsed = time.perf_counter() - started
        self.metrics.replay_restore_seconds.set(elapsed)
        log.info("restored %d items from %s in %.2fs", self.restored_items, self.directory, elapsed)
        return elapsed

    def _restore_snapshot(self, tables: dict[str, Table], writers: Writers) -> int:
        reader = RecordReader(self.snapshot_path, MAGIC_SNAPSHOT)
        records = iter(reader)
        header = replay_store_pb2.SnapshotHeader()
        parse(header, next(records, b""), self.snapshot_path)
        if header.format != SNAPSHOT_FORMAT:
            raise CorruptData(f"{self.snapshot_path}: format {header.format}, this replay reads {SNAPSHOT_FORMAT}")
        by_table: dict[str, list[replay_store_pb2.LoggedInsert]] = {state.name: [] for state in header.tables}
        for payload in records:
            item = replay_store_pb2.LoggedInsert()
            parse(item, payload, self.snapshot_path)
            if item.table not in by_table:
                raise CorruptData(f"{self.snapshot_path}: item {item.key} of table {item.table!r}, not in its header")
            by_table[item.table].append(item)
        if reader.torn or sum(map(len, by_table.values())) != header.items:
            raise CorruptData(f"{self.snapshot_path}: cut short or damaged at offset {reader.end}")
        for state in header.tables:
            _table(tables, state.name, self.snapshot_path).restore_snapshot(state, by_table[state.name])
        writers.restore(header.writers)
        return header.next_segment

    def _replay_segment(self, path: Path, tables: dict[str, Table], writers: Writers, *, last: bool) -> None:
        reader = RecordReader(path, MAGIC_LOG)
        for payload in reader:
            record = replay_store_pb2.LogRecord()
            parse(record, payload, path)
            self._replayed += 1
            change = record.WhichOneof("change")
            if change == "insert":
                insert = record.insert
                _table(tables, insert.table, path).restore_item(insert)
                if insert.writer_id:
                    writers.record(insert.writer_id, insert.sequence, insert.key)
            elif change == "sample":
                _table(tables, record.sample.table, path).restore_samples(record.sample.keys)
            elif change == "priorities":
                updates = record.priorities.updates
                _table(tables, record.priorities.table, path).restore_priorities((u.key, u.priority) for u in updates)
        if not reader.torn:
            return
        if not last:
            raise CorruptData(f"{path}: damaged record at offset {reader.end}, and later segments follow it")
        log.warning("%s: dropping a torn record at its end (offset %d: a crash mid-write)", path, reader.end)
        with path.open("r+b") as file:  # so the next restore does not find it in the middle
            file.truncate(reader.end)

    def log_insert(self, request: replay_pb2.InsertRequest, key: int, priority: float) -> None:
        """Append an insert (from the table's on_insert hook: before the item is stored and acknowledged)."""
        assert self.log is not None, "restore() first"
        insert = replay_store_pb2.LoggedInsert(
            table=request.table,
            key=key,
            priority=priority,
            trajectory=request.trajectory,
            writer_id=request.writer_id,
            sequence=request.sequence,
        )
        self.log.append(replay_store_pb2.LogRecord(insert=insert))

    def _append_sample(self, table: str, keys: list[int]) -> None:
        assert self.log is not None
        self.log.append(replay_store_pb2.LogRecord(sample=replay_store_pb2.LoggedSample(table=table, keys=keys)))

    def _append_priorities(self, table: str, updates: list[tuple[int, float]]) -> None:
        assert self.log is not None
        request = replay_pb2.UpdatePrioritiesRequest(
            table=table, updates=[replay_pb2.KeyPriority(key=k, priority=p) for k, p in updates]
        )
        self.log.append(replay_store_pb2.LogRecord(priorities=request))

    @property
    def changes_since_snapshot(self) -> int:
        return 0 if self.log is None else self.log.appended - self.appended_at_snapshot + self._replayed

    async def snapshot(self, tables: dict[str, Table], writers: Writers) -> None:
        """Write a snapshot of the current state and drop the log segments it covers.

        The state is captured and the log rotated in one atomic step; the file is written off the loop.
        """
        assert self.log is not None, "restore() first"
        async with self._snapshotting:
            await self.log.idle()
            captured = self._capture(tables, writers)  # no await from idle() to here: nothing changes meanwhile
            started = time.perf_counter()
            await asyncio.to_thread(self._write_snapshot, captured)
            for segment in log_segments(self.directory):
                if segment < captured.header.next_segment:
                    segment_path(self.directory, segment).unlink()
            self.metrics.replay_snapshots.inc()
            log.info(
                "snapshot of %d items in %.2fs (log from segment %d)",
                captured.header.items,
                time.perf_counter() - started,
                captured.header.next_segment,
            )

    def _capture(self, tables: dict[str, Table], writers: Writers) -> _Captured:
        assert self.log is not None
        captured = _Captured(replay_store_pb2.SnapshotHeader(format=SNAPSHOT_FORMAT))
        for table in tables.values():
            captured.header.tables.append(table.state())
            captured.items.extend(
                (table.name, item.key, item.priority, item.times_sampled, item.trajectory) for item in table.items()
            )
        captured.header.writers.extend(writers.state())
        captured.header.items = len(captured.items)
        captured.header.next_segment = self.log.rotate()
        self.appended_at_snapshot, self._replayed = self.log.appended, 0
        return captured

    def _write_snapshot(self, captured: _Captured) -> None:
        """In a worker thread: the snapshot file, written whole, then renamed over the old one."""
        tmp = self.directory / "snapshot.tmp"
        with tmp.open("wb") as file:
            file.write(MAGIC_SNAPSHOT)
            file.write(frame(captured.header.SerializeToString()))
            for table, key, priority, times_sampled, trajectory in captured.items:
                record = replay_store_pb2.LoggedInsert(
                    table=table, key=key, priority=priority, trajectory=trajectory, times_sampled=times_sampled
                )
                file.write(frame(record.SerializeToString()))
            file.flush()
            if self.fsync == "always":
                os.fsync(file.fileno())
        tmp.replace(self.snapshot_path)
        if self.fsync == "always":
            fsync_directory(self.directory)

    async def close(self, tables: dict[str, Table], writers: Writers) -> None:
        """Shutdown: a last snapshot if anything changed since the previous one, then release the directory."""
        if self.log is not None:
            if self.changes_since_snapshot:
                await self.snapshot(tables, writers)
            await self.log.idle()
            self.log.close()
            if not self.changes_since_snapshot:  # the snapshot holds everything: no empty segment left behind
                segment_path(self.directory, self.log.segment).unlink()
            self.log = None
        self._lock_file.close()


def _table(tables: dict[str, Table], name: str, path: Path) -> Table:
    table = tables.get(name)
    if table is None:
        raise CorruptData(
            f"{path} holds table {name!r}, which this replay does not define ({sorted(tables)}); "
            "add it to --extra-tables, or start on another --data-dir"
        )
    return table
