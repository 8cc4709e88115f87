"""benchmarks/action_mix.py reads a trained run's policy: argmax, sampled and a reassigned sampling pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "action_mix.py"


@pytest.mark.timeout(300)
def test_action_mix_plays_a_run_three_ways_and_refuses_an_action_the_env_lacks(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "splitrl.cli.main", "up", "--env", "splitrl/Catch-v0", "--frame-size", "36"]
    command += ["--num-envs", "4", "--chunks-per-update", "4", "--steps", "800", "--width", "32"]
    command += ["--tls", "plaintext", "--no-tensorboard", "--run-dir", str(run_dir)]
    trained = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]

    mix = [sys.executable, str(SCRIPT), str(run_dir), "--episodes", "2"]
    played = subprocess.run([*mix, "--reassign", "0:1"], capture_output=True, text=True, timeout=120)
    assert played.returncode == 0, played.stdout + played.stderr
    lines = played.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[1:]] == ["argmax", "sampled", "sampled, 0->1"], played.stdout
    # Catch's three actions: the reassigned pass never takes action 0.
    assert "share of steps per action 0:0.00 " in lines[3] and "entropy" in lines[3], lines[3]

    refused = subprocess.run([*mix, "--reassign", "0:7"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "has actions 0..2" in refused.stderr, refused.stderr
    same = subprocess.run([*mix, "--reassign", "1:1"], capture_output=True, text=True, timeout=120)
    assert same.returncode == 2 and "to another; got '1:1'" in same.stderr, same.stderr
