"""`splitrl bench throughput`: what the five-service split costs in env steps/s, measured side by side.

One run, on one machine, in this order (the baseline twice, so drift over the run shows):

1. baseline: the same envs and the same model (encoder + head) stepped in one Python loop with batched
   inference, no gRPC, no training (`baseline.py`);
2. the training references, each training from scratch with the stack's hyperparameters: `sync-ppo`, the
   same PPO in one process, rollout then update (`baseline.py`), and, with --sb3-reference,
   Stable-Baselines3 PPO (`sb3_reference.py`);
3. the five-service stack on loopback (`splitrl up`), once per mode, learner training as it does; with
   --profile-s N, every service sampled by py-spy for N seconds once the warm-up is over (`profile.py`);
4. the baseline again;
5. the link microbenchmark (`link.py`).

Every run is described by one RunSettings built from the bench's flags (`run_settings`), so all of them
play the same env with the same action repeat and do one update per unroll_length x chunks_per_update
agent steps.

A rate leaves out each measurement's first `warmup_fraction` of env steps (start-up, first resets). The
stack's hop latencies, batch sizes, policy lag and per-service CPU come from the services' own final
/metrics. Results go to OUT/throughput.md and OUT/throughput.json (`throughput_report.py`) and are printed.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch

from splitrl.bench.baseline import BaselineResult, run_baseline, run_sync_ppo, steady_span, update_pace
from splitrl.bench.cpu_budget import machine_description, usable_cores
from splitrl.bench.link import measure
from splitrl.bench.profile import ServiceProfile, py_spy, record
from splitrl.bench.rounds import TrainingRound, round_order, stacks_run_first
from splitrl.bench.settings import ThroughputBenchSettings
from splitrl.bench.throughput_report import (
    HOPS,
    SERVICES,
    Hop,
    StackResult,
    ThroughputReport,
    as_json,
    render_markdown,
)
from splitrl.core import scrape
from splitrl.core.args import settings_argv
from splitrl.core.config import Mode
from splitrl.core.metrics import (
    ENV_STEPS,
    HOP_LATENCY,
    INFERENCE_BATCH_SIZE,
    POLICY_LAG,
)
from splitrl.core.usage import process_usage
from splitrl.run.plan import port_files, shared_values
from splitrl.run.settings import RunSettings
from splitrl.run.summary import SUPERVISOR, shutdown_texts_by_service


def run_settings(settings: ThroughputBenchSettings, mode: Mode, run_dir: Path | None = None) -> RunSettings:
    """The one description of every run the bench times: its shared groups (env, action repeat, chunks, PPO,
    seed) from the bench's flags; `mode` and the codecs for the stack."""
    return RunSettings(
        **shared_values(settings, RunSettings),
        mode=mode,
        codec=settings.codec,
        activation_codec=settings.activation_codec,
        gradient_codec=settings.activation_codec,
        steps=settings.steps,
        train_every_step=settings.train_every_step,
        torch_threads=settings.torch_threads,
        learner_nice=settings.learner_nice,
        run_dir=run_dir,
    )


def run_stack(settings: ThroughputBenchSettings, mode: Mode, run_dir: Path) -> StackResult:
    """One `splitrl up` in `mode` (a child process, as a user runs it), read back from its run directory, with
    every service's CPU time when the warm-up ended; with --profile-s, its services' sampling profiles too."""
    run = run_settings(settings, mode, run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier bench's run of this mode: each measures a fresh run
    command = [sys.executable, "-m", "splitrl.cli.main", "up", *settings_argv(run)]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL) as up:
        warm = _at_warm_up(settings, run_dir, up)
        returncode = up.wait()
    if returncode != 0:
        raise RuntimeError(f"splitrl up --mode {mode} failed (exit {returncode}); see {run_dir / 'logs'}")
    stack = read_stack(mode, run_dir, settings.warmup_fraction)
    if warm is None:  # the run ended before its warm-up did
        return stack
    return replace(stack, warm_env_steps=warm.env_steps, warm_cpu_seconds=warm.cpu_seconds, profiles=warm.profiles)


@dataclass(frozen=True)
class _WarmUp:
    """A stack run when the environment had taken the warm-up share of its env steps: that count, each service's
    CPU seconds then (its workers' included), and the py-spy profiles taken from there (--profile-s)."""

    env_steps: int
    cpu_seconds: dict[str, float]
    profiles: dict[str, ServiceProfile]


