"""Replay's state files damaged on disk: a torn last record is dropped; a damaged record with acknowledged
records after it refuses the start and changes nothing; a damaged snapshot falls back to the older one and
the log kept back to it, losing no acknowledged item."""

from __future__ import annotations

import struct

import pytest

from splitrl.core import state_files
from splitrl.core.rpc import Busy
from splitrl.replay.records import MAGIC_LOG, CorruptData, RecordReader, frame, segment_path
from tests.unit.test_replay_persistence import crash, insert, replay, request, stored

ITEMS = 50


async def fifty_in_one_segment(tmp_path):
    """50 acknowledged inserts in the last log segment (no snapshot); returns its path and record offsets."""
    first = replay(tmp_path, selector="fifo", max_size=100)
    await insert(first, *(request(s) for s in range(ITEMS)))
    crash(first)
    path = segment_path(tmp_path, 0)
    data = path.read_bytes()
    offsets, offset = [], len(MAGIC_LOG)
    while offset < len(data):
        offsets.append(offset)
        offset += 8 + struct.unpack_from("<I", data, offset)[0]
    assert len(offsets) == ITEMS
    return path, offsets


def damage(path, offset: int, *, xor: int = 0xFF) -> bytes:
    original = path.read_bytes()
    data = bytearray(original)
    data[offset] ^= xor
    path.write_bytes(bytes(data))
    return original


@pytest.mark.parametrize("where", ["payload", "crc", "length"])
async def test_a_damaged_middle_record_refuses_the_start_and_changes_nothing(tmp_path, where):
    path, offsets = await fifty_in_one_segment(tmp_path)
    eleventh = offsets[10]
    at = {"payload": eleventh + 20, "crc": eleventh + 5, "length": eleventh + 2}[where]
    original = damage(path, at)
    damaged = path.read_bytes()
    with pytest.raises(CorruptData, match=rf"{path}: damaged record at offset {eleventh} .*refuses to start"):
        replay(tmp_path, selector="fifo", max_size=100)
    assert path.read_bytes() == damaged  # nothing truncated: the 40 acknowledged records after it are there
    path.write_bytes(original)  # the file restored from a copy: every acknowledged item comes back
    assert sorted(stored(replay(tmp_path, selector="fifo", max_size=100))) == list(range(ITEMS))


async def test_a_whole_last_record_failing_its_crc_is_corruption_not_a_torn_write(tmp_path):
    path, offsets = await fifty_in_one_segment(tmp_path)
    damage(path, offsets[-1] + 20)
    with pytest.raises(CorruptData, match="whole but fails its CRC"):
        replay(tmp_path, selector="fifo", max_size=100)


@pytest.mark.parametrize("cut", ["last record", "mid-file"])
async def test_a_log_cut_short_keeps_every_whole_record_and_says_what_it_dropped(tmp_path, caplog, cut):
    """A cut in the last record is what a crash mid-write leaves (never acknowledged: its write had not
    returned); a cut mid-file removed what lay after it from the disk. Either way every whole record comes back."""
    path, offsets = await fifty_in_one_segment(tmp_path)
    kept = {"last record": ITEMS - 1, "mid-file": 25}[cut]
    end = path.stat().st_size - 3 if cut == "last record" else offsets[25] + 30
    with path.open("r+b") as file:
        file.truncate(end)
    second = replay(tmp_path, selector="fifo", max_size=100)
    assert sorted(stored(second)) == list(range(kept))
    assert f"dropping an incomplete last record (offset {offsets[kept]}, {end - offsets[kept]} bytes" in caplog.text
    assert path.stat().st_size == offsets[kept]
    crash(second)


