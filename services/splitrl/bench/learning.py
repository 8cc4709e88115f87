"""`splitrl bench learning`: rows x seeds trained to a frame budget, resumably, with evaluations on the way.

Each (row, seed) is a run directory OUT/runs/<row>_seed<seed> trained by
`splitrl up` in segments of --segment-frames; each segment ends with
`splitrl eval` on unseen episodes. Interrupt it at any time: rerunning the same
command resumes every run from its checkpoints (`up --resume`) and skips the
segments and evaluations already done. Frames are agent steps x action repeat.
The table (learning.md, learning.json) and figure (learning.png) go to OUT.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from splitrl.bench.learning_report import write_learning_report
from splitrl.bench.segments import Budget, run_segments
from splitrl.bench.settings import LearningBenchSettings, row_flags
from splitrl.core.args import load_config, to_argv, validate_settings
from splitrl.run import files as run_dir_files
from splitrl.run.registry import EDGE_SERVICES
from splitrl.run.summary import mean_return_between


@dataclass(frozen=True)
class Row:
    """One row: a mode, its codec (cloud: observation codec; split: activation and gradient codec), a width,
    encoder epochs and a bottleneck (each optional: the recipe's otherwise); see `row_flags`."""

    spec: str

    @property
    def slug(self) -> str:
        return self.spec.replace(":", "_").replace("+", "-")

    def up_flags(self) -> dict[str, Any]:
        return row_flags(self.spec)


def _splitrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "splitrl.cli.main", *args]


def repeat_and_frames(settings: LearningBenchSettings) -> tuple[int, int]:
    """(action repeat, env frames per run) of the bench: --frames, or else the recipe's own length (its steps
    x its action repeat), so a recipe whose schedules end with its steps is not trained past them. ValueError
    when neither says how long (a recipe without `steps`: the run's default of a few thousand is no budget)."""
    from splitrl.run.settings import RunSettings

    values = load_config(settings.config, RunSettings)
    if settings.frames is None and "steps" not in values:
        raise ValueError(f"{settings.config} sets no steps: give --frames")
    # steps 1 where the recipe sets none: the bench gives the length, and check_recipe_covers holds it to the recipe
    recipe = validate_settings(RunSettings, {**values, "steps": values.get("steps", 1)})
    repeat = int(recipe.action_repeat)
    return repeat, recipe.steps * repeat if settings.frames is None else settings.frames


#: The recipe's fields a resumed run takes from the recipe rather than from its own settings.json: schedules are
#: drawn over the budget, so going on to a larger --frames takes a recipe whose schedules reach it.
SCHEDULE_FIELDS = ("lr_anneal_steps", "entropy_anneal_steps")


def check_recipe_covers(settings: LearningBenchSettings, budget: Budget, repeat: int, frames: int) -> None:
    """ValueError, before anything trains, if the recipe cannot run to the budget (e.g. its learning rate reaches
    0 before the last frame), with what to change."""
    from splitrl.run.settings import RunSettings

    steps = budget.total_steps
    try:
        validate_settings(RunSettings, {**load_config(settings.config, RunSettings), "steps": steps})
    except ValueError as error:
        raise ValueError(
            f"--frames {frames:,} is {steps:,} agent steps at the recipe's action repeat {repeat}, and "
            f"{settings.config} cannot run that far: {error}\n(in a copy of the recipe with larger lr_anneal_steps and "
            "entropy_anneal_steps, the same --out goes on from its runs' checkpoints: a resumed run takes the "
            "recipe's schedules)"
        ) from None


def schedule_of(settings: LearningBenchSettings) -> dict[str, Any]:
    """The recipe's own SCHEDULE_FIELDS values (those it sets to a number; a null leaves the run's own)."""
    from splitrl.run.settings import RunSettings

    values = load_config(settings.config, RunSettings)
    return {field: values[field] for field in SCHEDULE_FIELDS if values.get(field) is not None}


def _budget(settings: LearningBenchSettings, repeat: int, frames: int) -> Budget:
    return Budget.of_frames(
        frames,
        settings.segment_frames,
        repeat,
        settings.eval_episodes,
        settings.final_episodes,
        sampled_evals=settings.sampled_evals,
    )


def train(settings: LearningBenchSettings, budget: Budget, repeat: int, row: Row, seed: int, run_dir: Path) -> None:
    """Bring one run to the frame budget, segment by segment, each followed by an evaluation."""

    def evaluate(episodes: int, deterministic: bool) -> None:
        policy = () if deterministic else ("--no-deterministic",)
        _call(_splitrl("eval", str(run_dir), "--episodes", str(episodes), *policy), f"eval {run_dir}")

    def train_to(_: dict[str, float], target: int) -> None:
        if (run_dir / run_dir_files.SETTINGS_FILE).exists():
            flags = {**schedule_of(settings), "steps": target}
            command = _splitrl("up", "--resume", str(run_dir), *to_argv(flags))
        else:
            flags = {**row.up_flags(), "seed": seed, "steps": target, "run_dir": run_dir}
            command = _splitrl("up", "--config", str(settings.config), *to_argv(flags))
        print(f"  {row.spec} seed {seed}: training to {target * repeat:,} frames", flush=True)
        _call(command, f"up {run_dir}", quiet=True)

    run_segments(run_dir, budget, evaluate, train_to)


def train_reference(settings: LearningBenchSettings, budget: Budget, seed: int, run_dir: Path) -> None:
    """The Stable-Baselines3 PPO row on the recipe's cloud settings (splitrl.bench.sb3_reference)."""
    from splitrl.bench.sb3_reference import train_sb3
    from splitrl.run.settings import RunSettings

    recipe = validate_settings(
        RunSettings, {**load_config(settings.config, RunSettings), "seed": seed, "steps": budget.total_steps}
    )
    train_sb3(run_dir, recipe, budget)


