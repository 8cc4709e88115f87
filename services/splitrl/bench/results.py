"""Run summaries -> the network study's rows: WAN bytes and numbers per env step, per phase and link, and return.

A *run* is one `splitrl up` directory (summary.json). Runs that differ only in
seed form one *row*: one mode x codec x width configuration. Everything here is
computed from the run's final counters; nothing is estimated.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitrl.bench.settings import RETURN_TOLERANCE
from splitrl.core import scrape
from splitrl.core.config import VideoSettings
from splitrl.run.summary import mean_return_between

PHASES = ("rollout", "training", "weights")
#: The research's own figures per env step (docs/design.md §1: CarRacing, 4x96x96 frames, width 4,096, bf16
#: accounting, ~400k env steps): 14.7 B numbers / 28 GB for cloud, 1.6 B / 3.2 GB rollout for the split
#: plus 66 GB of training traffic.
RESEARCH_BYTES_PER_STEP: dict[str, dict[str, float]] = {
    "cloud stack-bf16": {"rollout": 73_728, "training": 0},
    "split bf16 w4096": {"rollout": 8_192, "training": 66e9 / 400e3},
}
#: The cloud row whose return every other cloud row must match to count as a baseline: one lossless frame per
#: step, stacked in the cloud, so its learning is what any observation codec should reach.
REFERENCE = "cloud frame"


@dataclass(frozen=True)
class RunResult:
    """One `splitrl up` run, reduced to what the study compares. Bytes are serialized protobuf bytes sent."""

    run_dir: Path
    row: str
    mode: str
    codec: str
    width: int
    gradient_codec: str
    seed: int
    env: str
    env_steps: int
    wall_seconds: float
    final_return: float | None
    final_episodes: int
    wan_bytes: dict[str, int]  # by phase
    wan_elements: dict[str, int]  # by phase ("numbers", the research's unit)
    link_bytes: dict[str, int]  # "link/phase" -> bytes sent, every link
    curve: list[dict[str, float]] = field(repr=False)

    @property
    def wan_bytes_per_step(self) -> float:
        return sum(self.wan_bytes.values()) / max(self.env_steps, 1)


def row_name(settings: dict[str, Any]) -> tuple[str, str, int, str]:
    """(row label, WAN codec, width, gradient codec) of a run's settings; the label says what crossed the WAN."""
    mode = settings.get("mode", "split")
    width = int(settings.get("width", 4096))
    if mode == "cloud":
        codec = settings.get("codec", "frame")
        if codec == "h264":
            codec = f"h264 crf{settings.get('video_crf', VideoSettings.model_fields['video_crf'].default)}"
        return f"cloud {codec}", codec, width, "-"
    codec = settings.get("activation_codec", "bf16")
    gradient = settings.get("gradient_codec", "bf16")
    label = f"{mode} {codec} w{width}" + ("" if gradient == codec else f" grad {gradient}")
    if settings.get("encoder_epochs") is not None:
        label += f" e{settings['encoder_epochs']}"  # the encoder trains in only the last epochs of each update
    if settings.get("encoder_fraction") is not None:
        label += f" f{settings['encoder_fraction']:g}"  # the share of rows that train the encoder
    return label, codec, width, gradient


