"""What `splitrl bench throughput` measured, and how it is shown: the result types, throughput.json and the
markdown tables (rates and ratios, training end to end, hop latency, CPU per service, the edge's own costs,
the link microbenchmark). `throughput.py` takes the measurements."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from splitrl.bench.baseline import BaselineResult
from splitrl.bench.cpu_budget import cpu_budget_lines, machine_line
from splitrl.bench.link import LinkResult
from splitrl.bench.profile import ServiceProfile
from splitrl.bench.rounds import RunRate, TrainingRound, ratio, round_lines
from splitrl.run.registry import EDGE_SERVICES
from splitrl.run.summary import SUPERVISOR  # the process that runs the stack, counted beside the services

#: Hops in the order a vector step meets them (splitrl_hop_latency_seconds labels).
HOPS = (
    "environment-step",
    "environment-edge",
    "edge-encode",
    "edge-inference",
    "inference-queue",
    "inference-compute",
    "inference-replay",
)
SERVICES = (*EDGE_SERVICES, "inference", "replay", "learner")  # the tables' order: edge first


@dataclass(frozen=True)
class Hop:
    """Latency of one hop over a run, in seconds (p50 / p99 interpolated from histogram buckets)."""

    count: int
    mean_s: float
    p50_s: float | None
    p99_s: float | None


@dataclass(frozen=True)
class StackResult:
    """One `splitrl up` run of the stack in `mode`; `steps` / `seconds` is the rate's window."""

    mode: str
    steps: int
    seconds: float
    wall_seconds: float
    hops: dict[str, Hop]
    mean_batch_size: float | None
    policy_lag_mean: float | None
    policy_lag_max_at_most: float | None
    learner_updates: int
    #: CPU seconds of each service's processes and threads, and of SUPERVISOR's, over the whole run.
    cpu_seconds: dict[str, float]
    run_dir: str
    #: Each service's resident memory (bytes) when the run ended, its worker processes included (as is
    #: cpu_seconds), and the run's env steps (all of them).
    resident_bytes: dict[str, float] = field(default_factory=dict)
    env_steps_total: int = 0
    #: Each service's peak resident memory (bytes): its process's plus its workers' (an upper bound), where the
    #: system says.
    peak_resident_bytes: dict[str, float] = field(default_factory=dict)
    #: Learner updates inside the rate's window.
    updates: int = 0
    #: The learner's own pace (baseline.update_pace): updates from the first to the last completed in the window,
    #: and the seconds between those two (0: fewer than 2 completed).
    paced_updates: int = 0
    paced_seconds: float = 0.0
    #: py-spy's samples of each service process, by name (--profile-s; empty without it).
    profiles: dict[str, ServiceProfile] = field(default_factory=dict)
    #: When the warm-up ended (the environment past the warm-up share of the run's env steps): its env steps,
    #: and each service's CPU seconds then, its workers' included, and SUPERVISOR's (empty: the run ended first).
    warm_env_steps: int = 0
    warm_cpu_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def cpu_ms_per_step(self) -> float | None:
        """CPU milliseconds per agent step after the warm-up, every service's processes and threads and
        SUPERVISOR together; None without a warm-up reading of every one of them."""
        steps = self.env_steps_total - self.warm_env_steps
        if steps <= 0 or not self.warm_cpu_seconds or set(self.warm_cpu_seconds) != set(self.cpu_seconds):
            return None
        spent = sum(self.cpu_seconds[name] - self.warm_cpu_seconds[name] for name in self.cpu_seconds)
        return 1e3 * spent / steps


@dataclass
class ThroughputReport:
    settings: dict[str, Any]
    baselines: list[BaselineResult] = field(default_factory=list)
    stacks: list[StackResult] = field(default_factory=list)
    links: list[LinkResult] = field(default_factory=list)
    #: The single-process training references by name (sync-ppo, sb3-ppo).
    trained: dict[str, BaselineResult] = field(default_factory=dict)
    #: CPU cores the bench's processes could run on (0: not recorded).
    cores: int = 0
    #: The CPU they are (cpu_budget.machine_description; "": not recorded).
    machine: str = ""
    #: Every round of the training comparison's rates (--rounds), the first being `trained` and `stacks`'.
    rounds: list[TrainingRound] = field(default_factory=list)
    #: Where and why a bench stopped before its end (None: it ran every measurement); its report holds the rounds
    #: completed before.
    stopped: str | None = None

    @property
    def baseline_steps_per_s(self) -> float:
        """Mean of the baseline measurements (before and after the stack runs)."""
        return sum(b.steps_per_s for b in self.baselines) / len(self.baselines)


