"""Checksummed, atomic state files and the checkpoints built on them: a flipped byte, a cut or an empty file
is reported by name and the previous good generation used; none good refuses; a failed write leaves no .tmp."""

from __future__ import annotations

import errno

import pytest
import torch

from splitrl.core import checkpoint, state_files
from splitrl.core.state_files import CorruptState


def state(version: int) -> dict:
    torch.manual_seed(version)
    return {"version": version, "weights": torch.randn(64, 64)}


def saved(tmp_path, versions=(1, 2, 3, 4)):
    path = tmp_path / "learner.pt"
    for version in versions:
        checkpoint.save(state(version), path)
    return path


def test_three_generations_are_kept_newest_first(tmp_path):
    path = saved(tmp_path)
    names = [p.name for p in state_files.generations(path, checkpoint.KEEP)]
    assert names == ["learner.pt", "learner.1.pt", "learner.2.pt"]
    assert [checkpoint._read(p)["version"] for p in state_files.generations(path, checkpoint.KEEP)] == [4, 3, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learner.1.pt", "learner.2.pt", "learner.pt"]  # no .tmp
    loaded = checkpoint.load(path)
    assert loaded is not None and loaded["version"] == 4 and torch.equal(loaded["weights"], state(4)["weights"])


def flip(data: bytes, at: int, count: int = 1) -> bytes:
    return data[:at] + bytes(b ^ 0xFF for b in data[at : at + count]) + data[at + count :]


FAULTS = {
    "16 bytes flipped mid-file": lambda data: flip(data, len(data) // 2, 16),
    "one byte flipped in the header": lambda data: flip(data, 12),
    "cut short": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_damaged_checkpoint_is_named_and_the_previous_good_one_used(tmp_path, fault, caplog):
    path = saved(tmp_path)
    path.write_bytes(FAULTS[fault](path.read_bytes()))
    loaded = checkpoint.load(path)
    assert loaded is not None and loaded["version"] == 3
    assert str(path) in caplog.text and "checkpoint failed its check" in caplog.text


def test_none_good_refuses_naming_every_file(tmp_path):
    path = saved(tmp_path)
    for generation in state_files.generations(path, checkpoint.KEEP):
        generation.write_bytes(generation.read_bytes()[:-1])
    with pytest.raises(CorruptState) as refused:
        checkpoint.load(path)
    message = str(refused.value)
    assert message.startswith(f"no good checkpoint of {path}: ")
    assert all(str(tmp_path / name) in message for name in ("learner.pt", "learner.1.pt", "learner.2.pt"))
    assert checkpoint.load(tmp_path / "nothing.pt") is None  # no checkpoint at all: a fresh start


def test_a_checkpoint_from_before_checksums_is_still_read(tmp_path):
    path = tmp_path / "learner.pt"
    torch.save(state(7), path)  # the plain torch zip file earlier versions wrote
    loaded = checkpoint.load(path)
    assert loaded is not None and loaded["version"] == 7
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CorruptState, match="not a readable checkpoint"):
        checkpoint.load(path)


def test_a_failed_write_leaves_the_old_generations_and_no_temporary_file(tmp_path):
    path = saved(tmp_path, versions=(1, 2))

    def full_disk(file):
        file.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as error:
        state_files.rotate_in(path, full_disk, checkpoint.KEEP)
    assert state_files.cannot_write(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learner.1.pt", "learner.pt"]
    loaded = checkpoint.load(path)
    assert loaded is not None and loaded["version"] == 2
    with pytest.raises(OSError):
        state_files.write_atomic(tmp_path / "summary.json", full_disk)
    assert not (tmp_path / "summary.json.tmp").exists() and not (tmp_path / "summary.json").exists()


def test_cannot_write_reads_the_cause():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("checkpoint failed") from inner
    except RuntimeError as outer:
        assert state_files.cannot_write(outer)
    assert not state_files.cannot_write(OSError(errno.ECONNREFUSED, "refused"))
    assert not state_files.cannot_write(ValueError("x"))