def load_run(run_dir: Path, return_window: float = 0.2) -> RunResult:
    """Read RUN_DIR/summary.json; the final return averages the episodes of the last `return_window` of steps."""
    summary = json.loads((run_dir / "summary.json").read_text())
    settings = summary.get("settings") or {}
    label, codec, width, gradient = row_name(settings)
    steps = int(summary.get("env_steps") or 0)
    final_return, episodes = mean_return_between(summary.get("curve") or [], steps * (1 - return_window), steps)
    links = summary.get("links") or {}
    sent_bytes = scrape.link_totals(links)
    link_bytes = {f"{link}/{phase}": sent for (link, phase), sent in sent_bytes.items()}
    wan_bytes = {phase: 0 for phase in PHASES} | scrape.wan_by_phase(links)
    wan_elements = {phase: 0 for phase in PHASES} | scrape.wan_by_phase(links, unit="elements")
    return RunResult(
        run_dir=run_dir,
        row=label,
        mode=settings.get("mode", "?"),
        codec=codec,
        width=width,
        gradient_codec=gradient,
        seed=int(settings.get("seed", 0)),
        env=settings.get("env", "?"),
        env_steps=steps,
        wall_seconds=float(summary.get("wall_seconds") or 0),
        final_return=final_return,
        final_episodes=episodes,
        wan_bytes=wan_bytes,
        wan_elements=wan_elements,
        link_bytes=link_bytes,
        curve=summary.get("curve") or [],
    )


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories in `paths`: each path is a run (has summary.json) or holds runs at any depth."""
    found: list[Path] = []
    for path in paths:
        if (path / "summary.json").is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p.parent for p in path.rglob("summary.json")))
        else:
            raise FileNotFoundError(f"{path}: no such run directory")
    if not found:
        raise FileNotFoundError(f"no summary.json under {', '.join(map(str, paths))}")
    return found


@dataclass(frozen=True)
class Row:
    """Runs of one configuration over seeds; per-step figures are means over the seeds."""

    name: str
    runs: tuple[RunResult, ...]

    @property
    def env_steps(self) -> int:
        return min(run.env_steps for run in self.runs)

    def per_step(self, phase: str, unit: str = "bytes") -> float:
        values = [
            (run.wan_bytes if unit == "bytes" else run.wan_elements)[phase] / max(run.env_steps, 1) for run in self.runs
        ]
        return statistics.fmean(values)

    @property
    def wan_bytes_per_step(self) -> float:
        return sum(self.per_step(phase) for phase in PHASES)

    @property
    def wan_numbers_per_step(self) -> float:
        return sum(self.per_step(phase, "elements") for phase in PHASES)

    @property
    def returns(self) -> list[float]:
        return [run.final_return for run in self.runs if run.final_return is not None]

    @property
    def mean_return(self) -> float | None:
        returns = self.returns
        return statistics.fmean(returns) if returns else None

    @property
    def training_to_rollout(self) -> float | None:
        """WAN training bytes per WAN rollout byte (the gradient budget; may exceed 1); None without rollout."""
        rollout = self.per_step("rollout")
        return self.per_step("training") / rollout if rollout > 0 else None

    @property
    def is_cloud(self) -> bool:
        return self.runs[0].mode == "cloud"

    @property
    def env(self) -> str:
        return self.runs[0].env

    @property
    def steps_per_second(self) -> float:
        return statistics.fmean(run.env_steps / run.wall_seconds for run in self.runs if run.wall_seconds > 0)


def best_cloud(rows: list[Row], tolerance: float = RETURN_TOLERANCE) -> tuple[Row | None, str]:
    """The baseline every row is compared with, and how it was chosen.

    It is the cloud row with the fewest WAN bytes per step among those of the REFERENCE row's env and run
    length whose mean final return is at least the REFERENCE row's minus `tolerance` x |reference return|
    (matched return). Without a REFERENCE row that has episodes, it is the cheapest cloud row, and the reason
    says that returns were not matched.
    """
    cloud = [row for row in rows if row.is_cloud]
    if not cloud:
        return None, "no cloud row was run"
    reference = next((row for row in cloud if row.name.split(" @")[0] == REFERENCE), None)
    if reference is None or reference.mean_return is None:
        cheapest = min(cloud, key=lambda row: row.wan_bytes_per_step)
        return cheapest, f"cheapest cloud row; returns not matched (no `{REFERENCE}` row with episodes)"
    floor = reference.mean_return - tolerance * abs(reference.mean_return)
    comparable = [row for row in cloud if (row.env, row.env_steps) == (reference.env, reference.env_steps)]
    matched = [row for row in comparable if row.mean_return is not None and row.mean_return >= floor]
    best = min(matched, key=lambda row: row.wan_bytes_per_step)
    return best, (
        f"cheapest cloud row whose final return is >= {floor:+.3g} (`{REFERENCE}`'s {reference.mean_return:+.3g} "
        f"less {tolerance:.0%} of its magnitude)"
    )


def group_rows(runs: list[RunResult]) -> list[Row]:
    """Rows in first-seen order, one per configuration and run length; a row's runs sorted by seed.

    Runs of one configuration with different env steps stay apart (named "... @60,000 steps"):
    per-step bytes and final returns are only comparable at matched steps.
    """
    lengths: dict[str, set[int]] = {}
    for run in runs:
        lengths.setdefault(run.row, set()).add(run.env_steps)
    by_name: dict[str, list[RunResult]] = {}
    for run in runs:
        name = run.row if len(lengths[run.row]) == 1 else f"{run.row} @{run.env_steps:,} steps"
        by_name.setdefault(name, []).append(run)
    return [Row(name, tuple(sorted(group, key=lambda r: r.seed))) for name, group in by_name.items()]
