"""benchmarks/encoder_step.py times the edge's own encoder passes (acting, a training step) in each
--encoder-precision, side by side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "encoder_step.py"


@pytest.mark.timeout(120)
def test_encoder_step_times_each_precision_and_refuses_bad_arguments() -> None:
    small = ["--frame-size", "36", "--act-rows", "2", "--train-rows", "8", "--repeats", "2", "--warmup", "1"]
    timed = subprocess.run([sys.executable, str(SCRIPT), *small], capture_output=True, text=True, timeout=100)
    assert timed.returncode == 0, timed.stdout + timed.stderr
    table = [line for line in timed.stdout.splitlines() if line.startswith(("| float32", "| bfloat16"))]
    lines = [line.split("|")[1:-1] for line in table]
    rows = {cells[0].strip(): cells[1:] for cells in lines}
    assert list(rows) == ["float32", "bfloat16"], timed.stdout  # in the order of --precisions
    assert all(float(row[0]) > 0 and float(row[1]) > 0 for row in rows.values()), timed.stdout
    acting, training = (float(ratio) for ratio in rows["bfloat16"][2].split("/"))
    assert acting > 0 and training > 0, timed.stdout  # each against the float32 row's medians
    error = float(timed.stdout.rsplit("relative L2 error ", 1)[1])
    assert 0 < error < 0.02, timed.stdout  # bfloat16 rounds (not float32 passes), by less than int4's 1/16

    for bad, message in (
        (["--precisions", "float16"], "'float16' is not one of"),
        (["--train-rows", "0"], "must be >= 1"),
    ):
        refused = subprocess.run([sys.executable, str(SCRIPT), *bad], capture_output=True, text=True, timeout=100)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr
