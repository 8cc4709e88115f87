"""`splitrl bench throughput --rounds N`: the rounds' order, the ratios taken within each round, the table."""

from __future__ import annotations

import json
import math

import pytest

from splitrl.bench import rounds, sb3_reference, throughput
from splitrl.bench.baseline import BaselineResult, steady_span, update_pace
from splitrl.bench.rounds import RunRate, TrainingRound, ratio, round_lines, round_order, stacks_run_first
from splitrl.bench.settings import ThroughputBenchSettings
from splitrl.bench.throughput_report import StackResult, ThroughputReport, as_json, render_markdown
from tests.bench_reports import empty_report


def test_round_one_keeps_the_benchs_order_and_the_rounds_alternate() -> None:
    assert [stacks_run_first(number) for number in range(1, 6)] == [False, True, False, True, False]
    with pytest.raises(ValueError, match="numbered from 1, got 0"):
        stacks_run_first(0)


def test_a_ratio_is_of_frames_and_of_updates_per_second() -> None:
    stack, reference = RunRate(3000, 10.0, 6, 4, 8.0), RunRate(2000, 10.0, 3, 2, 8.0)
    assert ratio(stack, reference) == pytest.approx((1.5, 2.0))
    for unpaced in (RunRate(2000, 10.0, 1), RunRate(2000, 10.0, 0)):  # either side without a pace: NaN
        for frames, updates in (ratio(stack, unpaced), ratio(unpaced, reference)):
            assert frames > 0 and math.isnan(updates)


