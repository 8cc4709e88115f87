"""How a `splitrl up` run ends: the watch that ends a run making no progress, the outputs that stop (with a
warning) rather than end the run when the disk refuses them, and summary.json, written on every exit with the
reason the run ended.

A full disk must not cost the summary: `start_summary` writes RUN_DIR/summary.reserve (SUMMARY_RESERVE bytes)
when the run starts, and `write_summary` removes it just before writing summary.json, so the summary has that
room even when the run filled the disk; a summary larger still is written with its curve thinned.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from splitrl.core.state_files import write_atomic
from splitrl.run.launcher import RunStopped, Supervisor, last_log_lines

T = TypeVar("T")
SUMMARY_FILE = "summary.json"
RESERVE_FILE = "summary.reserve"
#: Bytes kept free for summary.json: a summary with a few thousand curve points.
SUMMARY_RESERVE = 1 << 20
#: Curve points a summary keeps when the whole curve does not fit on the disk (curve.jsonl may hold them all).
THINNED_CURVE_POINTS = 200
#: summary.json's `end.reason` of a run that took all its steps, and of one stopped by Ctrl-C or SIGTERM.
COMPLETED, INTERRUPTED = "completed", "interrupted"


class NoProgress(RunStopped):
    """The run's env steps or learner updates stopped growing for longer than --progress-timeout-s."""

    reason = "no progress"


class ProgressWatch:
    """Raises NoProgress when env steps or learner updates have not grown for `timeout_s` seconds (0: never).

    Each counter's clock starts at its first reading, so a run's start-up (before any update) counts too.
    """

    COUNTERS = (("env_steps", "env steps"), ("updates", "learner updates"))

    def __init__(self, timeout_s: float) -> None:
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0 (0: never), got {timeout_s}")
        self.timeout_s = timeout_s
        self._grew: dict[str, tuple[float, float]] = {}  # counter -> (its value, when it last grew)

    def check(self, point: dict[str, float], now: float, supervisor: Supervisor) -> None:
        if not self.timeout_s:
            return
        for key, words in self.COUNTERS:
            value = point[key]
            last = self._grew.get(key)
            if last is None or value > last[0]:
                self._grew[key] = (value, now)
            elif now - last[1] > self.timeout_s:
                raise NoProgress(self._message(words, value, now - last[1], supervisor))

    def _message(self, words: str, value: float, seconds: float, supervisor: Supervisor) -> str:
        silent = sorted(supervisor.silent)
        if silent:
            suspects, why = silent, f"not answering /metrics: {', '.join(silent)}"
        elif words == "learner updates":
            suspects, why = (
                [name for name in supervisor.children if name.startswith("learner")],
                "every service answers",
            )
        else:
            suspects, why = list(supervisor.children), "every service answers"
        ends = "".join(
            f"\n  the end of logs/{name}.log:{last_log_lines(supervisor.run_dir, name, 5)}" for name in suspects
        )
        return (
            f"no progress: {words} stayed at {value:.0f} for {seconds:.0f} s (--progress-timeout-s "
            f"{self.timeout_s:g}); {why}." + ends
        )


class BestEffort:
    """Outputs a run can do without (TensorBoard, curve.jsonl): the first OSError stops one, with one warning,
    and the run goes on."""

    def __init__(self) -> None:
        self.stopped: dict[str, OSError] = {}

    def __call__(self, what: str, action: Callable[[], T]) -> T | None:
        if what in self.stopped:
            return None
        try:
            return action()
        except OSError as error:
            self.stopped[what] = error
            print(f"splitrl up: {what} stopped: {error}; the run goes on without it", file=sys.stderr, flush=True)
            return None


def start_summary(run_dir: Path) -> None:
    """At a run's (or a resumed segment's) start: remove an earlier segment's summary.json, which no longer says
    how the run ended, and hold SUMMARY_RESERVE bytes of the disk for this one's (see the module docstring)."""
    (run_dir / SUMMARY_FILE).unlink(missing_ok=True)
    try:
        with (run_dir / RESERVE_FILE).open("wb") as file:
            file.write(bytes(SUMMARY_RESERVE))  # written, not a sparse truncate: the blocks are really taken
    except OSError as error:
        (run_dir / RESERVE_FILE).unlink(missing_ok=True)
        print(f"splitrl up: cannot reserve room for summary.json: {error}", file=sys.stderr)


def release_summary_space(run_dir: Path) -> None:
    (run_dir / RESERVE_FILE).unlink(missing_ok=True)


def write_summary(run_dir: Path, summary: dict[str, Any]) -> bool:
    """Write RUN_DIR/summary.json atomically, using the reserved room; with the curve thinned if the whole does
    not fit. Returns whether it was written (if not, a warning says why)."""
    release_summary_space(run_dir)
    path = run_dir / SUMMARY_FILE
    curve = summary.get("curve", [])
    step = max(1, -(-len(curve) // THINNED_CURVE_POINTS))
    thinned = summary | {"curve": [*curve[:-1:step], *curve[-1:]], "curve_thinned_from": len(curve)}
    failure: OSError | None = None
    for attempt in (summary, thinned):
        text = json.dumps(attempt, indent=2).encode()
        try:
            write_atomic(path, lambda file: file.write(text))  # noqa: B023 (called at once)
        except OSError as error:
            failure = error
            continue
        if attempt is thinned:
            print(f"splitrl up: {path} holds a thinned curve (curve.jsonl has every point)", file=sys.stderr)
        return True
    print(f"splitrl up: cannot write {path}: {failure}", file=sys.stderr)
    return False


def ending(reason: str, message: str = "") -> dict[str, str]:
    """summary.json's `end`: `reason` (COMPLETED, INTERRUPTED, or a RunStopped's reason) and, for a run that
    stopped early, the message `splitrl up` printed."""
    return {"reason": reason, "message": message}
