"""`splitrl pretrain-encoder`, then `splitrl up --encoder-init`, as a user runs them (Catch, seconds).

Whether a pretrained, frozen encoder learns is a CarRacing benchmark (docs/results/learning.md):
on Catch the autoencoder's pixel loss barely sees the 3 x 3 ball, and split-accumulate on it does not learn
(docs/how-to/carracing.md), so what CI checks here is the plumbing: the file, the edge starting from it and keeping it,
the refusals.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from splitrl.core import checkpoint
from splitrl.core.spec import ModelConfig
from splitrl.edge_encoder.pretrained import load_pretrained

pytestmark = pytest.mark.e2e

CATCH = ["--env", "splitrl/Catch-v0", "--frame-size", "36", "--width", "32", "--bottleneck", "layernorm"]


def splitrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "splitrl.cli.main", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    path = tmp_path_factory.mktemp("pretrained") / "encoder.pt"
    result = splitrl("pretrain-encoder", *CATCH, "--random-steps", "300", "--pretrain-steps", "20", "--out", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote {path}: 20 Adam steps in" in result.stdout and "on 301 frame stacks" in result.stdout
    assert "pretraining step 20/20" in result.stderr  # progress is logged
    return path


@pytest.mark.timeout(600)
def test_a_run_starts_from_the_pretrained_encoder_keeps_it_frozen_and_needs_the_file_no_more(tmp_path, pretrained):
    init = tmp_path / "encoder.pt"
    init.write_bytes(pretrained.read_bytes())
    run_dir = tmp_path / "run"
    flags = ["--mode", "split-accumulate", "--encoder-fraction", "0", "--encoder-init", str(init)]
    result = splitrl("up", *CATCH, *flags, "--steps", "1024", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads((run_dir / "settings.json").read_text())["encoder_init"] == str(init)
    assert f"encoder starts from {init}" in (run_dir / "logs" / "edge-encoder.log").read_text()
    edge = checkpoint.load(run_dir / "checkpoints" / "edge-encoder" / "encoder.pt")
    assert edge is not None and edge["version"] == 0  # --encoder-fraction 0: it never stepped
    weights = load_pretrained(init, ModelConfig(4, 36, 32, "layernorm"), "splitrl/Catch-v0")
    assert all(torch.equal(edge["encoder"][name], value) for name, value in weights.items())
    init.unlink()  # evaluation and resume read the run's own checkpoint
    played = splitrl("eval", str(run_dir), "--episodes", "3")
    assert played.returncode == 0, played.stderr[-3000:]
    assert "3 unseen episodes" in played.stdout
    resumed = splitrl("up", "--resume", str(run_dir), "--steps", "1536")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "encoder resumed from" in (run_dir / "logs" / "edge-encoder.log").read_text()
    edge = checkpoint.load(run_dir / "checkpoints" / "edge-encoder" / "encoder.pt")
    assert edge is not None and all(torch.equal(edge["encoder"][name], value) for name, value in weights.items())


def test_a_run_refuses_an_encoder_file_it_cannot_use(tmp_path, pretrained):
    missing_run = ["--steps", "64", "--run-dir", str(tmp_path / "missing")]
    missing = splitrl("up", *CATCH, "--mode", "split", "--encoder-init", str(tmp_path / "nope.pt"), *missing_run)
    assert missing.returncode != 0
    assert f"no pretrained encoder at {tmp_path / 'nope.pt'}" in missing.stdout + missing.stderr
    cloud = splitrl("up", *CATCH, "--mode", "cloud", "--encoder-init", str(pretrained), "--steps", "64")
    assert cloud.returncode != 0
    assert "mode='cloud' has none on the edge" in cloud.stdout + cloud.stderr
    run_dir = tmp_path / "wider"
    wider = [*CATCH[:-4], "--width", "64", "--bottleneck", "layernorm"]
    flags = ["--mode", "split-accumulate", "--encoder-init", str(pretrained), "--steps", "64"]
    mismatch = splitrl("up", *wider, *flags, "--run-dir", str(run_dir))
    assert mismatch.returncode != 0
    assert "but this run's is {'frame_stack': 4, 'frame_size': 36, 'width': 64" in mismatch.stdout + mismatch.stderr


def test_pretraining_refuses_weights_that_do_not_fit_the_action_space(tmp_path):
    result = splitrl("pretrain-encoder", *CATCH, "--random-action-weights", "1,2", "--out", str(tmp_path / "e.pt"))
    assert result.returncode == 2
    assert "random action weights must be 3 non-negative numbers" in result.stderr
    assert not (tmp_path / "e.pt").exists()
