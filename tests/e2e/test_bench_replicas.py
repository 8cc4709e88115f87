"""`splitrl bench replicas` as a user runs it, at a small size: real inference processes, real streams."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_bench_replicas_measures_each_replica_count_with_streams_spread(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    command = [sys.executable, "-m", "splitrl.cli.main", "bench", "replicas", "--streams", "8"]
    command += ["--replica-counts", "1,2", "--seconds", "1.5", "--warmup-s", "0.5", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    one, two = json.loads((out / "replicas.json").read_text())
    assert (one["replicas"], one["streams_per_replica"]) == (1, [8])
    assert (two["replicas"], two["streams_per_replica"]) == (2, [4, 4])
    for row in (one, two):
        assert row["steps_per_s"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
        assert 1 <= row["mean_batch"] <= 8 and row["inference_cpu_ms_per_step"] > 0
    table = (out / "replicas.md").read_text()
    assert "| 2 | 4 + 4 |" in table and table in result.stdout


def test_bench_replicas_refuses_a_bad_count_naming_it(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "splitrl.cli.main", "bench", "replicas", "--replica-counts", "1,0"]
    result = subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "--replica-counts" in result.stderr and "(got '0')" in result.stderr, result.stderr
