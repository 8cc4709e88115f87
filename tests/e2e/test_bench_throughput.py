"""`splitrl bench throughput` as a user runs it, on the fast env at a small size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from splitrl.bench.cpu_budget import machine_description


def test_bench_throughput_measures_baseline_stack_and_link(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    command = [sys.executable, "-m", "splitrl.cli.main", "bench", "throughput", "--env", "splitrl/Catch-v0"]
    command += ["--frame-size", "36", "--width", "256", "--num-envs", "4", "--steps", "2000"]
    command += ["--modes", "split-accumulate", "--link-sizes", "512,8192", "--link-seconds", "0.3", "--out", str(out)]
    command += ["--unroll-length", "16", "--chunks-per-update", "8", "--sb3-reference", "--profile-s", "1"]
    command += ["--reference-torch-threads", "1"]  # sync-ppo's phases are one core's work: the cores' bound
    command += ["--rounds", "2"]  # round 2 runs the stack first, then the references
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    figures = json.loads((out / "throughput.json").read_text())
    assert len(figures["baselines"]) == 2 and figures["baseline_steps_per_s"] > 0
    (stack,) = figures["stacks"]
    assert stack["mode"] == "split-accumulate" and stack["steps_per_s"] > 0 and stack["ratio"] > 0
    assert stack["steps"] <= 2000 and stack["seconds"] > 0
    assert stack["mean_batch_size"] >= 1
    for hop in ("environment-edge", "edge-inference", "inference-compute"):
        assert stack["hops"][hop]["count"] > 0 and stack["hops"][hop]["p99_s"] >= stack["hops"][hop]["p50_s"]
    services = {"environment", "edge-encoder", "inference", "replay", "learner"}
    assert set(stack["cpu_seconds"]) == services | {"splitrl up"}  # the stack's own process counts too
    assert all(seconds > 0 for seconds in stack["cpu_seconds"].values())
    assert set(stack["resident_bytes"]) == services and stack["env_steps_total"] >= stack["steps"]
    # The edge's environment process holds no torch; the edge-encoder runs the encoder network.
    assert stack["resident_bytes"]["environment"] < stack["resident_bytes"]["edge-encoder"]
    assert {(link["transport"], link["message_bytes"]) for link in figures["links"]} == {
        ("tcp", 512),
        ("grpc", 512),
        ("tcp", 8192),
        ("grpc", 8192),
    }
    assert all(link["messages"] > 0 for link in figures["links"])
    # The training references trained from scratch, one update per 16 x 8 agent steps, as the stack did.
    assert set(figures["trained"]) == {"sync-ppo", "sb3-ppo"}
    for name, reference in figures["trained"].items():
        assert reference["steps_per_s"] > 0 and reference["total_steps"] >= 2000, name
        assert 2000 // 128 - 3 <= reference["updates"] <= 2000 // 128, name
    assert stack["updates"] >= 1
    assert figures["settings"]["unroll_length"] == 16 and figures["settings"]["chunks_per_update"] == 8
    table = (out / "throughput.md").read_text()
    assert "| stack split-accumulate |" in table and "gRPC / TCP" in table and "The edge's own costs" in table
    assert "| sync-ppo |" in table and "| sb3-ppo |" in table and "x sb3-ppo" in table
    # --profile-s: py-spy sampled every service process for a second once the warm-up was over.
    assert set(stack["profiles"]) == services
    assert all(0 <= profile["waiting_share"] <= 1 for profile in stack["profiles"].values())
    # py-spy counts running threads only: the services that work on every env step always have samples, while
    # replay can wait through the whole second (a CI run caught it with none).
    assert all(stack["profiles"][name]["samples"] > 0 for name in ("edge-encoder", "inference")), stack["profiles"]
    assert any(profile["top"] for profile in stack["profiles"].values())
    assert "Where the time goes" in table and (out / "runs" / "split-accumulate" / "profile").is_dir()
    assert "| stack split-accumulate |" in result.stdout and "| splitrl up | " in table
    # CPU per agent step after the warm-up: every service read when the warm-up ended, each reference's own
    # process over its rate's window; then what the machine's cores allow.
    assert set(stack["warm_cpu_seconds"]) == set(stack["cpu_seconds"]) and 0 < stack["warm_env_steps"] < 2000
    assert all(0 < stack["warm_cpu_seconds"][name] <= stack["cpu_seconds"][name] for name in stack["cpu_seconds"])
    assert all(reference["cpu_seconds"] > 0 for reference in figures["trained"].values())
    assert figures["cores"] >= 1 and "CPU per agent step after the warm-up" in table
    assert figures["machine"] == machine_description() and f"Machine: {figures['cores']} cores of " in table
    assert f"agent steps/s on these {figures['cores']} cores" in table and "1.5x sb3-ppo (" in table
    # --rounds 2: every training run twice, round 2 in its own run directory and in the other order; the
    # detailed tables are round 1's, and each round's ratios are shown with their median and range.
    assert [(one["number"], one["stacks_first"]) for one in figures["rounds"]] == [(1, False), (2, True)]
    assert figures["stopped"] is None and "Stopped early" not in table
    assert figures["rounds"][0]["stacks"]["split-accumulate"]["steps"] == stack["steps"]
    for one in figures["rounds"]:
        assert set(one["references"]) == {"sync-ppo", "sb3-ppo"} and set(one["stacks"]) == {"split-accumulate"}
        assert all(rate["steps"] > 0 and rate["seconds"] > 0 for rate in one["references"].values())
        # The references update every 128 agent steps: their pace runs over ~12 of the window's updates.
        assert all(rate["paced_updates"] >= 8 and rate["paced_seconds"] > 0 for rate in one["references"].values())
        assert one["stacks"]["split-accumulate"]["updates"] >= 1
    assert (out / "runs" / "round-2" / "split-accumulate" / "summary.json").is_file()
    assert not (out / "runs" / "round-2" / "split-accumulate" / "profile").exists()  # py-spy in round 1 only
    printed = result.stdout
    assert printed.index("round 1: sb3-ppo") < printed.index("round 1: stack") < printed.index("round 2: stack")
    assert printed.index("round 2: stack") < printed.index("round 2: sync-ppo")
    assert "| round | ran first | sync-ppo frames/s | sb3-ppo frames/s |" in table
    assert "| 2 | stacks |" in table and "| median | |" in table and "| range | |" in table


def test_bench_throughput_refuses_bad_settings(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "splitrl.cli.main", "bench", "throughput", "--link-sizes", "8"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "link sizes must be in [64, 16 MiB]" in result.stderr
    # SB3 could not take one update per 32 x 16 agent steps over 3 envs: refused before anything runs.
    command = [sys.executable, "-m", "splitrl.cli.main", "bench", "throughput", "--num-envs", "3", "--sb3-reference"]
    result = subprocess.run([*command, "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "must be a multiple of num_envs (3)" in result.stderr
    assert not (tmp_path / "out").exists()
