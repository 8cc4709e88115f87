"""How a run ends: the progress watch, outputs that stop with a warning, summary.json written into the room
reserved for it (thinned if even that is short)."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from splitrl.run import outcome
from splitrl.run.outcome import BestEffort, NoProgress, ProgressWatch


def supervisor(run_dir: Path, silent=()) -> SimpleNamespace:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    for name in ("replay", "inference", "learner", "learner-1"):
        (run_dir / "logs" / f"{name}.log").write_text(f"{name} line 1\n{name} last line\n")
    children = dict.fromkeys(("replay", "inference", "learner", "learner-1"))
    return SimpleNamespace(run_dir=run_dir, children=children, silent=set(silent))


def point(env_steps: float, updates: float) -> dict[str, float]:
    return {"env_steps": env_steps, "updates": updates}


def test_a_run_whose_env_steps_stop_ends_naming_the_silent_service_and_its_log(tmp_path):
    watch, sup = ProgressWatch(10), supervisor(tmp_path, silent={"inference"})
    watch.check(point(100, 1), 0.0, sup)
    watch.check(point(200, 2), 5.0, sup)
    watch.check(point(200, 3), 14.0, sup)  # 9 s without a step: not yet
    with pytest.raises(NoProgress) as stopped:
        watch.check(point(200, 4), 15.5, sup)
    message = str(stopped.value)
    assert message.startswith("no progress: env steps stayed at 200 for 10 s (--progress-timeout-s 10)")
    assert "not answering /metrics: inference" in message and "inference last line" in message
    assert "replay last line" not in message
    assert stopped.value.reason == "no progress"


def test_stalled_updates_name_the_learners_when_every_service_answers(tmp_path):
    watch, sup = ProgressWatch(3), supervisor(tmp_path)
    for second in range(4):
        watch.check(point(100 * second, 7), float(second), sup)
    with pytest.raises(NoProgress, match="learner updates stayed at 7 for 4 s") as stopped:
        watch.check(point(500, 7), 4.0, sup)
    assert "learner-1 last line" in str(stopped.value) and "replay last line" not in str(stopped.value)


def test_a_zero_timeout_never_ends_a_run(tmp_path):
    watch, sup = ProgressWatch(0), supervisor(tmp_path)
    for second in range(100):
        watch.check(point(0, 0), second * 1000.0, sup)
    with pytest.raises(ValueError, match="-1"):
        ProgressWatch(-1)


def test_an_output_the_disk_refuses_stops_once_with_a_warning(capsys):
    outputs, calls = BestEffort(), []

    def full():
        calls.append(1)
        raise OSError(errno.ENOSPC, "No space left on device")

    assert outputs("TensorBoard", full) is None
    assert outputs("TensorBoard", full) is None
    assert calls == [1]  # not tried again
    assert outputs("curve.jsonl", lambda: 5) == 5
    err = capsys.readouterr().err
    assert err.count("TensorBoard stopped: [Errno 28] No space left on device; the run goes on without it") == 1


def test_the_summary_uses_the_reserved_room_and_leaves_no_reserve(tmp_path):
    (tmp_path / "summary.json").write_text('{"end": "an earlier segment"}')
    outcome.start_summary(tmp_path)
    assert not (tmp_path / "summary.json").exists()  # it no longer says how the run ended
    assert (tmp_path / outcome.RESERVE_FILE).stat().st_size == outcome.SUMMARY_RESERVE
    summary = {"end": outcome.ending("no progress", "why"), "curve": [{"env_steps": 1.0}]}
    assert outcome.write_summary(tmp_path, summary)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_summary_too_large_for_the_disk_is_written_with_a_thinned_curve(tmp_path, monkeypatch, capsys):
    written = []

    def small_disk(path, write, **_):
        class File:
            def write(self, data):
                if len(data) > 100_000:
                    raise OSError(errno.ENOSPC, "No space left on device")
                written.append(json.loads(data))

        write(File())

    monkeypatch.setattr(outcome, "write_atomic", small_disk)
    curve = [{"env_steps": float(i)} for i in range(5000)]
    assert outcome.write_summary(tmp_path, {"curve": curve})
    (summary,) = written
    assert summary["curve_thinned_from"] == 5000 and len(summary["curve"]) <= outcome.THINNED_CURVE_POINTS + 1
    assert summary["curve"][0] == curve[0] and summary["curve"][-1] == curve[-1]
    assert "thinned curve" in capsys.readouterr().err
