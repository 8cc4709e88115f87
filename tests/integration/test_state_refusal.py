"""A service whose state files all fail their checks refuses to start: exit code 65 and one line naming the
files, no traceback (`splitrl up` shows that line and ends the run, since a restart would meet the same files)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from splitrl.core.state_files import EXIT_CORRUPT_STATE
from splitrl.replay.records import MAGIC_LOG, frame
from splitrl.v1 import replay_store_pb2
from tests.chunks import tiny_chunk


def serve(name: str, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "splitrl.cli.main", "serve", name, "--tls", "plaintext", "--port", "0"]
    return subprocess.run([*command, "--metrics-port", "0", *flags], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("service", "file", "flags"),
    [("learner", "learner.pt", ()), ("edge-encoder", "encoder.pt", ("--mode", "split"))],
)
def test_a_service_with_no_good_checkpoint_refuses_in_one_line(tmp_path, service, file, flags):
    (tmp_path / file).write_bytes(b"SRLCKPT1" + b"\0" * 10)  # cut short inside its header
    (tmp_path / file.replace(".pt", ".1.pt")).write_bytes(b"")  # an empty older generation
    result = serve(service, "--checkpoint-dir", str(tmp_path), *flags)
    assert result.returncode == EXIT_CORRUPT_STATE, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith(f"splitrl serve {service}:")]
    assert f"refusing to start: no good checkpoint of {tmp_path / file}" in line
    assert f"{tmp_path / file}: cut short" in line and f"{tmp_path / file.replace('.pt', '.1.pt')}" in line


def test_replay_with_a_damaged_log_record_refuses_in_one_line(tmp_path):
    records = [
        frame(
            replay_store_pb2.LogRecord(
                insert=replay_store_pb2.LoggedInsert(table="rollouts", key=key, trajectory=tiny_chunk(2, marker=key))
            ).SerializeToString()
        )
        for key in range(3)
    ]
    damaged = bytearray(records[1])
    damaged[-1] ^= 0xFF
    segment = tmp_path / "log-00000000.wal"
    segment.write_bytes(MAGIC_LOG + records[0] + bytes(damaged) + records[2])
    result = serve("replay", "--data-dir", str(tmp_path))
    assert result.returncode == EXIT_CORRUPT_STATE, result.stderr
    assert "Traceback" not in result.stderr
    assert f"splitrl serve replay: refusing to start: {segment}: damaged record at offset" in result.stderr
    assert segment.read_bytes() == MAGIC_LOG + records[0] + bytes(damaged) + records[2]  # nothing changed
