"""`splitrl up` keeps a run alive: SIGKILL any service mid-run, it is restarted, and the run reaches its steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from splitrl.core import scrape
from tests.ports import free_port

pytestmark = pytest.mark.e2e

STEPS = 8000  # leaves a restarted learner time to train before the run ends, even on a busy machine
FAST = [
    "--env", "splitrl/Catch-v0", "--frame-size", "36", "--width", "256", "--chunks-per-update", "4",
    "--tls", "plaintext", "--progress-interval-s", "0.5",
]  # fmt: skip


def start_up(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "splitrl.cli.main", "up", *FAST, "--run-dir", str(run_dir), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def service_pid(run_dir: Path, name: str) -> int:
    """The pid of the live `splitrl serve` of instance NAME of this run: the one given RUN_DIR/NAME.ports.json
    (the run dir is unique to the test; a replica, e.g. inference-1, serves `inference` with its own port file)."""
    port_file = str(run_dir / f"{name}.ports.json").encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                command = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in command and port_file in command:
                return int(proc.name)
    raise AssertionError(f"no live {name} process of {run_dir}")


def wait_for_updates(run_dir: Path, at_least: int, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    ports = run_dir / "learner.ports.json"
    while time.monotonic() < deadline:
        try:
            text = scrape.fetch(json.loads(ports.read_text())["metrics"])
            if scrape.total([text], "splitrl_learner_updates_total") >= at_least:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} learner updates within {deadline_s} s")


@pytest.mark.parametrize("victim", ["replay", "inference", "learner", "edge-encoder", "environment"])
def test_a_killed_service_is_restarted_and_the_run_finishes(tmp_path, victim):
    run_dir = tmp_path / "run"
    up = start_up(run_dir, "--mode", "split-accumulate", "--steps", str(STEPS))
    try:
        wait_for_updates(run_dir, 2)
        updates_at_kill = json.loads((run_dir / "curve.jsonl").read_text().splitlines()[-1])["updates"]
        os.kill(service_pid(run_dir, victim), signal.SIGKILL)
        out, err = up.communicate(timeout=300)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, out + err
    assert f"{victim} exited with code -9; restart 1 of 5" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == {victim: 1}
    assert summary["env_steps"] >= STEPS  # the restarted environment took only the steps left (a scrape's worth more)
    assert summary["env_steps"] < STEPS + 400
    assert summary["curve"][-1]["updates"] > updates_at_kill, "learner updates went on after the restart"
    assert "---- splitrl up: " in (run_dir / "logs" / f"{victim}.log").read_text()  # one log, the restart marked


def test_up_gives_up_on_a_service_that_keeps_dying(tmp_path):
    run_dir = tmp_path / "run"
    up = start_up(run_dir, "--steps", "100000000", "--max-restarts", "1")
    try:
        wait_for_updates(run_dir, 1)
        os.kill(service_pid(run_dir, "replay"), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:  # the restarted replay: kill it again once it serves
            time.sleep(0.5)
            try:
                pid = service_pid(run_dir, "replay")
                if (run_dir / "replay.ports.json").exists():
                    os.kill(pid, signal.SIGKILL)
                    break
            except AssertionError:
                pass
            assert time.monotonic() < deadline, "replay was not restarted"
        _, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 1
    assert "replay exited with code -9 after 1 restarts (--max-restarts 1); gave up" in err
    assert "replay.log" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == {"replay": 1}
    assert summary["end"]["reason"] == "crash loop" and "gave up" in summary["end"]["message"]


def test_two_inference_replicas_share_the_streams_and_a_killed_one_is_restarted(tmp_path):
    run_dir = tmp_path / "run"
    extra = ("--inference-replicas", "2", "--num-envs", "4", "--env-groups", "4")
    up = start_up(run_dir, "--mode", "split-accumulate", "--steps", str(STEPS), *extra)
    try:
        wait_for_updates(run_dir, 2)
        os.kill(service_pid(run_dir, "inference-1"), signal.SIGKILL)
        out, err = up.communicate(timeout=300)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, out + err
    assert "inference-1 exited with code -9; restart 1 of 5" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == {"inference-1": 1}
    instances = {"replay", "inference", "inference-1", "learner", "edge-encoder", "environment"}
    assert set(summary["exit_codes"]) == instances
    assert summary["env_steps"] >= STEPS
    # Both replicas acted (inference-1 after its restart too: its final counters are its second life's) and got
    # the learner's weights.
    for name in ("inference", "inference-1"):
        text = (run_dir / "metrics" / f"{name}.prom").read_text()
        assert scrape.total([text], "splitrl_inference_batch_size_sum") > 0, name
        assert scrape.total([text], "splitrl_policy_version") > 0, name
    assert "---- splitrl up: inference-1 exited" in (run_dir / "logs" / "inference-1.log").read_text()  # its own log


def test_a_killed_data_parallel_learner_rank_restarts_the_group_from_rank_0s_checkpoint(tmp_path):
    """--learners 2 (cloud): SIGKILL rank 1 mid-run. Rank 0's next all-reduce fails, so it exits too; both are
    restarted, rank 0 resumes from its checkpoint and rank 1 takes its state (as torch elastic restarts a job),
    and the run reaches its steps with both ranks' final weights identical."""
    run_dir = tmp_path / "run"
    port = free_port()  # the rendezvous's, so parallel runs never meet
    steps = 3 * STEPS  # rank 0 checkpoints every 10 updates: kill after one, with time left to go on
    extra = ("--learners", "2", "--learner-rendezvous-port", str(port))
    up = start_up(run_dir, "--mode", "cloud", "--steps", str(steps), *extra)
    try:
        wait_for_updates(run_dir, 12)
        os.kill(service_pid(run_dir, "learner-1"), signal.SIGKILL)
        out, err = up.communicate(timeout=300)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, out + err
    assert "learner-1 exited with code -9; restart 1 of 5" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"]["learner-1"] == 1 and summary["env_steps"] >= steps
    logs = {name: (run_dir / "logs" / f"{name}.log").read_text() for name in ("learner", "learner-1")}
    assert "resumed from" in logs["learner"], "rank 0 did not restart from its checkpoint"
    resumed = [line for line in logs["learner-1"].splitlines() if "rank 1 of 2: joined at policy version" in line]
    assert len(resumed) >= 2 and not resumed[-1].endswith("version 0"), resumed  # took rank 0's version
    checksums = {
        name: scrape.total([(run_dir / "metrics" / f"{name}.prom").read_text()], "splitrl_learner_weights_checksum")
        for name in ("learner", "learner-1")
    }
    assert checksums["learner"] == checksums["learner-1"] != 0, checksums