def _at_warm_up(settings: ThroughputBenchSettings, run_dir: Path, up: subprocess.Popen[bytes]) -> _WarmUp | None:
    """Once the environment has taken the warm-up share of the run's env steps: every service's CPU seconds
    (from its /metrics, as their port files name them) and `splitrl up`'s own (from /proc), and, with
    --profile-s, every service process sampled for that many seconds; None if the run ends first."""
    warm_steps = settings.warmup_fraction * settings.steps
    while up.poll() is None:
        ports = port_files(run_dir)
        if "environment" in ports and len(ports) >= len(SERVICES):
            serving = {name: json.loads(path.read_text()) for name, path in ports.items()}
            try:
                texts = {"environment": scrape.fetch(serving["environment"]["metrics"])}
                steps = scrape.total([texts["environment"]], f"{ENV_STEPS}_total")
                if steps >= warm_steps:  # the others read right after: the environment's CPU is from this reading
                    texts |= {name: scrape.fetch(p["metrics"]) for name, p in serving.items() if name not in texts}
            except OSError:  # between the port file and the first scrape, or a service is done: read again
                steps = -math.inf
            if steps >= warm_steps:
                cpu = {name: scrape.process_cost(text).cpu_seconds for name, text in texts.items()}
                if (supervisor := process_usage(up.pid)) is not None:
                    cpu[SUPERVISOR] = supervisor.cpu_seconds
                pids = {name: int(ports_of["pid"]) for name, ports_of in serving.items()}
                profiles = record(pids, settings.profile_s, run_dir / "profile") if settings.profile_s else {}
                return _WarmUp(int(steps), cpu, profiles)
        time.sleep(0.5)
    return None


def read_stack(mode: str, run_dir: Path, warmup_fraction: float) -> StackResult:
    """A StackResult from a finished run directory: summary.json's live curve and the final /metrics."""
    summary = json.loads((run_dir / "summary.json").read_text())
    live = [
        (p["env_steps"], p["seconds"], p["updates"], p["last_update_at"])
        for p in summary["curve"][:-1]
        if "seconds" in p
    ]
    try:
        first, last = steady_span(live, warmup_fraction)
    except ValueError as error:  # the curve takes a point every progress_interval_s: a shorter run has no rate
        raise RuntimeError(f"stack {mode} ran too briefly to time ({error}): raise --steps") from error
    paced_updates, paced_seconds = update_pace(live, first, last, completed_at=3)  # by the learner's clock
    texts = shutdown_texts_by_service(run_dir)
    costs = {name: scrape.process_cost(text) for name, text in texts.items()}
    every = list(texts.values())
    hops = {}
    for hop in HOPS:
        buckets, total, count = scrape.histogram(every, HOP_LATENCY, hop=hop)
        if count:
            hops[hop] = Hop(int(count), total / count, scrape.quantile(buckets, 0.5), scrape.quantile(buckets, 0.99))
    _, batch_sum, batch_count = scrape.histogram(every, INFERENCE_BATCH_SIZE)
    lag_buckets, lag_sum, lag_count = scrape.histogram(every, POLICY_LAG)
    return StackResult(
        mode=mode,
        steps=int(last[0] - first[0]),
        seconds=last[1] - first[1],
        wall_seconds=float(summary["wall_seconds"]),
        hops=hops,
        mean_batch_size=batch_sum / batch_count if batch_count else None,
        policy_lag_mean=lag_sum / lag_count if lag_count else None,
        policy_lag_max_at_most=scrape.upper_bound(lag_buckets),
        learner_updates=int(summary["learner_updates"]),
        cpu_seconds={name: cost.cpu_seconds for name, cost in costs.items()} | _supervisor_cpu(summary),
        run_dir=str(run_dir),
        resident_bytes={name: cost.resident_bytes for name, cost in costs.items()},
        peak_resident_bytes={
            name: cost.peak_resident_bytes for name, cost in costs.items() if not math.isnan(cost.peak_resident_bytes)
        },
        env_steps_total=int(summary["env_steps"]),
        updates=int(last[2] - first[2]),
        paced_updates=paced_updates,
        paced_seconds=paced_seconds,
    )


def _supervisor_cpu(summary: dict[str, Any]) -> dict[str, float]:
    """{SUPERVISOR: its CPU seconds} from a run's summary.json; empty where it was not measured."""
    cpu_seconds = summary.get("supervisor", {}).get("cpu_seconds")
    return {} if cpu_seconds is None else {SUPERVISOR: float(cpu_seconds)}


