"""splitrl.cli.plots and `splitrl plot`: one readable PNG from a run summary, whatever the run produced."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread

from splitrl.cli.main import main
from splitrl.cli.plots import plot_run
from splitrl.run.summary import curve_bins, mean_return_between

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _links() -> dict[str, Any]:
    def ends(sent: int) -> dict[str, dict[str, int]]:
        counts = {"bytes": sent, "messages": sent // 100, "elements": sent // 4}
        return {"sent": counts, "received": dict(counts)}

    return {
        "environment-encoder": {"rollout": {"observation": ends(80_000_000)}},
        "encoder-inference": {
            "rollout": {"activation": ends(8_200_000), "action": ends(40_000)},
            "training": {"gradient": ends(3_000_000)},
        },
        "inference-replay": {"rollout": {"trajectory": ends(9_000_000)}, "training": {"ack": ends(0)}},
        "learner-encoder": {"weights": {"weights": ends(1_500_000)}, "training": {"batch": ends(600_000)}},
    }


def _summary(curve: list[dict[str, float]]) -> dict[str, Any]:
    last = curve[-1] if curve else {"env_steps": 0, "episodes": 0, "return_sum": 0.0, "updates": 0}
    return {
        "settings": {"mode": "split", "env": "CarRacing-v3", "steps": 20_000},
        "env_steps": last["env_steps"],
        "wall_seconds": len(curve),
        "episodes": last["episodes"],
        "mean_episode_return": last["return_sum"] / last["episodes"] if last["episodes"] else None,
        "learner_updates": last["updates"],
        "wan_bytes": {"rollout": 8_240_000, "training": 3_600_000, "weights": 1_500_000},
        "links": _links(),
        "curve": curve,
    }


def _rising_curve(seconds: int = 100) -> list[dict[str, float]]:
    """One episode finished per second, its return rising from -50 by 1 per episode."""
    curve, return_sum = [], 0.0
    for t in range(1, seconds + 1):
        return_sum += -50.0 + t
        curve.append({"env_steps": 200.0 * t, "episodes": float(t), "return_sum": return_sum, "updates": t // 10})
    return curve


def _assert_png(path: Path) -> None:
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    image = imread(path)
    height, width = image.shape[:2]
    assert width >= 600 and height >= 300
    assert not np.all(image == image[0, 0]), "the image is a single colour"


def test_curve_bins_have_enough_episodes_and_follow_the_rise():
    bins = curve_bins(_rising_curve())
    assert len(bins) == 5  # 100 episodes, 20 a bin
    steps, returns = zip(*bins, strict=True)
    assert steps[-1] == 20_000
    assert list(returns) == sorted(returns)
    assert returns[0] == pytest.approx(np.mean([-50 + t for t in range(1, 21)]))


def test_curve_bins_of_a_short_run_merge_the_remainder():
    curve = _rising_curve(seconds=7)
    bins = curve_bins(curve)
    assert bins and bins[-1][0] == curve[-1]["env_steps"]
    assert sum(1 for _ in bins) <= 7
    assert curve_bins([]) == []
    assert curve_bins([{"env_steps": 100.0, "episodes": 0.0, "return_sum": 0.0, "updates": 0.0}]) == []


@pytest.mark.parametrize(
    "curve",
    [
        _rising_curve(),
        [{"env_steps": 100.0 * t, "episodes": 0.0, "return_sum": 0.0, "updates": 0.0} for t in range(5)],
        [],
    ],
    ids=["rising", "no-episodes", "empty-curve"],
)
def test_plot_run_writes_a_png(tmp_path: Path, curve: list[dict[str, float]]):
    out = plot_run(_summary(curve), tmp_path / "sub" / "learning.png")
    assert out == tmp_path / "sub" / "learning.png"
    _assert_png(out)


def test_evaluations_are_drawn_on_the_curve(tmp_path: Path):
    evaluations = [
        {"env_steps": 10_000.0, "mean": 20.0, "std": 5.0},
        {"env_steps": 20_000.0, "mean": 45.0, "std": 3.0},
        {"env_steps": None, "mean": 0.0, "std": 0.0},  # a run evaluated before it had a curve: not placed
    ]
    plain = plot_run(_summary(_rising_curve()), tmp_path / "plain.png")
    with_evals = plot_run(_summary(_rising_curve()), tmp_path / "evals.png", evaluations)
    _assert_png(with_evals)
    assert not np.array_equal(imread(plain), imread(with_evals)), "the evaluation markers must show"


def test_splitrl_plot_draws_the_run_dirs_evaluations(tmp_path: Path):
    (tmp_path / "summary.json").write_text(json.dumps(_summary(_rising_curve())))
    assert main(["plot", str(tmp_path)]) == 0
    before = imread(tmp_path / "learning.png")
    (tmp_path / "evals.jsonl").write_text(json.dumps({"env_steps": 10_000.0, "mean": 20.0, "std": 5.0}) + "\n")
    assert main(["plot", str(tmp_path)]) == 0
    assert not np.array_equal(before, imread(tmp_path / "learning.png"))


def test_plot_run_without_links_or_settings(tmp_path: Path):
    _assert_png(plot_run({"curve": _rising_curve()}, tmp_path / "bare.png"))


def test_splitrl_plot_redraws_from_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "summary.json").write_text(json.dumps(_summary(_rising_curve())))
    assert main(["plot", str(tmp_path)]) == 0
    _assert_png(tmp_path / "learning.png")
    assert "learning.png" in capsys.readouterr().out


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]"], ids=["missing", "invalid", "not-an-object"])
def test_splitrl_plot_without_a_usable_summary_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None
):
    if content is not None:
        (tmp_path / "summary.json").write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", str(tmp_path)])
    assert exit_info.value.code == 2
    assert str(tmp_path / "summary.json") in capsys.readouterr().err
    assert not (tmp_path / "learning.png").exists()


def test_mean_return_between_takes_the_episodes_finished_inside_the_window():
    curve = [
        {"env_steps": 0.0, "episodes": 0.0, "return_sum": 0.0, "updates": 0.0},
        {"env_steps": 100.0, "episodes": 10.0, "return_sum": -5.0, "updates": 0.0},
        {"env_steps": 200.0, "episodes": 20.0, "return_sum": 0.0, "updates": 1.0},
        {"env_steps": 300.0, "episodes": 20.0, "return_sum": 0.0, "updates": 2.0},
    ]
    assert mean_return_between(curve, 0, 100) == (-0.5, 10)
    assert mean_return_between(curve, 100, 300) == (0.5, 10)
    assert mean_return_between(curve, 200, 300) == (None, 0)  # no episode finished
    assert mean_return_between(curve, 250, 300) == (None, 0)  # one sample: no interval
