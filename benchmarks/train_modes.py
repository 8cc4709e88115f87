"""Benchmark (not a test): train each mode with `splitrl up` and compare return and WAN bytes side by side.

    python benchmarks/train_modes.py --env CarRacing-v3 --steps 10000 --out runs/bench-carracing

Each mode is one `splitrl up` run (its own summary.json and learning.png under
OUT/<mode>); this script adds a table of what matters for the research question:
env steps/s, mean return early and late, and WAN bytes per phase, in total and
per env step. Runs are sequential so the modes get the same machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from splitrl.run.summary import mean_return_between

MODES = ("cloud", "split", "split-accumulate")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CarRacing-v3", help="gymnasium env id (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10_000, help="env steps per mode (default: %(default)s)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="modes to run, in order")
    parser.add_argument("--num-envs", type=int, default=2, help="envs in the environment process")
    parser.add_argument("--out", type=Path, default=Path("runs") / "bench-modes", help="where runs and tables go")
    parser.add_argument(
        "up_args", nargs=argparse.REMAINDER, help="after --: more `splitrl up` flags, e.g. -- --width 256"
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    args.up_args = [a for a in args.up_args if a != "--"]
    return args


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = args.out / mode
    command = [sys.executable, "-m", "splitrl.cli.main", "up", "--mode", mode, "--env", args.env]
    command += ["--steps", str(args.steps), "--num-envs", str(args.num_envs), "--run-dir", str(run_dir)]
    command += args.up_args
    print(f"== {mode}: {' '.join(command[3:])}", flush=True)
    started = time.monotonic()
    finished = subprocess.run(command, stdout=subprocess.DEVNULL, check=False)
    wall = time.monotonic() - started
    summary = json.loads((run_dir / "summary.json").read_text())
    window = max(args.steps // 5, 1)
    early, early_n = mean_return_between(summary["curve"], 0, window)
    late, late_n = mean_return_between(summary["curve"], args.steps - window, args.steps)
    steps = max(summary["env_steps"], 1)
    return {
        "mode": mode,
        "exit_code": finished.returncode,
        "env_steps": summary["env_steps"],
        "wall_seconds": round(wall, 1),
        "env_steps_per_second": summary["env_steps_per_second"],
        "learner_updates": summary["learner_updates"],
        "episodes": summary["episodes"],
        "mean_return": summary["mean_episode_return"],
        "return_first_fifth": early,
        "episodes_first_fifth": early_n,
        "return_last_fifth": late,
        "episodes_last_fifth": late_n,
        "wan_bytes": summary["wan_bytes"],
        "wan_bytes_per_env_step": {phase: round(b / steps, 1) for phase, b in summary["wan_bytes"].items()},
        "plot": str(run_dir / "learning.png"),
    }


def table(results: list[dict[str, Any]]) -> str:
    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:+.2f}"

    lines = [
        "| mode | env steps | wall s | steps/s | updates | episodes | mean return | return first 1/5 | return last 1/5 "
        "| WAN rollout B/step | WAN training B/step | WAN total MB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        per_step = r["wan_bytes_per_env_step"]
        lines.append(
            f"| {r['mode']} | {r['env_steps']:,} | {r['wall_seconds']:.0f} | {r['env_steps_per_second']} "
            f"| {r['learner_updates']} | {r['episodes']} | {fmt(r['mean_return'])} | {fmt(r['return_first_fifth'])} "
            f"| {fmt(r['return_last_fifth'])} | {per_step.get('rollout', 0):,.0f} "
            f"| {per_step.get('training', 0):,.0f} | {sum(r['wan_bytes'].values()) / 1e6:,.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = [run_mode(mode, args) for mode in args.modes]
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    text = f"{args.env}, {args.steps:,} env steps per mode, {args.num_envs} envs\n\n{table(results)}\n"
    (args.out / "results.md").write_text(text)
    print(text)
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
