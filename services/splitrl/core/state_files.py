"""State files that detect their own corruption: written whole or not at all, kept in generations, checked on load.

One home for what the learner's and the edge encoder's checkpoints (core.checkpoint) and replay's snapshots
(replay.persistence) share:

- `write_atomic(path, write)`: `write(file)` fills PATH.tmp, which is fsynced, renamed over PATH, and the
  directory fsynced. A crash at any moment leaves the old file or the new one, never half of one; a failure
  (a full disk) removes PATH.tmp and raises, so nothing temporary is left behind.
- Checksummed blobs (`write_blob` / `read_blob`): MAGIC, SHA-256 of the payload, the payload's length (u64,
  little-endian), the payload. A flipped byte or a cut anywhere fails the check: CorruptState naming the file.
- Generations (`rotate_in`, `generations`): PATH is the newest, PATH's stem + `.1`, `.2`, ... older ones;
  `rotate_in` shifts them down by one (the oldest beyond `keep` is dropped) and puts the new file at PATH.
  A reader tries them newest first and reports each that fails by name.

A service that refuses its state exits with EXIT_CORRUPT_STATE and one line naming the files; one that cannot
write (a full disk, an I/O error) exits with EXIT_CANNOT_WRITE (`cannot_write`). `splitrl up` ends a run on
either, with the reason, since a restart would meet the same files or the same disk.
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import IO

#: sysexits' EX_DATAERR: a state file failed its check and no good one was left.
EXIT_CORRUPT_STATE = 65
#: sysexits' EX_IOERR: a state file, log or metrics file could not be written (disk full, read-only, I/O error).
EXIT_CANNOT_WRITE = 74
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})
_BLOB_HEADER = struct.Struct("<32sQ")


class CorruptState(ValueError):
    """A state file (or every generation of one) failed its check; the message names the files."""


def cannot_write(error: BaseException) -> bool:
    """Whether `error` (or what caused it) says the disk refused a write: full, read-only, or failing."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in _WRITE_ERRNOS:
            return True
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return False


def fsync_directory(directory: Path) -> None:
    """Make a created or renamed file's name durable (power loss), not only its bytes."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[IO[bytes]], object], *, durable: bool = True, mode: int = 0o644) -> None:
    """Replace `path` by what `write` writes, atomically (module docstring); `durable`: fsync file and directory.
    `mode`: the new file's permissions (before the umask), from its first byte (0o600 for a private key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as file:
            write(file)
            file.flush()
            if durable:
                os.fsync(file.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(path.parent)


def write_blob(file: IO[bytes], magic: bytes, payload: bytes) -> None:
    file.write(magic + _BLOB_HEADER.pack(hashlib.sha256(payload).digest(), len(payload)) + payload)


def read_blob(path: Path, magic: bytes) -> bytes:
    """The payload of checksummed file `path`; CorruptState (naming it and what is wrong) if it fails its check."""
    data = path.read_bytes()
    if not data.startswith(magic):
        raise CorruptState(f"{path}: does not start with {magic!r} ({len(data)} bytes)")
    header_end = len(magic) + _BLOB_HEADER.size
    if len(data) < header_end:
        raise CorruptState(f"{path}: cut short at {len(data)} bytes, inside its header")
    digest, length = _BLOB_HEADER.unpack_from(data, len(magic))
    payload = data[header_end:]
    if len(payload) != length:
        raise CorruptState(f"{path}: holds {len(payload)} bytes of payload, its header says {length} (cut short?)")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptState(f"{path}: SHA-256 mismatch: the file was changed or damaged after it was written")
    return payload


def generation(path: Path, age: int) -> Path:
    """Generation `age` of `path`: the file itself for 0, else e.g. learner.2.pt for learner.pt and 2."""
    return path if age == 0 else path.with_name(f"{path.stem}.{age}{path.suffix}")


def generations(path: Path, keep: int) -> list[Path]:
    """The generations of `path` that exist, newest first."""
    return [candidate for age in range(keep) if (candidate := generation(path, age)).exists()]


def rotate_in(path: Path, write: Callable[[IO[bytes]], object], keep: int, *, durable: bool = True) -> None:
    """Write a new newest generation of `path` (atomically, as write_atomic), keeping `keep` generations in all.

    The new file is whole on disk before any older one moves: a crash between the renames leaves every
    generation that was there, one of them perhaps under the next name, and the new one as PATH.tmp (removed by
    the next write) or as PATH.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    tmp = path.with_name(path.name + ".tmp")
    write_atomic(tmp, write, durable=durable)  # PATH.tmp.tmp while it is written, then PATH.tmp, whole
    try:
        for age in range(keep - 1, 0, -1):
            older = generation(path, age - 1)
            if older.exists():
                older.replace(generation(path, age))
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(path.parent)