def test_the_learners_pace_runs_from_the_first_to_the_last_update_completed_in_the_window() -> None:
    # (steps, seconds, updates): an update every 2 s from 3 s on, the envs 100 steps/s ahead of it all along.
    points = [(100 * t, float(t), max(0, (t - 1) // 2)) for t in range(0, 21)]
    first, last = steady_span(points, warmup_fraction=0.2)  # from 4 s (400 steps) to 20 s
    assert (first[1], last[1]) == (4.0, 20.0) and last[2] - first[2] == 8  # 8 updates counted in 16 s: 0.5/s
    assert update_pace(points, first, last) == (7, 14.0)  # seen at 5 s (update 2) and 19 s (update 9): 0.5/s
    # A learner that falls behind the envs at the end of the window: counting updates against the window's
    # steps says 7 in 16 s (0.44/s), its own pace stays 0.5/s (6 updates from 5 s to 17 s).
    behind = [(s, t, min(u, 8)) for s, t, u in points]
    behind_first, behind_last = steady_span(behind, warmup_fraction=0.2)
    assert behind_last[2] - behind_first[2] == 7
    assert update_pace(behind, behind_first, behind_last) == (6, 12.0)
    assert update_pace(points[:6], first, points[5]) == (0, 0.0)  # one update completed in the window: no pace
    with pytest.raises(ValueError, match="must be points of"):
        update_pace(points, (400, 4.0, 1), last)  # equal to the window's first point, but not one of `points`


def test_the_learners_own_completion_times_time_its_pace_exactly() -> None:
    # A point every 2 s (a stack's curve), an update completing every 1.5 s from 0.7 s on, and each point
    # carrying, fourth, when the latest update shown completed (last_update_at: the learner's clock).
    def completed(t: float) -> int:
        return 0 if t < 0.7 else int((t - 0.7) // 1.5) + 1

    points = [(100 * t, float(t), completed(t), 0.7 + 1.5 * (completed(t) - 1)) for t in range(0, 21, 2)]
    first, last = steady_span(points, warmup_fraction=0.2)  # from 4 s to 20 s
    updates, seconds = update_pace(points, first, last, completed_at=3)
    assert updates / seconds == pytest.approx(1 / 1.5)  # exact: updates 4 (at 5.2 s) to 13 (at 18.7 s)
    assert (updates, seconds) == (9, pytest.approx(13.5))
    # Timed by when points showed them instead (6 s and 20 s), the same updates come out 4% slow.
    assert update_pace(points, first, last) == (9, 14.0)


def test_a_rate_uses_the_learners_pace_and_has_none_without_it() -> None:
    assert RunRate(steps=1000, seconds=10.0, updates=3).updates_per_s is None  # not the 3 counted in the window
    assert RunRate(1000, 10.0, 3, paced_updates=2, paced_seconds=8.0).updates_per_s == pytest.approx(0.25)
    paced = BaselineResult(1000, 10.0, None, None, None, updates=3, paced_updates=2, paced_seconds=8.0)
    assert RunRate.of(paced) == RunRate(1000, 10.0, 3, 2, 8.0)


def _round(number: int, sb3_steps: int, cloud_steps: int) -> TrainingRound:
    """sb3-ppo and a cloud stack over 10 s each, one update per 500 agent steps in both (their paces: the
    updates less one over 10 s less 500 steps' time)."""

    def paced(steps: int) -> dict[str, float]:
        return {"paced_updates": steps // 500 - 1, "paced_seconds": 10.0 * (1 - 500 / steps)}

    sb3 = BaselineResult(sb3_steps, 10.0, None, None, None, updates=sb3_steps // 500, **paced(sb3_steps))
    cloud = StackResult(
        "cloud",
        cloud_steps,
        10.0,
        12.0,
        {},
        4.0,
        1.0,
        1.0,
        0,
        {},
        "r",
        updates=cloud_steps // 500,
        **paced(cloud_steps),
    )
    return TrainingRound.of(number, stacks_run_first(number), {"sb3-ppo": sb3}, {"cloud": cloud})


def test_the_table_shows_each_rounds_ratios_then_their_median_and_range() -> None:
    # Round 2 ran on a slower stretch for both: its ratio stays what it is, taken within the round.
    table = round_lines([_round(1, 2000, 3000), _round(2, 1000, 1500), _round(3, 2000, 2500)], action_repeat=4)
    text = "\n".join(table)
    assert "Round by round (3 rounds; even rounds ran in the reverse order, stacks first" in text
    assert "| round | ran first | sb3-ppo frames/s | cloud x sb3-ppo |" in text
    assert "| 1 | references | 800.0 | 1.50 / 1.50 |" in text  # 2,000 agent steps in 10 s x action repeat 4
    assert "| 2 | stacks | 400.0 | 1.50 / 1.50 |" in text
    assert "| 3 | references | 800.0 | 1.25 / 1.25 |" in text
    assert "| median | | 800.0 | 1.50 / 1.50 |" in text
    assert "| range | | 400.0-800.0 | 1.25-1.50 / 1.25-1.50 |" in text


def test_a_round_without_a_pace_shows_none_and_leaves_the_median_and_range_to_the_others() -> None:
    unpaced = TrainingRound(2, True, {"sb3-ppo": RunRate(2000, 10.0, 4)}, {"cloud": RunRate(3000, 10.0, 6)})
    text = "\n".join(round_lines([_round(1, 2000, 3000), unpaced, _round(3, 2000, 2500)], action_repeat=1))
    assert "| 2 | stacks | 200.0 | 1.50 / - |" in text
    assert "| median | | 200.0 | 1.50 / 1.38 |" in text  # the updates' median of rounds 1 and 3 alone
    assert "| range | | 200.0-200.0 | 1.25-1.50 / 1.25-1.50 |" in text
    never = TrainingRound(1, False, {"sb3-ppo": RunRate(2000, 10.0, 1)}, {"cloud": RunRate(3000, 10.0, 1)})
    assert "| median | | 200.0 | 1.50 / - |" in "\n".join(round_lines([never, never], action_repeat=1))


def test_even_rounds_run_exactly_the_reverse_of_odd_ones() -> None:
    order = round_order(1, ["sync-ppo", "sb3-ppo"], ["cloud", "split"])
    assert order == [("reference", "sync-ppo"), ("reference", "sb3-ppo"), ("stack", "cloud"), ("stack", "split")]
    assert round_order(2, ["sync-ppo", "sb3-ppo"], ["cloud", "split"]) == order[::-1]
    assert round_order(3, ["sync-ppo", "sb3-ppo"], ["cloud", "split"]) == order
    # Over a pair of rounds every run's mean place is the same: a steady drift weighs on each alike.
    places = {run: (order.index(run) + order[::-1].index(run)) / 2 for run in order}
    assert set(places.values()) == {1.5}


def test_no_table_for_one_round_or_without_a_reference_or_a_stack() -> None:
    assert round_lines([_round(1, 2000, 3000)], action_repeat=1) == []
    alone = TrainingRound(1, False, {}, {"cloud": RunRate(1000, 1.0, 2)})
    assert round_lines([alone, alone], action_repeat=1) == []


def test_the_report_carries_every_round_in_its_json_and_its_markdown() -> None:
    report = empty_report()
    report.baselines = [BaselineResult(1000, 1.0, 700.0, 300.0)]
    report.rounds = [_round(1, 2000, 3000), _round(2, 1000, 1500)]
    report.trained = {"sb3-ppo": BaselineResult(2000, 10.0, None, None, None, updates=4)}
    report.stacks = [StackResult("cloud", 3000, 10.0, 12.0, {}, 4.0, 1.0, 1.0, 0, {}, "r", updates=6)]
    assert "| median | | 150.0 | 1.50 / 1.50 |" in render_markdown(report)  # 200 and 100 frames/s
    figures = json.loads(json.dumps(as_json(report)))
    assert [one["stacks_first"] for one in figures["rounds"]] == [False, True]
    cloud = figures["rounds"][1]["stacks"]["cloud"]
    assert cloud["steps"] == 1500 and cloud["updates"] == 3 and cloud["paced_updates"] == 2
    assert cloud["steps_per_s"] == pytest.approx(150.0) and cloud["updates_per_s"] == pytest.approx(0.3)


def test_the_bench_runs_each_round_in_its_order_and_keeps_round_ones_details(monkeypatch, tmp_path) -> None:
    ran: list[str] = []

    def reference(name: str):
        def measure(run, warmup_fraction: float) -> BaselineResult:
            ran.append(name)
            return BaselineResult(1000 + len(ran), 1.0, 1.0, 1.0, 1.0, updates=2, wall_seconds=1.0, total_steps=1000)

        return measure

    def stack(settings, mode, run_dir) -> StackResult:
        ran.append(f"{mode} in {run_dir.relative_to(tmp_path)}")
        return StackResult(mode, 1500 + len(ran), 1.0, 1.0, {}, 1.0, 0.0, 0.0, 0, {}, str(run_dir), updates=3)

    monkeypatch.setattr(throughput, "run_baseline", reference("act-only"))
    monkeypatch.setattr(throughput, "run_sync_ppo", reference("sync-ppo"))
    monkeypatch.setattr(sb3_reference, "measure_sb3", reference("sb3-ppo"))
    monkeypatch.setattr(throughput, "run_stack", stack)
    bench = ThroughputBenchSettings(
        env="splitrl/Catch-v0", modes=["cloud", "split"], sb3_reference=True, skip_link=True, rounds=3,
        reference_torch_threads=1, out=tmp_path,
    )  # fmt: skip
    report = ThroughputReport(settings=json.loads(bench.model_dump_json()))
    throughput._measure_all(bench, throughput.run_settings(bench, "cloud"), report)
    assert ran == [
        "act-only",
        *("sync-ppo", "sb3-ppo", "cloud in runs/cloud", "split in runs/split"),
        *("split in runs/round-2/split", "cloud in runs/round-2/cloud", "sb3-ppo", "sync-ppo"),
        *("sync-ppo", "sb3-ppo", "cloud in runs/round-3/cloud", "split in runs/round-3/split"),
        "act-only",
    ]
    assert [one.number for one in report.rounds] == [1, 2, 3]
    assert [one.stacks_first for one in report.rounds] == [False, True, False]
    # The detailed tables show round 1, whose rates are its rounds' first.
    assert list(report.trained) == ["sync-ppo", "sb3-ppo"] and report.trained["sync-ppo"].steps == 1002
    assert [r.mode for r in report.stacks] == ["cloud", "split"] and report.stacks[0].steps == 1504
    assert report.rounds[0].stacks["cloud"] == rounds.RunRate.of(report.stacks[0])
    assert report.rounds[1].references["sb3-ppo"].steps == 1008


@pytest.mark.parametrize("bad", [0, 21])
def test_rounds_outside_1_to_20_are_refused_quoting_the_value(bad: int) -> None:
    with pytest.raises(ValueError, match="rounds") as refused:
        ThroughputBenchSettings(rounds=bad)
    assert f"input_value={bad}" in str(refused.value)


def test_a_bench_that_fails_in_a_later_round_writes_the_rounds_it_completed(monkeypatch, tmp_path, capsys) -> None:
    stacks_run = 0

    def reference(run, warmup_fraction: float) -> BaselineResult:
        return BaselineResult(1000, 1.0, 1.0, 1.0, 1.0, updates=2, paced_updates=1, paced_seconds=0.5)

    def stack(settings, mode, run_dir) -> StackResult:
        nonlocal stacks_run
        stacks_run += 1
        if stacks_run == 3:
            raise RuntimeError("splitrl up --mode cloud failed (exit 1)")
        return StackResult(mode, 1500, 1.0, 1.0, {}, 1.0, 0.0, 0.0, 0, {}, str(run_dir), updates=3)

    monkeypatch.setattr(throughput, "run_baseline", reference)
    monkeypatch.setattr(throughput, "run_sync_ppo", reference)
    monkeypatch.setattr(throughput, "run_stack", stack)
    bench = ThroughputBenchSettings(
        env="splitrl/Catch-v0", modes=["cloud"], skip_link=True, rounds=4, reference_torch_threads=1, out=tmp_path
    )
    assert throughput.run_throughput_bench(bench) == 1
    assert "splitrl bench throughput: splitrl up --mode cloud failed (exit 1)" in capsys.readouterr().err
    figures = json.loads((tmp_path / "throughput.json").read_text())
    assert [one["number"] for one in figures["rounds"]] == [1, 2]
    assert figures["stopped"] == "round 3: splitrl up --mode cloud failed (exit 1)"
    table = (tmp_path / "throughput.md").read_text()
    assert "**Stopped early, in round 3: splitrl up --mode cloud failed (exit 1)**" in table
    assert "| median | |" in table  # the two rounds' ratios


def test_a_bench_that_fails_in_its_first_round_writes_nothing(monkeypatch, tmp_path) -> None:
    def failing(settings, mode, run_dir) -> StackResult:
        raise RuntimeError("splitrl up --mode cloud failed (exit 1)")

    monkeypatch.setattr(throughput, "run_baseline", lambda run, warmup: BaselineResult(1000, 1.0, 1.0, 1.0))
    monkeypatch.setattr(throughput, "run_stack", failing)
    bench = ThroughputBenchSettings(
        env="splitrl/Catch-v0", modes=["cloud"], skip_link=True, sync_ppo=False, rounds=2, out=tmp_path
    )
    assert throughput.run_throughput_bench(bench) == 1
    assert not (tmp_path / "throughput.json").exists()
