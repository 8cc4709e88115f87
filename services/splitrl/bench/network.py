"""`splitrl bench network`: every mode x codec x width on the same env, seeds and env steps, one `splitrl up` each.

Rows: cloud with each observation codec, then each split mode with each
activation codec at each width. Each (row, seed) is a run directory under
OUT/runs; a run whose summary.json already covers the requested steps is reused,
so an interrupted or extended benchmark resumes where it stopped (delete a run
directory to redo it). The table, CSV and figures go to OUT (see report.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitrl.bench.report import write_report
from splitrl.bench.results import load_run
from splitrl.bench.settings import NetworkBenchSettings
from splitrl.core.args import settings_argv
from splitrl.core.config import Mode
from splitrl.run.settings import RunSettings


@dataclass(frozen=True)
class Config:
    """One row of the study: what `splitrl up` gets besides the shared settings."""

    mode: Mode
    codec: str  # observation codec (cloud) or activation codec (split modes)
    width: int
    gradient_codec: str
    video_crf: int | None = None  # cloud h264 rows only
    encoder_epochs: int | None = None  # split rows: None trains the encoder in every epoch

    @property
    def slug(self) -> str:
        parts = [self.mode, self.codec.replace("+", "-")]
        if self.video_crf is not None:
            parts.append(f"crf{self.video_crf}")
        if self.mode != "cloud":
            parts += [f"w{self.width}", "g" + self.gradient_codec.replace("+", "-")]
        if self.encoder_epochs is not None:
            parts.append(f"e{self.encoder_epochs}")
        return "_".join(parts)

    def up_flags(self) -> dict[str, Any]:
        if self.mode == "cloud":
            video = {} if self.video_crf is None else {"video_crf": self.video_crf}
            return {"mode": "cloud", "codec": self.codec, "width": self.width, **video}
        return {
            "mode": self.mode,
            "activation_codec": self.codec,
            "gradient_codec": self.gradient_codec,
            "width": self.width,
            "encoder_epochs": self.encoder_epochs,
        }


def matrix(settings: NetworkBenchSettings) -> list[Config]:
    """Cloud rows first (one per observation codec, h264 once per CRF), then each split mode x activation
    codec x width (x encoder epochs, if given)."""
    configs: list[Config] = []
    for mode in settings.modes:
        if mode == "cloud":
            for observation_codec in settings.observation_codecs:
                crfs: list[int | None] = list(settings.video_crfs) if observation_codec == "h264" else [None]
                configs += [Config("cloud", observation_codec, settings.width, "-", crf) for crf in crfs]
            continue
        encoder_epochs: list[int | None] = list(settings.encoder_epochs) or [None]
        for codec in settings.activation_codecs:
            gradient = codec if settings.gradient_codec == "same" else settings.gradient_codec
            configs += [
                Config(mode, codec, width, gradient, encoder_epochs=epochs)
                for width in settings.widths
                for epochs in encoder_epochs
            ]
    return configs


def _is_complete(run_dir: Path, steps: int) -> bool:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    codes = summary.get("exit_codes") or {}
    return not summary.get("interrupted") and all(c == 0 for c in codes.values()) and summary["env_steps"] >= steps


def _up_command(settings: NetworkBenchSettings, config: Config, seed: int, run_dir: Path) -> list[str]:
    """The row's `splitrl up`, its settings validated here (RunSettings) before the child starts."""
    flags: dict[str, Any] = {
        **settings.env_flags(),  # width: each row's own, from config.up_flags() below
        "steps": settings.steps,
        "seed": seed,
        "num_envs": settings.num_envs,
        "unroll_length": settings.unroll_length,
        "chunks_per_update": settings.chunks_per_update,
        "epochs": settings.epochs,
        "minibatches": settings.minibatches,
        "learning_rate": settings.learning_rate,
        "run_dir": run_dir,
        **config.up_flags(),
    }
    return [sys.executable, "-m", "splitrl.cli.main", "up", *settings_argv(RunSettings(**flags))]


def run_network_bench(settings: NetworkBenchSettings) -> int:
    """Run (or reuse) every row x seed, then write the report; returns a process exit code."""
    configs = matrix(settings)
    total = len(configs) * len(settings.seeds)
    print(
        f"network bench: {len(configs)} rows x {len(settings.seeds)} seeds on {settings.env}, {settings.steps:,} steps"
    )
    run_dirs: list[Path] = []
    failed: list[str] = []
    for index, (config, seed) in enumerate(((c, s) for c in configs for s in settings.seeds), start=1):
        run_dir = settings.out / "runs" / f"{config.slug}_seed{seed}"
        prefix = f"[{index}/{total}] {config.slug} seed {seed}"
        if _is_complete(run_dir, settings.steps):
            print(f"{prefix}: done before, reused ({run_dir})")
            run_dirs.append(run_dir)
            continue
        started = time.monotonic()
        shutil.rmtree(run_dir, ignore_errors=True)  # a run cut short before: redone whole, from fresh weights
        try:
            finished = subprocess.run(_up_command(settings, config, seed, run_dir), stdout=subprocess.DEVNULL)
        except KeyboardInterrupt:
            print(f"\n{prefix}: interrupted; rerun the same command to resume", file=sys.stderr)
            return 130
        if finished.returncode != 0 or not _is_complete(run_dir, settings.steps):
            print(f"{prefix}: FAILED (exit {finished.returncode}); see {run_dir / 'logs'}", file=sys.stderr)
            failed.append(prefix)
            continue
        result = load_run(run_dir, settings.return_window)
        final = "n/a" if result.final_return is None else f"{result.final_return:+.2f}"
        print(
            f"{prefix}: {result.wan_bytes_per_step:,.0f} WAN B/step, final return {final}, "
            f"{time.monotonic() - started:.0f} s"
        )
        run_dirs.append(run_dir)
    if run_dirs:
        runs = [load_run(run_dir, settings.return_window) for run_dir in run_dirs]
        for path in write_report(runs, settings.out, tolerance=settings.return_tolerance):
            print(f"wrote {path}")
        print((settings.out / "report.md").read_text())
    if failed:
        print(f"{len(failed)} runs failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
