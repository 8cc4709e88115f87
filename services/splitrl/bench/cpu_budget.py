"""What the machine's cores allow the stack: CPU time per agent step, against the single-process references.

The five services run side by side, so on C cores the stack makes at most C / (its CPU seconds per agent
step) agent steps per second, and that only with every core busy. Read against a target ratio to SB3's rate
(TARGET_RATIO_TO_SB3), that says how much CPU per agent step the stack may spend and how much of what it spends
must go.

sync-ppo does the same work (the envs, the network, the PPO update) in one process. On one torch thread its
phases' times (env + act + update per agent step) are one core's work, so that work spread over every core is
the rate the stack would reach if splitting it into services cost nothing; without --env-workers the
environment service steps every env on one core, which caps it at one agent step per sync-ppo env time. On
more threads a reference's CPU time is no measure of its work: torch's OpenMP threads spin while they wait
(SB3 on 2 threads keeps ~1.7 cores busy though most of its time is single-threaded env stepping), so the bound
is given for a bench whose references run on one thread (--reference-torch-threads 1).

Rates here are agent steps per second; the stack trains every step once with --train-every-step, so agent
steps per update are equal to within its last update's chunks.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from splitrl.bench.throughput_report import ThroughputReport

#: The target the bench reads its CPU budget against: the stack's rate as a multiple of SB3 PPO's, both training.
TARGET_RATIO_TO_SB3 = 1.5


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity where the system has one), as every run the bench
    starts inherits them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 0


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as the kernel gives it (`cpuinfo`'s first "model name"), else the platform's
    processor string, else "unknown"."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: How a report's machine_line starts.
MACHINE_PREFIX = "Machine: "


def machine_line(cores: int, machine: str) -> str:
    """The report's line saying what it ran on; benchmarks/pooled_rounds.py reads it back (MACHINE_PREFIX)."""
    return f"{MACHINE_PREFIX}{cores} cores of {machine}"


def machine_description() -> str:
    """What a bench ran on, for its report: the CPU model and the instruction set torch's CPU kernels use
    ("AMD EPYC, torch kernels AVX2"). Rates from machines of one kind can differ by tens of percent, so
    benches are pooled per machine (benchmarks/pooled_rounds.py)."""
    import torch  # here: benchmarks/pooled_rounds.py reads MACHINE_PREFIX from this module and needs no torch

    return f"{cpu_model()}, torch kernels {torch.backends.cpu.get_cpu_capability()}"


def cpu_budget_lines(report: ThroughputReport) -> list[str]:
    """The report's section: each training run's CPU per agent step and cores busy, then (with sync-ppo's CPU
    and the cores known) the stack's bound at no cost of its own and, with SB3, the budget the target leaves."""
    runs = [(name, r.steps_per_s, r.cpu_ms_per_step) for name, r in report.trained.items()]
    runs += [(f"stack {r.mode}", r.steps_per_s, r.cpu_ms_per_step) for r in report.stacks]
    if all(cpu is None for _, _, cpu in runs):
        return []
    lines = [
        "",
        "CPU per agent step after the warm-up, every process and thread of the run (cores busy: CPU seconds per "
        "wall second; on more than one torch thread a process's idle OpenMP threads spin, and that counts):",
        "",
        "| run | agent steps/s | CPU ms per agent step | cores busy |",
        "|---|---:|---:|---:|",
    ]
    for label, rate, cpu in runs:
        busy = "-" if cpu is None else f"{cpu * rate / 1e3:.2f}"
        lines.append(f"| {label} | {rate:,.1f} | {'-' if cpu is None else f'{cpu:.2f}'} | {busy} |")
    return lines + _what_the_cores_allow(report)


def _what_the_cores_allow(report: ThroughputReport) -> list[str]:
    if report.cores < 1:
        return []
    return _no_cost_bound(report) + _budget_for_the_target(report)


def _no_cost_bound(report: ThroughputReport) -> list[str]:
    """The stack's rate if its services cost nothing beyond sync-ppo's work, from sync-ppo on one torch thread."""
    sync = report.trained.get("sync-ppo")
    if sync is None or not (sync.env_us_per_step and sync.model_us_per_step and sync.update_us_per_step):
        return []
    if report.settings.get("reference_torch_threads") != 1:
        return ["", "(--reference-torch-threads 1 adds the stack's bound at no CPU cost of its own.)"]
    work_ms = (sync.env_us_per_step + sync.model_us_per_step + sync.update_us_per_step) / 1e3
    bound = report.cores * 1e3 / work_ms
    capped_by_env = ""
    if not report.settings.get("env_workers"):
        env_cap = 1e6 / sync.env_us_per_step
        if env_cap < bound:
            bound = env_cap
            capped_by_env = f", capped by the environment process stepping every env on one core ({env_cap:,.0f})"
    sb3 = report.trained.get("sb3-ppo")
    against = f"{bound / sync.steps_per_s:.2f}x sync-ppo" + (
        "" if sb3 is None else f", {bound / sb3.steps_per_s:.2f}x sb3-ppo"
    )
    return [
        "",
        f"At no CPU cost of its own, the stack would make at most {bound:,.0f} agent steps/s on these "
        f"{report.cores} cores ({against}): sync-ppo's work, {work_ms:.2f} ms per agent step on one thread (env "
        f"+ act + update), on every core{capped_by_env}.",
    ]


def _budget_for_the_target(report: ThroughputReport) -> list[str]:
    """What TARGET_RATIO_TO_SB3 x SB3's rate leaves each stack mode to spend, and what it spends over that."""
    sb3 = report.trained.get("sb3-ppo")
    if sb3 is None or not any(stack.cpu_ms_per_step is not None for stack in report.stacks):
        return []
    target_rate = TARGET_RATIO_TO_SB3 * sb3.steps_per_s
    allowed_ms = report.cores * 1e3 / target_rate
    lines = [
        "",
        f"{TARGET_RATIO_TO_SB3:g}x sb3-ppo ({target_rate:,.0f} agent steps/s) allows {allowed_ms:.2f} CPU ms per "
        "agent step with every core busy:",
        "",
        "| stack | CPU ms per agent step | over the budget |",
        "|---|---:|---:|",
    ]
    for stack in report.stacks:
        cpu = stack.cpu_ms_per_step
        lines.append(f"| {stack.mode} | {'-' if cpu is None else f'{cpu:.2f}'} | {_over(cpu, allowed_ms)} |")
    return lines


def _over(cpu_ms: float | None, allowed_ms: float) -> str:
    """How far `cpu_ms` per agent step is over `allowed_ms`, and that share of it: what would have to go."""
    if cpu_ms is None:
        return "-"
    if cpu_ms <= allowed_ms:
        return "none"
    return f"{cpu_ms - allowed_ms:.2f} ({1 - allowed_ms / cpu_ms:.0%})"
