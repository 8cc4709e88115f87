"""What a run directory keeps so `splitrl up --resume RUN_DIR` can go on: its settings, curve and evaluations.

`settings.json` is written when a run starts and `curve.jsonl` gets a line per
progress point while it runs, so even a run killed outright (no summary.json)
resumes. The learner and the edge encoder resume from their own checkpoints
under RUN_DIR/checkpoints/, and replay (unless --no-replay-durable) from its
write-ahead log and snapshots under RUN_DIR/replay/NAME/. Curve points are cumulative over
every segment of the run: a resumed segment adds its counters to the last point.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SETTINGS_FILE = "settings.json"
#: The learner's and the edge encoder's checkpoints (the edge's in its own folder below it).
CHECKPOINTS_DIR = "checkpoints"
#: Replay's write-ahead logs and snapshots, a folder per replay instance below it.
REPLAY_DIR = "replay"
CURVE_FILE = "curve.jsonl"
#: One line per `splitrl eval`: the env steps and policy version evaluated, and the returns.
EVALS_FILE = "evals.jsonl"
#: Each curve point's cumulative counters: env steps, finished episodes and their return sum, learner updates,
#: WAN bytes sent (every direction, by its sender) and seconds since the services were serving.
CURVE_KEYS = ("env_steps", "episodes", "return_sum", "updates", "wan_bytes", "seconds")


def save_settings(run_dir: Path, settings_json: str) -> None:
    (run_dir / SETTINGS_FILE).write_text(settings_json)


def learner_checkpoint_dir(run_dir: Path) -> Path:
    """Where a run's learner (rank 0) writes its checkpoint."""
    return run_dir / CHECKPOINTS_DIR


def edge_checkpoint_dir(run_dir: Path) -> Path:
    """Where a run's edge encoder writes its checkpoint."""
    return run_dir / CHECKPOINTS_DIR / "edge-encoder"


def replay_data_dir(run_dir: Path, instance: str) -> Path:
    """Where replay instance `instance` (replay, replay-1, ...) of a run keeps its tables (--replay-durable)."""
    return run_dir / REPLAY_DIR / instance


def refuse_a_new_run_over_checkpoints(run_dir: Path) -> None:
    """ValueError, quoting `run_dir`, if it holds an earlier run's checkpoints or replay data: a new run there
    would resume the learner's and the edge's weights and replay's chunks under a fresh curve (or fail on a
    different network), so it must either be `--resume`d or go to another directory."""
    for state, what in ((run_dir / CHECKPOINTS_DIR, "checkpoints"), (run_dir / REPLAY_DIR, "replay data")):
        if state.is_dir() and any(path.is_file() for path in state.rglob("*")):
            raise ValueError(
                f"--run-dir {run_dir} holds an earlier run's {what} ({state}): go on with "
                f"`splitrl up --resume {run_dir}`, or start this run in another --run-dir (or remove {run_dir})"
            )


def load_settings(run_dir: Path) -> dict[str, Any]:
    """The settings a run started with; ValueError if `run_dir` is not a run directory."""
    path = run_dir / SETTINGS_FILE
    try:
        settings = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{run_dir} is not a run directory of `splitrl up` (no {SETTINGS_FILE})") from None
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{path} holds no settings object")
    return settings


def load_curve(run_dir: Path) -> list[dict[str, float]]:
    """The curve so far; a line cut short by a crash mid-write ends it."""
    path = run_dir / CURVE_FILE
    points: list[dict[str, float]] = []
    if not path.exists():
        return points
    for line in path.read_text().splitlines():
        try:
            point = json.loads(line)
        except json.JSONDecodeError:
            break
        if not (isinstance(point, dict) and all(isinstance(point.get(key), int | float) for key in CURVE_KEYS)):
            break
        points.append(point)
    return points


def append_curve(run_dir: Path, point: dict[str, float]) -> None:
    with (run_dir / CURVE_FILE).open("a") as file:
        file.write(json.dumps(point) + "\n")


def zero_point() -> dict[str, float]:
    return dict.fromkeys(CURVE_KEYS, 0.0)


def shifted(point: dict[str, float], offset: dict[str, float]) -> dict[str, float]:
    """`point` of this segment, made cumulative over the run by adding the previous segments' last point; its
    `last_update_at` (a time, not a count) is the later of the two, so a resumed run's points show when the
    last of their updates completed even before the new segment's first."""
    made_cumulative = {**point, **{key: point[key] + offset[key] for key in CURVE_KEYS}}
    if "last_update_at" in point:
        made_cumulative["last_update_at"] = max(point["last_update_at"], offset.get("last_update_at", 0.0))
    return made_cumulative


def append_eval(run_dir: Path, result: dict[str, Any]) -> None:
    with (run_dir / EVALS_FILE).open("a") as file:
        file.write(json.dumps(result) + "\n")


def load_evals(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / EVALS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