def _call(command: list[str], what: str, quiet: bool = False) -> None:
    finished = subprocess.run(command, stdout=subprocess.DEVNULL if quiet else None)
    if finished.returncode != 0:
        raise RuntimeError(f"{what} failed with exit code {finished.returncode}")


def run_learning_bench(settings: LearningBenchSettings) -> int:
    """Train (or resume) every row x seed, then write the table and figure; returns a process exit code."""
    try:
        repeat, frames = repeat_and_frames(settings)
        budget = _budget(settings, repeat, frames)
        if not settings.report_only:
            check_recipe_covers(settings, budget, repeat, frames)
    except ValueError as error:
        print(f"splitrl bench learning: {error}", file=sys.stderr)
        return 2
    rows = [Row(spec) for spec in settings.rows]
    print(
        f"learning bench: {len(rows)} rows{' + sb3-ppo' if settings.sb3_reference else ''} x "
        f"{len(settings.seeds)} seeds, {frames:,} frames each "
        f"(action repeat {repeat}), recipe {settings.config}"
    )
    #: (row label, seed, run dir, how to train it, whether it has WAN links): splitrl's rows, then the SB3 peer.
    runs: list[tuple[str, int, Path, Callable[[], None], bool]] = []
    for row in rows:
        for seed in settings.seeds:
            run_dir = settings.out / "runs" / f"{row.slug}_seed{seed}"
            runs.append((row.spec, seed, run_dir, partial(train, settings, budget, repeat, row, seed, run_dir), True))
    if settings.sb3_reference:
        for seed in settings.seeds:
            run_dir = settings.out / "runs" / f"sb3-ppo_seed{seed}"
            runs.append(("sb3-ppo", seed, run_dir, partial(train_reference, settings, budget, seed, run_dir), False))
    results = []
    for label, seed, run_dir, train_run, networked in runs:
        started = time.monotonic()
        if settings.report_only:
            if run_dir_files.load_curve(run_dir):
                results.append(summarize_run(label, seed, run_dir, repeat, networked))
            continue
        try:
            train_run()
        except KeyboardInterrupt:
            print("\ninterrupted; rerun the same command to resume", file=sys.stderr)
            return 130
        except RuntimeError as error:
            print(f"{label} seed {seed}: {error}; see {run_dir / 'logs'}", file=sys.stderr)
            return 1
        except ValueError as error:  # the reference peer's extra is not installed
            print(f"splitrl bench learning: {error}", file=sys.stderr)
            return 2
        results.append(summarize_run(label, seed, run_dir, repeat, networked))
        print(f"  {label} seed {seed}: done ({time.monotonic() - started:.0f} s this call)")
    for path in write_learning_report(results, settings.out):
        print(f"wrote {path}")
    print((settings.out / "learning.md").read_text())
    return 0


def summarize_run(spec: str, seed: int, run_dir: Path, repeat: int, networked: bool = True) -> dict[str, Any]:
    """One table row: frames, wall time, WAN bytes, training return at the end, and the evaluations.

    `networked=False` (a one-process reference peer): no WAN bytes to report, None instead of 0.
    """
    curve = run_dir_files.load_curve(run_dir)
    evals = run_dir_files.load_evals(run_dir)
    summary = last_summary(run_dir)
    last = curve[-1] if curve else run_dir_files.zero_point()
    steps = last["env_steps"]
    final_train, _ = mean_return_between(curve, 0.8 * steps, steps)
    return {
        "row": spec,
        "seed": seed,
        "run_dir": str(run_dir),
        "action_repeat": repeat,
        "frames": int(steps * repeat),
        "wall_seconds": last["seconds"],
        "wan_bytes": last["wan_bytes"] if networked else None,
        "wan_bytes_per_frame": last["wan_bytes"] / (steps * repeat) if steps and networked else None,
        "train_return_last_20pct": final_train,
        "last_segment_shadow": last_segment_shadow(summary),
        "last_segment_edge_costs": last_segment_edge_costs(summary),
        "curve": curve,
        "evals": [
            {key: e[key] for key in ("env_steps", "episodes", "mean", "iqm", "std")}
            | {key: e.get(key) for key in ("out_of_time", "at_threshold")}  # None: recorded before eval counted them
            | {"frames": int(e["env_steps"] * repeat), "deterministic": e.get("deterministic", True)}
            for e in evals
            if e.get("env_steps") is not None
        ],
    }


def last_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary.json of a run's last segment (None for a run without one, e.g. the one-process peer's)."""
    try:
        summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary


def last_segment_shadow(summary: dict[str, Any] | None) -> dict[str, float] | None:
    """A split run recorded with --video-shadow (e.g. in its --config): its last segment's WAN bytes per agent
    step beside what cloud mode over H.264 would have sent for the same frames (summary.json's
    cloud_h264_shadow); None for a run without a shadow or a summary."""
    shadow = summary.get("cloud_h264_shadow") if summary else None
    if not summary or not shadow:
        return None
    return {
        "env_steps": summary["env_steps"],
        "split_wan_bytes_per_env_step": sum(summary["wan_bytes_per_env_step"].values()),
        "cloud_h264_wan_bytes_per_env_step": shadow["wan_bytes_per_env_step"],
        "split_share": shadow["split_share"],
    }


def last_segment_edge_costs(summary: dict[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    """What the edge device's processes used in the run's last segment (summary.json's `processes`: CPU ms
    per agent step, resident MiB at the end and at peak), by service; None for a run recorded without them."""
    processes = summary.get("processes") if summary else None
    if not processes:
        return None
    return {name: processes[name] for name in EDGE_SERVICES if name in processes} or None
