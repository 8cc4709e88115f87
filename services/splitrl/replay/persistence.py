"""Replay on disk: a write-ahead log of every change, periodic snapshots, restore at start.

Files in `data_dir`:

- `log-NNNNNNNN.wal`: log segments. Each is `MAGIC_LOG` then records framed as
  [u32 length][u32 crc32][LogRecord bytes] (little-endian). An insert is appended
  (os-level write, and with fsync="always" fsynced, several inserts sharing one
  fsync) BEFORE it is acknowledged; samples and priority updates are appended as
  they happen, without waiting for an fsync.
- `snapshot-NNNNNNNN.bin` (NNNNNNNN: the first log segment it does not cover): `MAGIC_SNAPSHOT`, a
  SnapshotHeader (table counters, writers, that segment, the item count), then one LoggedInsert per stored
  item, each record with its CRC-32. Written off the event loop as `snapshot-NNNNNNNN.bin.tmp` and renamed
  into place (core.state_files.write_atomic). The newest `keep_snapshots` are kept, and every log segment
  from the oldest kept one's NNNNNNNN on: falling back to an older snapshot loses nothing.
- `LOCK`: held (flock) while a replay uses the directory; the kernel drops it when the process dies.

Restore = the newest snapshot that passes its checks (each record's CRC, the item count), then every later
segment in order. A snapshot that fails is renamed to NAME.corrupt, reported, and the next older one used;
if snapshots exist and none passes, replay refuses to start, naming each. In the log only an incomplete
last record of the last segment (the file ends inside it, and no whole record follows: a crash mid-write,
never acknowledged) is dropped, with a warning, and the file truncated there. A record failing its CRC, or
any bad record followed by whole ones, or a bad record in an earlier segment, is corruption: replay refuses
to start, naming the file, the offset and what follows, and changes nothing, so no acknowledged record is
lost. The framing, the reading of whole records and the open log segment are splitrl.replay.records.

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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from splitrl.core.metrics import Metrics
from splitrl.core.state_files import write_atomic
from splitrl.replay.dedup import Writers
from splitrl.replay.records import (
    MAGIC_LOG,
    CorruptData,
    FsyncPolicy,
    Log,
    RecordReader,
    frame,
    log_segments,
    parse,
    segment_path,
)
from splitrl.replay.table import Table
from splitrl.v1 import replay_pb2, replay_store_pb2

log = logging.getLogger(__name__)

MAGIC_SNAPSHOT = b"SRLSNP1\n"
SNAPSHOT_FORMAT = 1
#: A snapshot written before snapshots were kept in generations: read as the oldest candidate.
LEGACY_SNAPSHOT = "snapshot.bin"


@dataclass
class _ReadSnapshot:
    """A snapshot file as read and checked: its header and its items by table."""

    header: replay_store_pb2.SnapshotHeader
    by_table: dict[str, list[replay_store_pb2.LoggedInsert]]


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

    def __init__(self, directory: Path, fsync: FsyncPolicy, metrics: Metrics, keep_snapshots: int = 2) -> None:
        if keep_snapshots < 1:
            raise ValueError(f"keep_snapshots must be >= 1, got {keep_snapshots}")
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.fsync, self.metrics = directory, fsync, metrics
        self.keep_snapshots = keep_snapshots
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

    def snapshot_path(self, next_segment: int) -> Path:
        return self.directory / f"snapshot-{next_segment:08d}.bin"

    def snapshots(self) -> list[Path]:
        """The snapshot files, newest first (the legacy snapshot.bin last)."""
        numbered = sorted(self.directory.glob("snapshot-*.bin"), reverse=True)
        legacy = self.directory / LEGACY_SNAPSHOT
        return numbered + ([legacy] if legacy.exists() else [])

    def restore(self, tables: dict[str, Table], writers: Writers) -> float:
        """Rebuild `tables` (new, empty) and `writers` from disk; open the log. Returns the seconds it took."""
        started = time.perf_counter()
        first_segment = self._restore_newest_good_snapshot(tables, writers)
        later = [s for s in log_segments(self.directory) if s >= first_segment]
        if later and later != list(range(first_segment, later[-1] + 1)):
            raise CorruptData(
                f"{self.directory}: the log from segment {first_segment} on is incomplete "
                f"(segments {later}): a segment was removed"
            )
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

    def _restore_newest_good_snapshot(self, tables: dict[str, Table], writers: Writers) -> int:
        """Restore the newest snapshot that passes its checks; the first log segment it does not cover (0: none).

        One that fails is set aside as NAME.corrupt and reported; CorruptData naming each if none passes.
        """
        failures = []
        for path in self.snapshots():
            try:
                snapshot = self._read_snapshot(path)
            except CorruptData as error:
                aside = path.with_name(path.name + ".corrupt")
                path.replace(aside)
                log.error("%s; set aside as %s, trying an older snapshot", error, aside.name)
                failures.append(f"{error} (set aside as {aside.name})")
                continue
            for state in snapshot.header.tables:
                _table(tables, state.name, path).restore_snapshot(state, snapshot.by_table[state.name])
            writers.restore(snapshot.header.writers)
            if failures:
                log.warning("restored from %s, an older snapshot, and the log segments after it", path.name)
            return snapshot.header.next_segment
        if failures:
            raise CorruptData(f"no good snapshot in {self.directory}: " + "; ".join(failures))
        return 0

    def _read_snapshot(self, path: Path) -> _ReadSnapshot:
        reader = RecordReader(path, MAGIC_SNAPSHOT)
        records = iter(reader)
        header = replay_store_pb2.SnapshotHeader()
        parse(header, next(records, b""), path)
        if header.format != SNAPSHOT_FORMAT:
            raise CorruptData(f"{path}: format {header.format}, this replay reads {SNAPSHOT_FORMAT}")
        by_table: dict[str, list[replay_store_pb2.LoggedInsert]] = {state.name: [] for state in header.tables}
        for payload in records:
            item = replay_store_pb2.LoggedInsert()
            parse(item, payload, path)
            if item.table not in by_table:
                raise CorruptData(f"{path}: item {item.key} of table {item.table!r}, not in its header")
            by_table[item.table].append(item)
        if reader.torn or sum(map(len, by_table.values())) != header.items:
            raise CorruptData(f"{path}: cut short or damaged at offset {reader.end}")
        return _ReadSnapshot(header, by_table)

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
        size = path.stat().st_size
        if not last:
            raise CorruptData(
                f"{path}: damaged record at offset {reader.end} of {size} bytes, and later segments follow it; "
                "refusing to start (nothing was changed)"
            )
        following = reader.next_record()
        if not reader.incomplete or following is not None:
            what = "a whole record follows it" if following is None else f"a whole record follows at {following}"
            if not reader.incomplete and following is None:
                what = "the record is whole but fails its CRC: not a torn write"
            raise CorruptData(
                f"{path}: damaged record at offset {reader.end} of {size} bytes ({what}): acknowledged records "
                "may lie after it, so replay refuses to start and changes nothing; restore the file from a copy, "
                f"or move it aside to start without the records from offset {reader.end} on"
            )
        log.warning(
            "%s: dropping an incomplete last record (offset %d, %d bytes: a crash mid-write, never acknowledged)",
            path,
            reader.end,
            size - reader.end,
        )
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
            self._prune()
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
        """In a worker thread: the snapshot file, written whole, then renamed into place (state_files)."""

        def write(file: IO[bytes]) -> None:
            file.write(MAGIC_SNAPSHOT)
            file.write(frame(captured.header.SerializeToString()))
            for table, key, priority, times_sampled, trajectory in captured.items:
                record = replay_store_pb2.LoggedInsert(
                    table=table, key=key, priority=priority, trajectory=trajectory, times_sampled=times_sampled
                )
                file.write(frame(record.SerializeToString()))

        path = self.snapshot_path(captured.header.next_segment)
        write_atomic(path, write, durable=self.fsync == "always")

    def _prune(self) -> None:
        """Keep the newest `keep_snapshots` snapshots and the log segments from the oldest kept one's on."""
        numbered = [path for path in self.snapshots() if path.name != LEGACY_SNAPSHOT]
        for old in [*numbered[self.keep_snapshots :], self.directory / LEGACY_SNAPSHOT]:
            old.unlink(missing_ok=True)
        oldest = min(int(path.stem.removeprefix("snapshot-")) for path in numbered[: self.keep_snapshots])
        for segment in log_segments(self.directory):
            if segment < oldest:
                segment_path(self.directory, segment).unlink()

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
