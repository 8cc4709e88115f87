"""`splitrl bench network` as a user runs it: real `splitrl up` runs, a report, and resuming without rerunning."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

FLAGS = [
    "--env", "splitrl/Catch-v0", "--frame-size", "36", "--steps", "256", "--num-envs", "4",
    "--modes", "cloud,split-accumulate", "--observation-codecs", "frame+zstd",
    "--activation-codecs", "int8+zstd", "--widths", "64", "--width", "64",
    "--unroll-length", "16", "--chunks-per-update", "2",
]  # fmt: skip


def bench(out) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "splitrl.cli.main", "bench", "network", *FLAGS, "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_bench_writes_the_table_and_resumes(tmp_path):
    first = bench(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "[1/2] cloud_frame-zstd seed 0:" in first.stdout
    with (tmp_path / "runs.csv").open() as handle:
        runs = {row["row"]: row for row in csv.DictReader(handle)}
    assert set(runs) == {"cloud frame+zstd", "split-accumulate int8+zstd w64"}
    for row in runs.values():
        assert int(row["env_steps"]) == 256
        assert int(row["wan_bytes_rollout"]) > 0
    assert int(runs["cloud frame+zstd"]["wan_bytes_training"]) == 0
    assert int(runs["split-accumulate int8+zstd w64"]["wan_bytes_training"]) > 0  # gradients went down
    report = (tmp_path / "report.md").read_text()
    assert "| split-accumulate int8+zstd w64 | 256 |" in report
    for figure in ("wan_bytes_per_step.png", "cumulative_wan_bytes.png", "return_vs_wan_bytes.png", "pareto.png"):
        assert (tmp_path / figure).stat().st_size > 10_000

    again = bench(tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("done before, reused") == 2
