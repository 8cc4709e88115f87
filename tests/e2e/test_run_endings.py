"""How `splitrl up` ends when something goes wrong, each with summary.json saying why: a full disk, a stuck
service, state files that fail their checks; and replay under `up` keeping what it acknowledged over a SIGKILL."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from splitrl.core import scrape
from tests.e2e.test_supervision import FAST, service_pid, start_up, wait_for_updates

pytestmark = pytest.mark.e2e

ENDLESS = ("--steps", "100000000")


def finish(up: subprocess.Popen[str], timeout_s: float = 90) -> tuple[str, str]:
    try:
        return up.communicate(timeout=timeout_s)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def acknowledged(run_dir: Path) -> float:
    port = json.loads((run_dir / "replay.ports.json").read_text())["metrics"]
    return scrape.total([scrape.fetch(port)], "splitrl_replay_acknowledged_items")


def test_replay_under_up_keeps_what_it_acknowledged_over_a_sigkill(tmp_path):
    run_dir = tmp_path / "run"
    up = start_up(run_dir, *ENDLESS)
    try:
        wait_for_updates(run_dir, 2)
        before = acknowledged(run_dir)
        pid = service_pid(run_dir, "replay")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:  # the restarted replay, once it serves
            time.sleep(0.2)
            try:
                if service_pid(run_dir, "replay") != pid and (run_dir / "replay.ports.json").exists():
                    after = acknowledged(run_dir)
                    break
            except (AssertionError, OSError, KeyError, ValueError):
                pass
            assert time.monotonic() < deadline, "replay was not restarted"
        up.send_signal(signal.SIGINT)
        finish(up)
    finally:
        if up.poll() is None:
            up.kill()
    assert before > 0 and after >= before  # restored from RUN_DIR/replay/replay, not started empty
    log = (run_dir / "logs" / "replay.log").read_text()
    assert log.count(f"items from {run_dir / 'replay' / 'replay'}") == 2
    assert json.loads((run_dir / "summary.json").read_text())["end"]["reason"] == "interrupted"


def kill_if_stopped(pid: int) -> None:
    """SIGKILL `pid` if it is still a process stopped by the test: a stopped process acts on no other signal, and
    a failing test would leave it behind."""
    with contextlib.suppress(OSError, IndexError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            os.kill(pid, signal.SIGKILL)


def test_a_stuck_service_ends_up_non_zero_with_the_reason_and_its_log(tmp_path):
    run_dir = tmp_path / "run"
    up = start_up(run_dir, *ENDLESS, "--progress-timeout-s", "4")
    stopped = None
    try:
        wait_for_updates(run_dir, 1)
        stopped = service_pid(run_dir, "inference")
        os.kill(stopped, signal.SIGSTOP)  # alive, holding its streams, doing nothing
        _, err = finish(up)
    finally:
        if up.poll() is None:
            up.kill()
        if stopped is not None:
            kill_if_stopped(stopped)
    assert up.returncode == 1, err
    assert "stayed at" in err and "(--progress-timeout-s 4)" in err
    assert "not answering /metrics: inference" in err and "the end of logs/inference.log:" in err
    end = json.loads((run_dir / "summary.json").read_text())["end"]
    assert end["reason"] == "no progress" and "not answering /metrics: inference" in end["message"]


def test_a_learner_whose_checkpoints_all_fail_their_checks_ends_the_run_with_their_names(tmp_path):
    run_dir = tmp_path / "run"
    up = start_up(run_dir, *ENDLESS)
    pid = None
    try:
        wait_for_updates(run_dir, 1)
        pid = service_pid(run_dir, "learner")
        os.kill(pid, signal.SIGSTOP)  # no checkpoint written between the damage and the kill
        learner_pt = run_dir / "checkpoints" / "learner.pt"
        learner_pt.parent.mkdir(exist_ok=True)  # the first checkpoint comes only after 10 updates
        learner_pt.write_bytes(b"SRLCKPT1 cut short")
        for older in (run_dir / "checkpoints").glob("learner.*.pt"):
            older.unlink()
        os.kill(pid, signal.SIGKILL)
        pid = None
        _, err = finish(up)
    finally:
        if up.poll() is None:
            up.kill()
        if pid is not None:
            kill_if_stopped(pid)
    assert up.returncode == 1, err
    assert "learner exited with code 65: it refused its state files" in err
    assert f"refusing to start: no good checkpoint of {learner_pt}" in err  # the learner's line, from its log
    assert "Traceback" not in (run_dir / "logs" / "learner.log").read_text().split("---- splitrl up:")[-1]
    assert json.loads((run_dir / "summary.json").read_text())["end"]["reason"] == "corrupt state"


def namespaces_work() -> bool:
    try:
        probe = ["unshare", "--user", "--map-root-user", "--mount", "true"]
        return shutil.which("unshare") is not None and subprocess.run(probe, capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(
    not namespaces_work(), reason="needs `unshare --user --map-root-user --mount` (a small tmpfs of its own)"
)
def test_a_full_disk_ends_up_cleanly_with_a_summary_and_the_reason(tmp_path):
    """The run directory on a 1.6 MB tmpfs (1 MiB of it summary.reserve) in a mount namespace of the test's own
    (the host's disks untouched): the disk fills within seconds; `up` ends non-zero, saying which service could
    not write, with summary.json written and no temporary file left."""
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    up = [sys.executable, "-m", "splitrl.cli.main", "up", *FAST, *ENDLESS, "--run-dir", str(disk / "run")]
    script = (
        f"mount -t tmpfs -o size=1600k tmpfs {disk} || exit 99\n"
        f"{' '.join(up)} > {out}/stdout 2> {out}/stderr; echo $? > {out}/rc\n"
        f"df -B1 --output=avail {disk} | tail -1 > {out}/avail\n"
        f"find {disk}/run -name '*.tmp' -o -name summary.reserve > {out}/leftovers\n"
        f"cp {disk}/run/summary.json {out}/ 2>/dev/null; true\n"
    )
    subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], timeout=150, check=True)
    err = (out / "stderr").read_text()
    assert int((out / "rc").read_text()) == 1, err
    assert "Traceback" not in err
    assert (out / "leftovers").read_text() == ""  # no learner.pt.tmp, snapshot .tmp or reserve left behind
    summary = json.loads((out / "summary.json").read_text())
    assert summary["end"]["reason"] == "cannot write", summary["end"]
    assert "it could not write its files" in summary["end"]["message"] and "bytes free" in summary["end"]["message"]
    assert summary["env_steps"] > 0
