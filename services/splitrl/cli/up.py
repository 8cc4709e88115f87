"""`splitrl up`: a whole training run on this machine, every service its own process on loopback.

Every service's settings come from one plan of the run (splitrl.run.plan),
validated before anything starts. Start order follows the dial direction
(replay, inference, learner, edge-encoder, environment), each waiting for the
previous one's port file. The run ends
when the environment has taken `steps` agent steps; services then stop
upstream-first so every queue drains into the next, each writing its final
counters, from which `summary.json` is built. A service that dies mid-run is
restarted with the same settings and ports (run.launcher.Supervisor, up to
--max-restarts times each). Ctrl-C (or SIGTERM) stops all children; a child also
dies if this process is killed (PR_SET_PDEATHSIG). A run also ends, non-zero, when
a service keeps dying, cannot write its files, refuses its state files, or env
steps or updates stop for --progress-timeout-s (run.outcome); summary.json is
written on every exit and says why the run ended (`end`). TensorBoard and
curve.jsonl stop with a warning if the disk refuses them; the run goes on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from splitrl.cli.progress import Progress
from splitrl.cli.tensorboard import TensorBoardLog
from splitrl.core import scrape
from splitrl.core.config import ServerSettings
from splitrl.core.metrics import ENV_STEPS
from splitrl.run import files as run_dir_files
from splitrl.run.launcher import RunStopped, StartFailed, Supervisor, serving_addresses, stop_all
from splitrl.run.outcome import (
    COMPLETED,
    INTERRUPTED,
    BestEffort,
    ProgressWatch,
    ending,
    release_summary_space,
    start_summary,
    write_summary,
)
from splitrl.run.plan import instance_names, plan, prepare_tls
from splitrl.run.settings import RunSettings
from splitrl.run.stop_signal import StopSignal
from splitrl.run.summary import build_summary, curve_point, extend_curve, shutdown_texts


def run_up(settings: RunSettings, resume: bool = False) -> int:
    """Run the whole stack until `settings.steps` agent steps; returns the process exit code.

    `resume`: `settings.run_dir` holds an earlier segment of this run; its checkpoints and curve go on.
    """
    run_dir = settings.run_dir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{settings.mode}"
    curve = _open_run_dir(run_dir, resume)
    offset = curve[-1] if curve else run_dir_files.zero_point()
    done_steps = int(offset["env_steps"])
    if done_steps >= settings.steps:
        print(f"splitrl up: {run_dir} already took {done_steps} of --steps {settings.steps}; raise --steps to go on")
        return 0
    run_dir_files.save_settings(run_dir, settings.model_copy(update={"run_dir": run_dir}).model_dump_json(indent=2))
    plan(settings, run_dir, done_steps=done_steps)  # every service's settings validate before anything starts
    start_summary(run_dir)
    interrupted, stopped = False, None
    outputs = BestEffort()

    def save_curve(run_dir: Path, point: dict[str, float]) -> None:
        outputs("curve.jsonl", lambda: run_dir_files.append_curve(run_dir, point))

    def settings_for(name: str) -> ServerSettings | None:
        steps = done_steps
        if name == "environment":  # a restarted environment takes only the steps still to take, on new tracks
            steps += int(scrape.total(supervisor.retired_texts("environment"), f"{ENV_STEPS}_total"))
            if steps >= settings.steps:
                return None
        return plan(settings, run_dir, serving_addresses(supervisor.children), done_steps=steps)[name]

    with StopSignal() as stop:  # Ctrl-C or SIGTERM: a flag the loop below reads, see run.stop_signal
        supervisor = Supervisor(
            run_dir,
            instance_names(settings),
            settings_for,
            max_restarts=settings.max_restarts,
            start_timeout_s=settings.start_timeout_s,
            sleep=stop.sleep,
        )
        started = time.monotonic()
        progress = Progress(settings.steps, sys.stdout.isatty(), done_steps, settings.verbose)
        tensorboard = outputs("TensorBoard", lambda: TensorBoardLog(run_dir)) if settings.tensorboard else None
        watch = ProgressWatch(settings.progress_timeout_s)
        try:
            prepare_tls(settings, run_dir)
            progress.starting(supervisor.instances, run_dir / "logs")
            supervisor.start_all()
            started = time.monotonic()
            while not supervisor.environment_done():
                supervisor.watch()
                live = supervisor.live_texts()
                texts = live + supervisor.retired_texts()
                progress.update(texts, time.monotonic() - started, supervisor.restarts)
                seconds = round(time.monotonic() - started, 3)
                point = run_dir_files.shifted(curve_point(texts) | {"seconds": seconds}, offset)
                if extend_curve(curve, point, run_dir, save_curve) and tensorboard is not None:
                    outputs("TensorBoard", lambda: tensorboard.add(point, texts, live, offset))  # noqa: B023 (now)
                watch.check(point, time.monotonic(), supervisor)
                stop.sleep(settings.progress_interval_s)
            elapsed = time.monotonic() - started
        except KeyboardInterrupt:
            interrupted, elapsed = True, time.monotonic() - started
            print("\ninterrupted: stopping services", file=sys.stderr)
        except RunStopped as error:  # a start that failed, a service that kept dying, a run that stopped moving
            print(f"splitrl up: {error}", file=sys.stderr)
            stopped, elapsed = error, time.monotonic() - started
        finally:  # still inside StopSignal: a second Ctrl-C cannot cut this short and leave children behind
            stop_all(supervisor.children)
            progress.close()
        # Inside StopSignal too: a Ctrl-C now would leave no summary, or TensorBoard's writer half-flushed.
        try:
            summary = build_summary(settings, run_dir, supervisor, elapsed, interrupted, curve, offset, save_curve)
            reason = stopped.reason if stopped else (INTERRUPTED if interrupted else COMPLETED)
            summary["end"] = ending(reason, str(stopped or ""))
            _write_results(summary, run_dir, supervisor, tensorboard, offset, outputs)
        finally:
            release_summary_space(run_dir)
    if isinstance(stopped, StartFailed):  # no run took place: its summary says why, no result is shown
        return 1
    progress.print_summary(summary, run_dir / "summary.json")
    failed = [name for name, code in summary["exit_codes"].items() if code != 0]
    return 130 if interrupted else (1 if failed or stopped else 0)


def _open_run_dir(run_dir: Path, resume: bool) -> list[dict[str, float]]:
    """Make RUN_DIR's folders, clear what counts only for one segment; returns the curve so far (resume)."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics").mkdir(exist_ok=True)
    for stale in (run_dir / "metrics").glob("*.prom"):  # a reused run dir: count only this run
        stale.unlink()
    if resume:
        return run_dir_files.load_curve(run_dir)
    (run_dir / run_dir_files.CURVE_FILE).unlink(missing_ok=True)
    return []


def _write_results(
    summary: dict[str, Any],
    run_dir: Path,
    supervisor: Supervisor,
    tensorboard: TensorBoardLog | None,
    offset: dict[str, float],
    outputs: BestEffort,
) -> None:
    """summary.json (first: it says why the run ended), TensorBoard's last point and learning.png, each of the
    last two skipped with a warning if the disk refuses it."""
    write_summary(run_dir, summary)
    if tensorboard is not None:  # the final counters too: a short run may update only near its end
        shutdown = shutdown_texts(run_dir)
        texts = shutdown + supervisor.retired_texts()
        outputs("TensorBoard", lambda: tensorboard.add(summary["curve"][-1], texts, shutdown, offset))
        outputs("TensorBoard", tensorboard.close)
    from splitrl.cli.plots import plot_run  # here: `splitrl serve` parses RunSettings too, and needs no matplotlib

    outputs("learning.png", lambda: plot_run(summary, run_dir / "learning.png", run_dir_files.load_evals(run_dir)))