def as_json(report: ThroughputReport) -> dict[str, Any]:
    return {
        "settings": report.settings,
        "baseline_steps_per_s": report.baseline_steps_per_s,
        "baselines": [asdict(b) | {"steps_per_s": b.steps_per_s} for b in report.baselines],
        "stacks": [
            asdict(s) | {"steps_per_s": s.steps_per_s, "ratio": s.steps_per_s / report.baseline_steps_per_s}
            for s in report.stacks
        ],
        "links": [link.as_dict() for link in report.links],
        "trained": {name: asdict(r) | {"steps_per_s": r.steps_per_s} for name, r in report.trained.items()},
        "cores": report.cores,
        "machine": report.machine,
        "rounds": [_round_json(one) for one in report.rounds],
        "stopped": report.stopped,
    }


def _round_json(one: TrainingRound) -> dict[str, Any]:
    """A round's rates as measured, each with its agent steps/s and updates/s (None: no pace) beside them."""
    figures = asdict(one)
    for side in ("references", "stacks"):
        for name, rate in getattr(one, side).items():
            figures[side][name] |= {"steps_per_s": rate.steps_per_s, "updates_per_s": rate.updates_per_s}
    return figures


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render_markdown(report: ThroughputReport) -> str:
    """The tables: rates and ratios, hop latencies, CPU per service, link microbenchmark."""
    s = report.settings
    base = report.baseline_steps_per_s
    lines = [
        f"### Throughput: {s['env']}, {s['num_envs']} envs, {s['steps']:,} env steps per run, "
        f"torch threads {s['torch_threads']} per process"
        + (f" ({s['reference_torch_threads']} in {' and '.join(report.trained)})" if _reference_threads(report) else "")
        + "".join(f", {who} in bfloat16" for who in _in_bfloat16(s)),
        "",
        "| run | env steps/s | x baseline | overhead us/env step | mean batch | policy lag mean / max<= | updates |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for b, label in zip(report.baselines, ("before", "after", *map(str, range(2, 99))), strict=False):
        lines.append(f"| baseline ({label}) | {b.steps_per_s:,.1f} | {b.steps_per_s / base:.2f} | - | "
                     f"{s['num_envs']} | - | - |")  # fmt: skip
    for r in report.stacks:
        overhead_us = (1 / r.steps_per_s - 1 / base) * 1e6
        lag = f"{_number(r.policy_lag_mean, 2)} / {_number(r.policy_lag_max_at_most, 0)}"
        lines.append(
            f"| stack {r.mode} | {r.steps_per_s:,.1f} | **{r.steps_per_s / base:.2f}** | {overhead_us:,.0f} | "
            f"{_number(r.mean_batch_size)} | {lag} | {r.learner_updates} |"
        )
    if report.machine:
        lines[1:1] = ["", machine_line(report.cores, report.machine)]
    if report.stopped is not None:
        lines[1:1] = ["", f"**Stopped early, in {report.stopped}**: the tables hold the rounds completed before it."]
    lines += (
        _training_table(report)
        + round_lines(report.rounds, s.get("action_repeat", 1))
        + cpu_budget_lines(report)
        + _baseline_profile(report)
        + _hop_table(report)
        + _cpu_table(report)
        + _edge_table(report)
        + _profile_table(report)
    )
    lines += _link_table(report)
    return "\n".join(lines) + "\n"


def _reference_threads(report: ThroughputReport) -> bool:
    """Whether the single-process references that ran trained on their own thread count (reports before
    --reference-torch-threads ran them on --torch-threads)."""
    return bool(report.trained) and report.settings.get("reference_torch_threads") is not None


def _training_table(report: ThroughputReport) -> list[str]:
    """Every run that trains, as a user compares whole training runs: env frames/s with training, against each
    single-process reference, updates/s, and the wall time of the whole run, set-up included."""
    s = report.settings
    if not report.trained:
        return []
    repeat = s.get("action_repeat", 1)
    #: (label, its rate window, wall seconds of the whole run, its agent steps)
    rows = [(name, RunRate.of(r), r.wall_seconds, r.total_steps) for name, r in report.trained.items()]
    rows += [(f"stack {r.mode}", RunRate.of(r), r.wall_seconds, r.env_steps_total) for r in report.stacks]
    references = list(report.trained)
    where_envs_step = (
        "in worker processes in the stack (--env-workers) and in SB3 (SubprocVecEnv); act-only and sync-ppo step "
        "them in their own process"
        if s.get("env_workers")
        else "in one process in every run"
    )
    lines = [
        "",
        f"Training end to end: env frames/s while training (frames = agent steps x action repeat {repeat}), "
        f"one PPO update per {s['unroll_length'] * s['chunks_per_update']:,} agent steps "
        f"({s['chunks_per_update']} chunks of {s['unroll_length']}), {s['epochs']} epochs of "
        f"{s['minibatches']} minibatches. Envs step {where_envs_step}. Updates/s runs from the first to the "
        "last update completed after the warm-up (the learner's own pace; - where fewer than 2 completed); agent "
        "steps per update counts the updates against the window's steps."
        + (" The stack trains every step once (--train-every-step)." if s.get("train_every_step") else "")
        + (
            " The learner (the stack's and sync-ppo's) trains in bfloat16 (--train-precision); SB3 in float32."
            if s.get("train_precision") == "bfloat16"
            else ""
        ),
        "",
        "| run | env frames/s | "
        + " | ".join(f"x {name}" for name in references)
        + " | updates/s | agent steps per update | wall s, set-up included |",
        "|---|---:|" + "---:|" * len(references) + "---:|---:|---:|",
    ]
    for label, rate, wall, total in rows:
        ratios = [f"{ratio(rate, RunRate.of(report.trained[name]))[0]:.2f}" for name in references]
        per_update = _number(rate.steps / rate.updates, 0) if rate.updates else "-"
        lines.append(
            f"| {label} | {rate.steps_per_s * repeat:,.1f} | "
            + " | ".join(ratios)
            + f" | {_number(rate.updates_per_s, 3)} | {per_update} | {wall:,.1f} to {total * repeat:,} frames |"
        )
    sync = report.trained.get("sync-ppo")
    if sync is not None and sync.update_us_per_step is not None:
        lines += [
            "",
            f"sync-ppo time per agent step: env {_number(sync.env_us_per_step, 0)} us, act "
            f"{_number(sync.model_us_per_step, 0)} us, update {_number(sync.update_us_per_step, 0)} us.",
        ]
    return lines


def _baseline_profile(report: ThroughputReport) -> list[str]:
    b = report.baselines[0]
    return [
        "",
        f"Baseline time per env step: env {b.env_us_per_step:,.0f} us, model (stack + act) "
        f"{b.model_us_per_step:,.0f} us.",
    ]


def _per_mode_header(report: ThroughputReport, caption: str, first_column: str) -> list[str]:
    """A caption and the head of a table with one column per stack mode."""
    return [
        "",
        caption,
        "",
        f"| {first_column} | " + " | ".join(r.mode for r in report.stacks) + " |",
        "|---|" + "---:|" * len(report.stacks),
    ]


def _hop_table(report: ThroughputReport) -> list[str]:
    if not report.stacks:
        return []
    lines = _per_mode_header(report, "Hop latency per vector step, ms (mean / p50 / p99):", "hop")
    for hop in HOPS:
        cells = []
        for r in report.stacks:
            h = r.hops.get(hop)
            cells.append("-" if h is None else f"{_ms(h.mean_s)} / {_ms(h.p50_s)} / {_ms(h.p99_s)}")
        if any(cell != "-" for cell in cells):
            lines.append(f"| {hop} | " + " | ".join(cells) + " |")
    return lines


def _edge_table(report: ThroughputReport) -> list[str]:
    """What the edge device pays besides WAN bytes: memory and CPU per env step of its two processes."""
    if not report.stacks:
        return []
    lines = _per_mode_header(
        report,
        "The edge's own costs: resident memory at the end of the run (its peak) in MiB / CPU ms per env step:",
        "edge process",
    )
    for service in EDGE_SERVICES:
        cells = []
        for r in report.stacks:
            if service not in r.resident_bytes or not r.env_steps_total:
                cells.append("-")
                continue
            cpu_ms = 1000 * r.cpu_seconds[service] / r.env_steps_total
            peak = r.peak_resident_bytes.get(service)
            peak_cell = "" if peak is None else f" ({peak / 2**20:.0f})"
            cells.append(f"{r.resident_bytes[service] / 2**20:.0f}{peak_cell} / {cpu_ms:.2f}")
        lines.append(f"| {service} | " + " | ".join(cells) + " |")
    return lines


def _cpu_table(report: ThroughputReport) -> list[str]:
    if not report.stacks:
        return []
    lines = _per_mode_header(
        report, "Where time goes: CPU seconds per service / wall seconds of the run (1.00 = one core busy):", "service"
    )
    for service in (*SERVICES, SUPERVISOR):
        cells = [
            _number(r.cpu_seconds[service] / r.wall_seconds, 2) if service in r.cpu_seconds else "-"
            for r in report.stacks
        ]
        lines.append(f"| {service} | " + " | ".join(cells) + " |")
    return lines


def _link_table(report: ThroughputReport) -> list[str]:
    if not report.links:
        return []
    wan = any(link.transport == "grpc-wan" for link in report.links)
    lines = [
        "",
        "Link microbenchmark, one stream on loopback (receiver in another process"
        + ("; gRPC WAN: both ends as splitrl's WAN links, a fixed window without bandwidth probes):" if wan else "):"),
        "",
        "| message | raw TCP msg/s | gRPC msg/s | raw TCP MB/s | gRPC MB/s | gRPC / TCP |"
        + (" gRPC WAN msg/s | WAN / default |" if wan else ""),
        "|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if wan else ""),
    ]
    by_key = {(link.transport, link.message_bytes): link for link in report.links}
    for size in sorted({link.message_bytes for link in report.links}):
        tcp, grpc_ = by_key.get(("tcp", size)), by_key.get(("grpc", size))
        if tcp is None or grpc_ is None:
            continue
        row = (
            f"| {size:,} B | {tcp.messages_per_s:,.0f} | {grpc_.messages_per_s:,.0f} | {tcp.megabytes_per_s:,.1f} | "
            f"{grpc_.megabytes_per_s:,.1f} | {grpc_.messages_per_s / tcp.messages_per_s:.2f} |"
        )
        grpc_wan = by_key.get(("grpc-wan", size))
        if wan:
            row += (
                " - | - |"
                if grpc_wan is None
                else f" {grpc_wan.messages_per_s:,.0f} | {grpc_wan.messages_per_s / grpc_.messages_per_s:.2f} |"
            )
        lines.append(row)
    return lines


def _profile_table(report: ThroughputReport) -> list[str]:
    """Where each service's time went (--profile-s): py-spy's samples, the share spent waiting, the busiest
    functions by self time."""
    if not any(r.profiles for r in report.stacks):
        return []
    seconds = report.settings.get("profile_s")
    lines = [
        "",
        f"Where the time goes: py-spy, {seconds:g} s of every service at once after the warm-up, share of a "
        "process's samples (waiting: the event loop's select, idle pool and gRPC threads; functions by self time):",
        "",
        "| mode | service | samples | waiting | busiest functions |",
        "|---|---|---:|---:|---|",
    ]
    for r in report.stacks:
        for name, profile in sorted(r.profiles.items()):
            busiest = ", ".join(f"{function} {share:.0%}" for function, share in profile.top[:4])
            lines.append(f"| {r.mode} | {name} | {profile.samples:,} | {profile.waiting_share:.0%} | {busiest} |")
    return lines


def _in_bfloat16(settings: dict[str, Any]) -> list[str]:
    """Which of the stack's torch passes run in bfloat16 in a bench of `settings` (--train-precision: the
    learner's; --encoder-precision: the split edge's encoder, named only when a split mode ran), for the report's
    title."""
    in_bfloat16 = ["learner"] if settings.get("train_precision") == "bfloat16" else []
    split_ran = any(mode != "cloud" for mode in settings.get("modes", ()))
    if split_ran and settings.get("encoder_precision") == "bfloat16":
        in_bfloat16.append("split edge encoder")
    return in_bfloat16