def test_next_record_finds_a_whole_record_after_a_damaged_one(tmp_path):
    path = tmp_path / "f.wal"
    records = [frame(b"first"), frame(b"second"), frame(b"third")]
    bad = bytearray(records[1])
    bad[2] = 0x7F  # its length now runs past the end of the file
    path.write_bytes(MAGIC_LOG + records[0] + bytes(bad) + records[2])
    reader = RecordReader(path, MAGIC_LOG)
    assert list(reader) == [b"first"] and reader.incomplete
    assert reader.next_record() == len(MAGIC_LOG) + len(records[0]) + len(records[1])
    path.write_bytes(MAGIC_LOG + records[0] + records[1][:-3])  # a torn tail: nothing whole after it
    reader = RecordReader(path, MAGIC_LOG)
    assert list(reader) == [b"first"] and reader.incomplete and reader.next_record() is None


async def snapshots_and_log(tmp_path):
    """Items 0-9, a snapshot, 10-19, a snapshot, 20-29 in the log; SIGKILLed. Returns the snapshots, newest first."""
    first = replay(tmp_path, selector="fifo", max_size=100)
    for batch in range(3):
        await insert(first, *(request(s) for s in range(10 * batch, 10 * batch + 10)))
        if batch < 2:
            await first.store.snapshot(first.tables, first.writers)
    crash(first)
    return first.store.snapshots()


@pytest.mark.parametrize("fault", ["flipped byte", "cut short", "empty"])
async def test_a_damaged_snapshot_is_set_aside_and_the_older_one_and_its_log_lose_nothing(tmp_path, fault, caplog):
    newest, _older = await snapshots_and_log(tmp_path)
    data = newest.read_bytes()
    newest.write_bytes(
        {"flipped byte": data[:200] + bytes([data[200] ^ 1]) + data[201:], "cut short": data[:-10], "empty": b""}[fault]
    )
    second = replay(tmp_path, selector="fifo", max_size=100)
    assert sorted(stored(second)) == list(range(30))  # the older snapshot, then every segment after it
    assert f"{newest}" in caplog.text and "trying an older snapshot" in caplog.text
    assert (tmp_path / f"{newest.name}.corrupt").exists() and not newest.exists()
    (ack,) = await insert(second, request(30))
    assert (ack.key, ack.duplicate) == (30, False)  # keys and the writer's sequence go on
    await second.stop()
    assert sorted(stored(replay(tmp_path, selector="fifo", max_size=100))) == list(range(31))


async def test_no_good_snapshot_refuses_the_start_naming_each(tmp_path):
    newest, older = await snapshots_and_log(tmp_path)
    for path in (newest, older):
        path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CorruptData, match=rf"no good snapshot in {tmp_path}: {newest}.*{older}"):
        replay(tmp_path, selector="fifo", max_size=100)


async def test_a_missing_log_segment_refuses_the_start(tmp_path):
    await snapshots_and_log(tmp_path)
    (tmp_path / "snapshot-00000002.bin").unlink()  # the older snapshot needs segments 1 and 2
    segment_path(tmp_path, 1).unlink()
    with pytest.raises(CorruptData, match=r"incomplete .*a segment was removed"):
        replay(tmp_path, selector="fifo", max_size=100)


async def test_a_log_the_disk_refuses_stops_replay_and_keeps_every_acknowledged_insert(tmp_path):
    first = replay(tmp_path, selector="fifo", max_size=100)
    await insert(first, *(request(s) for s in range(5)))
    log = first.store.log
    real_file = log._file

    class FullDisk:
        name = real_file.name

        def write(self, data):  # a short write: the disk filled mid-record
            return real_file.write(data[:7])

        def __getattr__(self, attribute):
            return getattr(real_file, attribute)

    log._file = FullDisk()
    with pytest.raises(Busy, match=r"replay cannot write its log .*short write"):
        await insert(first, request(5))
    assert first.finished().is_set() and state_files.cannot_write(first.failure())
    with pytest.raises(Busy):  # nothing is appended after a record that may be torn
        await insert(first, request(5))
    log._file = real_file
    crash(first)
    second = replay(tmp_path, selector="fifo", max_size=100)  # the torn tail is the incomplete last record
    assert sorted(stored(second)) == list(range(5))
    crash(second)
