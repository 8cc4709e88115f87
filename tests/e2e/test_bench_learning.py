"""`splitrl bench learning` on the fast env: segments with evaluations, a table and figure, and a resume."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from splitrl.run import files as run_dir_files

pytestmark = pytest.mark.e2e


def bench(tmp_path, frames: int, *extra: str, lr_anneal_steps: int | None = None) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "catch.yaml"
    config.write_text(
        "env: splitrl/Catch-v0\nframe_size: 36\nwidth: 256\nchunks_per_update: 4\ntls: plaintext\n"
        f"lr_anneal_steps: {'null' if lr_anneal_steps is None else lr_anneal_steps}\n"
    )
    command = [
        sys.executable, "-m", "splitrl.cli.main", "bench", "learning", "--config", str(config),
        "--rows", "cloud:frame", "--frames", str(frames), "--segment-frames", "600",
        "--eval-episodes", "4", "--final-episodes", "6", "--out", str(tmp_path / "out"), *extra,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=400)


@pytest.mark.timeout(900)  # three runs in one test; ~90 s on an idle 2-core machine
def test_learning_bench_trains_in_segments_evaluates_each_and_resumes(tmp_path):
    first = bench(tmp_path, 1200, lr_anneal_steps=1200)
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = tmp_path / "out" / "runs" / "cloud_frame_seed0"
    evals = run_dir_files.load_evals(run_dir)
    # each segment end: argmax, then sampled actions; the last segment's evaluations are the final ones
    assert [(e["env_steps"], e["episodes"], e["deterministic"]) for e in evals] == [
        (600, 4, True),
        (600, 4, False),
        (1200, 6, True),
        (1200, 6, False),
    ]
    table = (tmp_path / "out" / "learning.md").read_text()
    assert "| cloud:frame | 0 | 1,200 |" in table
    edge_costs = table[table.index("| row | seed | environment: CPU ms/step |") :].splitlines()
    row, seed, *costs = (cell.strip() for cell in edge_costs[2].strip("|").split("|"))
    assert (row, seed) == ("cloud:frame", "0")  # the edge's own costs, from summary.json: CPU ms/step, MiB, peak
    assert len(costs) == 6 and all(float(cost) > 0 for cost in costs), edge_costs[2]
    assert (tmp_path / "out" / "learning.png").stat().st_size > 0

    again = bench(tmp_path, 1200, lr_anneal_steps=1200)  # everything done: nothing is trained or evaluated again
    assert again.returncode == 0 and "training to" not in again.stdout
    assert len(run_dir_files.load_evals(run_dir)) == 4
    (tmp_path / "out" / "learning.md").unlink()
    # a bigger budget (past the schedule too), but only the report is written: nothing is checked or trained
    report = bench(tmp_path, 999_999, "--report-only", lr_anneal_steps=1200)
    assert report.returncode == 0 and "training to" not in report.stdout
    assert "| cloud:frame | 0 | 1,200 |" in (tmp_path / "out" / "learning.md").read_text()

    # past the recipe's learning-rate schedule every further step would train at a rate of 0: refused up front
    refused = bench(tmp_path, 1800, lr_anneal_steps=1200)
    assert refused.returncode == 2 and "training to" not in refused.stdout
    assert "steps=1800 goes past lr_anneal_steps=1200" in refused.stderr
    assert run_dir_files.load_curve(run_dir)[-1]["env_steps"] == 1200

    extended = bench(tmp_path, 1800, lr_anneal_steps=1800)  # the resumed run takes the recipe's longer schedule
    assert extended.returncode == 0, extended.stdout + extended.stderr
    assert run_dir_files.load_settings(run_dir)["lr_anneal_steps"] == 1800
    curve = run_dir_files.load_curve(run_dir)
    assert curve[-1]["env_steps"] == 1800
    assert [e["env_steps"] for e in run_dir_files.load_evals(run_dir)] == [600, 600, 1200, 1200, 1800, 1800]
    results = json.loads((tmp_path / "out" / "learning.json").read_text())
    assert results[0]["frames"] == 1800 and len(results[0]["evals"]) == 6


@pytest.mark.timeout(900)  # two bench calls; ~100 s on an idle 2-core machine
def test_the_stable_baselines3_reference_trains_beside_splitrl(tmp_path):
    result = bench(tmp_path, 1280, "--sb3-reference")
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "out" / "runs" / "sb3-ppo_seed0"
    curve = run_dir_files.load_curve(run_dir)
    assert curve[-1]["env_steps"] >= 1280 and curve[-1]["episodes"] > 0 and curve[-1]["updates"] >= 1
    evals = run_dir_files.load_evals(run_dir)
    # SB3 trains whole rollouts of 128 steps: segments of 600 frames end at 640 and 1,280.
    assert [(e["env_steps"], e["episodes"]) for e in evals] == [(640, 4), (640, 4), (1280, 6), (1280, 6)]
    assert [e["deterministic"] for e in evals] == [True, False, True, False]
    table = (tmp_path / "out" / "learning.md").read_text()
    assert "| sb3-ppo | 0 |" in table and "n/a (one process)" in table
    assert "| cloud:frame | 0 |" in table

    alone = tmp_path / "alone"  # --rows '': the peer by itself, into an output of its own
    alone.mkdir()
    only = bench(alone, 600, "--sb3-reference", "--rows", "")
    assert only.returncode == 0, only.stdout + only.stderr
    assert [path.name for path in (alone / "out" / "runs").iterdir()] == ["sb3-ppo_seed0"]
    assert "| sb3-ppo | 0 |" in (alone / "out" / "learning.md").read_text()
