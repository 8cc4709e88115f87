"""The replay's files as records: framing ([u32 length][u32 crc32][payload], little-endian), reading a file's
whole records back (`RecordReader`: a torn tail stops it), and the write-ahead log's open segment (`Log`:
appends, grouped fsyncs, rotation). splitrl.replay.persistence says what the records hold and when they are
written and restored."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from google.protobuf.message import DecodeError, Message

from splitrl.core.metrics import Metrics
from splitrl.core.state_files import CorruptState, fsync_directory
from splitrl.v1 import replay_store_pb2

FsyncPolicy = Literal["always", "never"]
MAGIC_LOG = b"SRLWAL1\n"
_FRAME = struct.Struct("<II")
#: A length above this is not a record of ours (corruption), not a request to allocate it.
MAX_RECORD_BYTES = 1 << 30


class CorruptData(CorruptState):
    """A snapshot or a log segment that cannot be restored; the message names the file and offset."""


def frame(payload: bytes) -> bytes:
    """One record as it lies on disk: length, CRC-32 of the payload, payload."""
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass
class RecordReader:
    """Iterates the records of one file; afterwards `end` is the offset just past the last whole record.

    A short or CRC-failing record stops the iteration (`torn` is then True); nothing after it is read.
    `incomplete` says the file ends inside that record (its header or payload runs past the end of the file);
    `next_record` then tells whether a whole record still follows it (corruption, not a torn write).
    """

    path: Path
    magic: bytes
    end: int = 0
    torn: bool = False
    incomplete: bool = False

    def __iter__(self) -> Iterator[bytes]:
        with self.path.open("rb") as file:
            head = file.read(len(self.magic))
            if head != self.magic:
                if self.magic.startswith(head):  # created, crashed before its magic was whole
                    self.torn = self.incomplete = bool(head)
                    return
                raise CorruptData(f"{self.path} is not a splitrl replay file (starts with {head!r})")
            self.end = len(self.magic)
            while header := file.read(_FRAME.size):
                if len(header) < _FRAME.size:
                    self.torn = self.incomplete = True
                    return
                length, crc = _FRAME.unpack(header)
                payload = file.read(length) if length <= MAX_RECORD_BYTES else b""
                if length > MAX_RECORD_BYTES or len(payload) < length or zlib.crc32(payload) != crc:
                    self.torn = True
                    self.incomplete = length <= MAX_RECORD_BYTES and len(payload) < length
                    return
                self.end += _FRAME.size + length
                yield payload

    def next_record(self) -> int | None:
        """After a stop at a bad record: the offset of the first whole, CRC-valid record after `end`, or None.

        A torn write leaves only a prefix of one record at the end of the file, never a whole record after it;
        a damaged length field makes a record look cut short while whole records follow. Every offset is tried
        (the damaged length says nothing about where the next record starts); a false match needs a length that
        fits the file and a CRC-32 that matches by chance.
        """
        data = self.path.read_bytes()
        for offset in range(self.end + 1, len(data) - _FRAME.size):
            length, crc = _FRAME.unpack_from(data, offset)
            start = offset + _FRAME.size
            if 0 < length <= len(data) - start and zlib.crc32(data[start : start + length]) == crc:
                return offset
        return None


class Log:
    """The open log segment. `append` puts a record in the OS before returning; `durable` fsyncs (grouped).

    A write or fsync that fails (a full disk) is kept in `failed`, and every later append and durable raises it
    again: nothing is appended after a record that may be torn, so the tail a restore finds is the only damage.
    """

    def __init__(self, directory: Path, segment: int, fsync: FsyncPolicy, metrics: Metrics) -> None:
        self.directory, self.fsync, self._metrics = directory, fsync, metrics
        self.segment = segment
        self._file = self._open(segment)
        self.appended = 0  # records appended since the log was opened, over all segments
        self._synced = 0
        self._syncing: asyncio.Task[None] | None = None
        self.failed: OSError | None = None

    def _open(self, segment: int) -> IO[bytes]:
        file = open(segment_path(self.directory, segment), "xb", buffering=0)  # noqa: SIM115 (kept open)
        file.write(MAGIC_LOG)
        if self.fsync == "always":
            fsync_directory(self.directory)
        return file

    def append(self, record: replay_store_pb2.LogRecord) -> None:
        self._check()
        data = frame(record.SerializeToString())
        try:
            written = self._file.write(data)  # unbuffered: one write(2); a short one would be a torn tail
            if written != len(data):
                raise OSError(errno.EIO, f"short write to {self._file.name}: {written} of {len(data)} bytes")
        except OSError as error:
            self.failed = error
            raise
        self.appended += 1
        self._metrics.replay_log_bytes.inc(len(data))

    async def durable(self) -> None:
        """Return once every record appended so far is fsynced (fsync="never": at once).

        Concurrent callers share fsyncs: one runs at a time, covering everything appended before it began.
        """
        target = self.appended
        self._check()
        while self.fsync == "always" and self._synced < target:
            if self._syncing is None:
                self._syncing = asyncio.create_task(self._sync())
            await asyncio.shield(self._syncing)

    async def _sync(self) -> None:
        covered = self.appended
        try:
            await asyncio.to_thread(os.fsync, self._file.fileno())
            self._synced = max(self._synced, covered)
        except OSError as error:
            self.failed = error
            raise
        finally:
            self._syncing = None

    def _check(self) -> None:
        if self.failed is not None:
            raise OSError(self.failed.errno, f"the log stopped at a failed write: {self.failed}")

    async def idle(self) -> None:
        """Wait until no fsync is running (so the file may be closed)."""
        while self._syncing is not None:
            with contextlib.suppress(OSError):
                await asyncio.shield(self._syncing)

    def rotate(self) -> int:
        """Close this segment (fsynced, with fsync="always") and open the next; returns the new number.

        Call after `idle()` with no await in between.
        """
        self._close_file()
        self._synced = self.appended
        self.segment += 1
        self._file = self._open(self.segment)
        return self.segment

    def close(self) -> None:
        self._close_file()

    def _close_file(self) -> None:
        if self.fsync == "always":
            os.fsync(self._file.fileno())
        self._file.close()


def segment_path(directory: Path, segment: int) -> Path:
    return directory / f"log-{segment:08d}.wal"


def log_segments(directory: Path) -> list[int]:
    return sorted(int(path.stem.removeprefix("log-")) for path in directory.glob("log-*.wal"))


def parse(message: Message, payload: bytes, path: Path) -> None:
    try:
        message.ParseFromString(payload)
    except DecodeError as error:  # CRC was right: written by something else, or another format
        raise CorruptData(f"{path}: a record passed its CRC but is not a {message.DESCRIPTOR.name}: {error}") from None
