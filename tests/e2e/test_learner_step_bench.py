"""benchmarks/learner_step.py times the learner's own minibatch step in each --train-precision, side by side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learner_step.py"


@pytest.mark.timeout(120)
def test_learner_step_times_each_precision_and_refuses_an_unknown_one() -> None:
    small = ["--width", "32", "--frame-size", "36", "--rows", "32", "--repeats", "2", "--warmup", "1"]
    timed = subprocess.run([sys.executable, str(SCRIPT), *small], capture_output=True, text=True, timeout=100)
    assert timed.returncode == 0, timed.stdout + timed.stderr
    rows = [line.split("|")[1:-1] for line in timed.stdout.splitlines() if line.startswith("| float32 |")]
    rows += [line.split("|")[1:-1] for line in timed.stdout.splitlines() if line.startswith("| bfloat16 |")]
    assert [row[0].strip() for row in rows] == ["float32", "bfloat16"], timed.stdout
    assert all(float(row[1]) > 0 for row in rows) and rows[0][3].strip() == "1.00", timed.stdout

    bad_arguments = (
        (["--precisions", "float16"], "'float16' is not one of"),
        (["--rows", "40"], "multiple"),
        (["--profile-steps", "-1"], "--profile-steps must be >= 0"),
    )
    for bad, message in bad_arguments:
        refused = subprocess.run([sys.executable, str(SCRIPT), *bad], capture_output=True, text=True, timeout=100)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr


@pytest.mark.timeout(120)
def test_learner_step_profiles_where_a_step_goes() -> None:
    small = ["--width", "32", "--frame-size", "36", "--rows", "32", "--repeats", "1", "--warmup", "1"]
    profiled = subprocess.run(
        [sys.executable, str(SCRIPT), *small, "--precisions", "float32", "--profile-steps", "2", "--profile-top", "4"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert profiled.returncode == 0, profiled.stdout + profiled.stderr
    cells = [line.split("|")[1:-1] for line in profiled.stdout.splitlines() if line.startswith("| float32 |")]
    rows = [row for row in cells if len(row) == 5]  # precision, op, input shapes, ms a step, calls a step
    assert len(rows) == 4, profiled.stdout
    ms_a_step = [float(row[3]) for row in rows]
    assert all(ms > 0 for ms in ms_a_step) and ms_a_step == sorted(ms_a_step, reverse=True), profiled.stdout
    assert any("convolution" in row[1] for row in rows), profiled.stdout  # the step's convolutions, by name