def run_throughput_bench(settings: ThroughputBenchSettings) -> int:
    """Run every measurement, print the tables, write OUT/throughput.{md,json}; returns an exit code."""
    try:
        run = run_settings(settings, "cloud")  # a value splitrl up refuses fails here, before anything runs
        if settings.sb3_reference:
            from splitrl.bench.sb3_reference import require_sb3, rollout_steps

            require_sb3()
            rollout_steps(run)
        if settings.profile_s and py_spy() is None:
            raise ValueError("--profile-s needs py-spy: pip install py-spy (it is in the dev extra)")
    except ValueError as error:
        print(f"splitrl bench throughput: {error}", file=sys.stderr)
        return 2
    if settings.reference_torch_threads is None:  # torch's own default, read before any run sets the process's
        settings = settings.model_copy(update={"reference_torch_threads": torch.get_num_threads()})
    settings.out.mkdir(parents=True, exist_ok=True)
    report = ThroughputReport(
        settings=json.loads(settings.model_dump_json()), cores=usable_cores(), machine=machine_description()
    )
    print(f"throughput bench: {settings.env}, {settings.num_envs} envs, {settings.steps:,} env steps per run")
    try:
        _measure_all(settings, run, report)
    except (KeyboardInterrupt, RuntimeError) as error:
        interrupted = isinstance(error, KeyboardInterrupt)
        print("\ninterrupted" if interrupted else f"splitrl bench throughput: {error}", file=sys.stderr)
        if report.rounds:  # a whole round or more is in: a long --rounds bench keeps what it measured
            report.stopped = f"round {len(report.rounds) + 1}: " + ("interrupted" if interrupted else str(error))
            _write(settings.out, report)
        return 130 if interrupted else 1
    _write(settings.out, report)
    return 0


def _write(out: Path, report: ThroughputReport) -> None:
    """Print the report's tables and write them to OUT/throughput.md, its figures to OUT/throughput.json."""
    markdown = render_markdown(report)
    (out / "throughput.md").write_text(markdown)
    (out / "throughput.json").write_text(json.dumps(as_json(report), indent=2))
    print(markdown)
    print(f"wrote {out / 'throughput.md'} and {out / 'throughput.json'}")


def _measure_all(settings: ThroughputBenchSettings, run: RunSettings, report: ThroughputReport) -> None:
    """Every measurement in order; the single-process ones play `run` (the bench's run in cloud form)."""

    def baseline(label: str) -> None:
        result = run_baseline(run, settings.warmup_fraction)
        report.baselines.append(result)
        print(f"baseline ({label}): {result.steps_per_s:,.1f} env steps/s")

    # One process each, so they may use every core: SB3 on torch's default threads is how its users train.
    references_run = run.model_copy(update={"torch_threads": settings.reference_torch_threads})
    baseline("before")
    for number in range(1, settings.rounds + 1):
        _training_round(settings, references_run, number, report)
    baseline("after")
    if not settings.skip_link:
        for size in settings.link_sizes:
            for transport in ("tcp", "grpc", *(("grpc-wan",) if settings.link_wan else ())):
                link = measure(transport, size, settings.link_seconds)
                report.links.append(link)
                print(f"link {transport} {size:,} B: {link.messages_per_s:,.0f} msg/s")


def _training_round(
    settings: ThroughputBenchSettings, references_run: RunSettings, number: int, report: ThroughputReport
) -> None:
    """Round `number` of the training comparison: every reference that trains, in `references_run`, and every
    stack mode, once, in the round's order (rounds.round_order). Round 1's results fill the report's detailed
    tables, and only its stacks are profiled (--profile-s: py-spy slows what it samples); each round's rates go
    to the round-by-round table. Later rounds' stacks run in OUT/runs/round-N/."""
    label = f"round {number}: " if settings.rounds > 1 else ""
    measures: dict[str, Callable[[RunSettings, float], BaselineResult]] = {}
    if settings.sync_ppo:
        measures["sync-ppo"] = run_sync_ppo
    if settings.sb3_reference:
        from splitrl.bench.sb3_reference import measure_sb3

        measures["sb3-ppo"] = measure_sb3
    stack_settings = settings if number == 1 else settings.model_copy(update={"profile_s": 0.0})
    runs = settings.out / "runs" / ("" if number == 1 else f"round-{number}")
    references: dict[str, BaselineResult] = {}
    stacks: dict[str, StackResult] = {}
    for kind, name in round_order(number, list(measures), list(settings.modes)):
        if kind == "reference":
            references[name] = result = measures[name](references_run, settings.warmup_fraction)
            print(f"{label}{name}: {result.steps_per_s:,.1f} env steps/s, {result.updates} updates")
        else:
            stacks[name] = stack = run_stack(stack_settings, cast(Mode, name), runs / name)
            print(f"{label}stack {name}: {stack.steps_per_s:,.1f} env steps/s")
    if number == 1:
        report.trained, report.stacks = references, list(stacks.values())
    report.rounds.append(TrainingRound.of(number, stacks_run_first(number), references, stacks))
