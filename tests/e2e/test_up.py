"""`splitrl up` exactly as README shows it: separate processes, a summary, and no orphans."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from splitrl.core import scrape
from splitrl.core.metrics import POLICY_LAG, Metrics

pytestmark = pytest.mark.e2e


def splitrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "splitrl.cli.main", *args]


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains `text` (the run directory is unique to each test)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the event files under `log_dir`, read by the tensorboard package itself."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def start_long_run(run_dir: Path, **popen: object) -> subprocess.Popen:
    """`splitrl up` with far more steps than a test waits for, returned once env steps are flowing."""
    up = subprocess.Popen(
        splitrl("up", "--env", "splitrl/Catch-v0", "--steps", "100000000", "--run-dir", str(run_dir)), **popen
    )
    deadline = time.monotonic() + 120
    port_file = run_dir / "environment.ports.json"
    while (
        not port_file.exists()
        or scrape.total([scrape.fetch(json.loads(port_file.read_text())["metrics"])], "splitrl_env_steps_total") == 0
    ):
        assert up.poll() is None, f"splitrl up exited with {up.returncode} before stepping"
        assert time.monotonic() < deadline, "no env steps within 120 s"
        time.sleep(0.1)
    return up


@pytest.mark.parametrize("mode", ["split", "split-accumulate", "cloud"])
def test_up_runs_all_services_and_writes_a_summary(tmp_path, mode):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        splitrl(
            "up",
            "--mode",
            mode,
            "--env",
            "splitrl/Catch-v0",
            "--steps",
            "600",
            "--num-envs",
            "4",
            "--run-dir",
            str(run_dir),
        ),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 600
    assert summary["exit_codes"] == {"replay": 0, "inference": 0, "learner": 0, "edge-encoder": 0, "environment": 0}
    assert summary["episodes"] > 0 and -1.0 <= summary["mean_episode_return"] <= 1.0
    scalars = tensorboard_scalars(run_dir / "tensorboard")
    assert {"charts/episodic_return", "charts/learner_updates", "network/wan_bytes_per_step"} <= set(scalars)
    if mode != "cloud":  # cloud's heavier updates may not finish one in 600 steps on 2 cores
        assert summary["learner_updates"] >= 1
    if summary["learner_updates"]:
        assert {"losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl"} <= set(scalars)
        assert all(value == pytest.approx(0.01) for _, value in scalars["charts/entropy_coef"])  # the defaults
        assert all(value == pytest.approx(2.5e-4) for _, value in scalars["charts/learning_rate"])
    assert max(step for step, _ in scalars["charts/learner_updates"]) <= 600
    assert all(-1.0 <= value <= 1.0 for _, value in scalars["charts/episodic_return"])
    curve = summary["curve"]
    for key in ("env_steps", "episodes", "updates"):  # counters; a return sum may fall
        assert all(a[key] <= b[key] for a, b in itertools.pairwise(curve)), f"curve {key} goes backwards"
    assert curve[-1]["env_steps"] == 600 and curve[-1]["episodes"] == summary["episodes"]
    # When the learner completed its latest update, on its clock: set with the first, never going back. (Not
    # compared point by point with `updates`: a scrape reads the count and the time one after the other.)
    assert all(a["last_update_at"] <= b["last_update_at"] for a, b in itertools.pairwise(curve))
    assert (curve[-1]["last_update_at"] > 0) == (summary["learner_updates"] > 0)
    per_step = summary["wan_bytes_per_env_step"]["rollout"]
    payload = 9216 if mode == "cloud" else 8192  # one uint8 frame vs bf16 activations
    assert payload < per_step < payload + 64, per_step
    uplink = summary["links"]["encoder-inference"]["rollout"]
    for ends in uplink.values():
        assert ends["sent"] == ends["received"]
    processes = summary["processes"]  # each service's CPU and memory, from its final /metrics
    assert set(processes) == set(summary["exit_codes"])
    for name, cost in processes.items():
        assert cost["cpu_ms_per_env_step"] > 0 and 0 < cost["resident_mib"] <= cost["peak_resident_mib"], name
    assert processes["environment"]["peak_resident_mib"] < processes["edge-encoder"]["peak_resident_mib"]  # no torch
    supervisor = summary["supervisor"]  # splitrl up's own CPU and memory: it scrapes every service
    assert supervisor["cpu_ms_per_env_step"] > 0 and 0 < supervisor["resident_mib"] <= supervisor["peak_resident_mib"]
    assert "summary written to" in result.stdout
    assert (run_dir / "learning.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert not processes_mentioning(str(run_dir))
    # No --tls flag: every service served (and dialled) over mutual TLS with this run's own CA.
    assert (run_dir / "tls" / "ca.pem").is_file()
    for name in summary["exit_codes"]:
        assert " (mtls), metrics on" in (run_dir / "logs" / f"{name}.log").read_text(), name
        assert "updated but not exported" not in (run_dir / "logs" / f"{name}.log").read_text(), name
        # Each service's final /metrics: its own families and the shared ones (metrics.SERVICE_FAMILIES), as a
        # registry of that service alone holds them, and no NAME_created series.
        families = list(text_string_to_metric_families((run_dir / "metrics" / f"{name}.prom").read_text()))
        own = CollectorRegistry()
        Metrics(own, name)
        expected = {family.name for family in text_string_to_metric_families(generate_latest(own).decode())}
        assert {family.name for family in families} == {f for f in expected if not f.endswith("_created")}, name
        assert not [sample.name for family in families for sample in family.samples if "_created" in sample.name]


def output_once_stopped(up: subprocess.Popen, run_dir: Path, timeout_s: float) -> str:
    """up's output once it exits; if it is still running after `timeout_s`, the test fails with what every
    process of the run was doing (their stacks, dumped on SIGUSR1) and the end of each service's log."""
    try:
        return up.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        for pid in processes_mentioning(str(run_dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(2)
        up.kill()
        output = up.communicate()[0]
        logs = "".join(f"\n== {log.name}\n{log.read_text()[-6000:]}" for log in (run_dir / "logs").glob("*.log"))
        pytest.fail(f"splitrl up still running {timeout_s:.0f} s after the signal; its output:\n{output}{logs}")


def test_ctrl_c_stops_every_service(tmp_path):
    run_dir = tmp_path / "run"
    up = start_long_run(run_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert len(processes_mentioning(str(run_dir))) >= 6  # up itself + five services
        up.send_signal(signal.SIGINT)
        output = output_once_stopped(up, run_dir, timeout_s=90)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 130, output
    assert "interrupted" in output
    assert not processes_mentioning(str(run_dir)), "orphaned service processes"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["env_steps"] > 0


def test_killing_up_takes_its_services_down(tmp_path):
    """Even SIGKILL, which up cannot catch, leaves no services behind (PR_SET_PDEATHSIG)."""
    run_dir = tmp_path / "run"
    up = start_long_run(run_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.kill(up.pid, signal.SIGKILL)
    up.wait()
    deadline = time.monotonic() + 30
    while processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_mentioning(str(run_dir)), "services outlived a killed splitrl up"


def test_bad_flag_fails_fast_with_the_value(tmp_path):
    result = subprocess.run(
        splitrl("up", "--num-envs", "0", "--run-dir", str(tmp_path)), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--num-envs" in result.stderr and "'0'" in result.stderr


def test_a_new_run_into_a_run_dir_with_checkpoints_is_refused_and_points_to_resume(tmp_path):
    """Without --resume the learner and the edge would pick the old weights up under a fresh curve (or fail on
    another network's shapes, as a Catch bench after a CarRacing one in the same --out did)."""
    learner_checkpoint = tmp_path / "run" / "checkpoints" / "learner.pt"
    learner_checkpoint.parent.mkdir(parents=True)
    learner_checkpoint.write_bytes(b"earlier weights")
    result = subprocess.run(
        splitrl("up", "--steps", "10", "--run-dir", str(tmp_path / "run")), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert f"splitrl up --resume {tmp_path / 'run'}" in result.stderr
    assert learner_checkpoint.read_bytes() == b"earlier weights"
    assert not (tmp_path / "run" / "logs").exists()  # refused before anything started


def test_a_service_that_cannot_start_is_reported_and_nothing_is_left(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        splitrl("up", "--env", "CartPole-v1", "--steps", "10", "--run-dir", str(run_dir)),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 1
    assert "exited with code 1 while starting" in result.stderr
    assert "splitrl needs uint8 images" in result.stderr  # the log's last lines say why
    assert "summary" not in result.stdout  # no result shown after a failure; summary.json says why the run ended
    end = json.loads((run_dir / "summary.json").read_text())["end"]
    assert end["reason"] == "start failed" and "splitrl needs uint8 images" in end["message"]
    assert not processes_mentioning(str(run_dir))


def test_an_env_whose_package_is_missing_is_named_before_anything_starts(tmp_path):
    result = subprocess.run(
        splitrl("up", "--env", "MiniGrid/Empty-5x5-v0", "--run-dir", str(tmp_path / "run")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "pip install minigrid" in result.stderr


def test_a_mistyped_env_is_refused_in_seconds_with_gymnasiums_message_and_a_close_id(tmp_path):
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = subprocess.run(
        splitrl("up", "--env", "CarRacng-v3", "--run-dir", str(run_dir)), capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - started < 20
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()  # one readable line, no traceback
    assert "Environment `CarRacng` doesn't exist. Did you mean: `CarRacing`?" in line  # gymnasium's own words
    assert "closest registered id is 'CarRacing-v3'" in line
    assert not run_dir.exists()  # refused before anything started


def test_an_atari_game_runs_through_the_whole_stack_by_its_usual_id(tmp_path):
    run_dir = tmp_path / "run"
    command = splitrl(
        "up", "--env", "ALE/Pong-v5", "--mode", "split-accumulate", "--width", "64", "--frame-size", "84",
        "--steps", "400", "--chunks-per-update", "4", "--tls", "plaintext", "--run-dir", str(run_dir),
    )  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 400 and summary["learner_updates"] >= 1


def test_training_every_step_makes_the_envs_wait_for_a_slow_learner_instead_of_evicting(tmp_path):
    """--train-every-step: with a learner far slower than the envs (32 epochs per update), replay holds inserts
    back (acting waits on them) and evicts no chunk that no update has taken."""
    run_dir = tmp_path / "run"
    args = ("--env", "splitrl/Catch-v0", "--frame-size", "36", "--width", "256", "--epochs", "32", "--steps", "4096")
    result = subprocess.run(
        splitrl("up", *args, "--train-every-step", "--no-tensorboard", "--tls", "plaintext", "--run-dir", str(run_dir)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    replay_metrics = [(run_dir / "metrics" / "replay.prom").read_text()]
    assert scrape.total(replay_metrics, "splitrl_replay_evictions_total") == 0
    assert scrape.total(replay_metrics, "splitrl_replay_rate_limiter_blocked_total") > 0  # the learner was behind
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 4096
    learner_metrics = [(run_dir / "metrics" / "learner.prom").read_text()]
    lag = scrape.total(learner_metrics, POLICY_LAG + "_sum") / scrape.total(learner_metrics, POLICY_LAG + "_count")
    print(f"mean policy lag {lag:.2f}")
    assert lag <= 2.0  # chunks wait at most about one update in replay: the learner trains on recent ones
