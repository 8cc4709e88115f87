"""`splitrl up --resume` continues a run (policy version, env steps, curve); `splitrl eval` plays and films it."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import av
import pytest

from splitrl.core import checkpoint
from splitrl.run import files as run_dir_files

pytestmark = pytest.mark.e2e

SMALL = ["--env", "splitrl/Catch-v0", "--frame-size", "36", "--num-envs", "4", "--chunks-per-update", "4"]


def splitrl(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "splitrl.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


def learner_version(run_dir: Path) -> int:
    saved = checkpoint.load(run_dir / "checkpoints" / "learner.pt")
    assert saved is not None
    return int(saved["version"])


@pytest.mark.timeout(900)  # three runs in one test; ~90 s on an idle 2-core machine
def test_resume_continues_the_version_the_env_steps_and_the_curve(tmp_path):
    run_dir = tmp_path / "run"
    first = splitrl(
        "up", "--mode", "split-accumulate", "--width", "32", "--activation-codec", "int4", *SMALL,
        "--steps", "1200", "--tls", "plaintext", "--no-tensorboard", "--run-dir", str(run_dir),
    )  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    assert not (run_dir / "tensorboard").exists()
    version_after_first = learner_version(run_dir)
    first_curve = run_dir_files.load_curve(run_dir)
    assert version_after_first >= 1 and first_curve[-1]["env_steps"] == 1200

    second = splitrl("up", "--resume", str(run_dir), "--steps", "2400")
    assert second.returncode == 0, second.stdout + second.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["settings"]["activation_codec"] == "int4" and summary["settings"]["width"] == 32  # kept
    assert summary["settings"]["steps"] == 2400  # overridden
    assert summary["resumed_at"]["env_steps"] == 1200
    assert summary["env_steps"] == 1200  # this segment's
    curve = summary["curve"]
    assert curve[: len(first_curve)] == first_curve, "the curve goes on from where it stopped"
    assert curve[-1]["env_steps"] == 2400
    for key in run_dir_files.CURVE_KEYS:
        if key != "return_sum":
            assert all(a[key] <= b[key] for a, b in itertools.pairwise(curve)), key
    assert curve[-1]["updates"] > first_curve[-1]["updates"]
    assert learner_version(run_dir) > version_after_first
    assert f"at version {version_after_first}" in (run_dir / "logs" / "learner.log").read_text()
    assert "encoder resumed" in (run_dir / "logs" / "edge-encoder.log").read_text()

    done = splitrl("up", "--resume", str(run_dir))
    assert done.returncode == 0 and "already took 2400" in done.stdout

    evaluated = splitrl("eval", str(run_dir), "--episodes", "8")
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    result = run_dir_files.load_evals(run_dir)[-1]
    assert result["env_steps"] == 2400 and result["policy_version"] == learner_version(run_dir)
    assert result["episodes"] == 8 and len(result["returns"]) == 8
    assert all(-1.0 <= r <= 1.0 for r in result["returns"])
    assert result["out_of_time"] == 0, "every Catch episode ends when its ball lands"
    assert result["reward_threshold"] is None and result["at_threshold"] is None
    assert "0 cut by the time limit" in evaluated.stdout


def test_eval_of_an_h264_cloud_run_films_the_agent(tmp_path):
    run_dir = tmp_path / "cloud"
    trained = splitrl(
        "up", "--mode", "cloud", "--codec", "h264", *SMALL, "--steps", "800", "--tls", "plaintext",
        "--run-dir", str(run_dir),
    )  # fmt: skip
    assert trained.returncode == 0, trained.stdout + trained.stderr
    film = tmp_path / "agent.mp4"
    result = splitrl("eval", str(run_dir), "--episodes", "5", "--record", str(film), "--record-episodes", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mean" in result.stdout and "IQM" in result.stdout
    evaluation = run_dir_files.load_evals(run_dir)[-1]
    with av.open(str(film)) as container:
        pictures = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(pictures) >= 2 * 3  # two Catch episodes of several steps each
    assert pictures[0].shape[2] == 3 and pictures[0].std() > 0  # a picture, not a blank
    assert evaluation["episodes"] == 5
    assert (run_dir / "learning.png").stat().st_size > 0


def test_eval_explains_bad_input(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = splitrl("eval", str(empty))
    assert result.returncode == 2 and "not a run directory" in result.stderr
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "settings.json").write_text(json.dumps({"env": "splitrl/Catch-v0"}))
    result = splitrl("eval", str(run_dir), "--record", str(tmp_path / "x.txt"))
    assert result.returncode == 2 and "splitrl eval:" in result.stderr
    resume = splitrl("up", "--resume", str(empty))
    assert resume.returncode == 2 and "not a run directory" in resume.stderr
