"""The learning bench's segment loop and its report, with stand-ins for training and evaluating."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitrl.bench.learning_report import evaluation_table_lines, write_learning_report
from splitrl.bench.segments import Budget, run_segments
from splitrl.run import files as run_dir_files


def fake_run(run_dir: Path, budget: Budget) -> list[tuple[str, int, object]]:
    """Run the loop with a trainer that appends a curve point at each target and an evaluator that records."""
    calls: list[tuple[str, int, object]] = []

    def evaluate(episodes: int, deterministic: bool) -> None:
        done = run_dir_files.load_curve(run_dir)[-1]["env_steps"]
        calls.append(("eval", int(done), (episodes, deterministic)))
        run_dir_files.append_eval(
            run_dir, {"env_steps": done, "episodes": episodes, "deterministic": deterministic, "mean": 1.0}
        )

    def train_to(last: dict[str, float], target: int) -> None:
        calls.append(("train", target, int(last["env_steps"])))
        run_dir_files.append_curve(run_dir, run_dir_files.zero_point() | {"env_steps": float(target)})

    run_segments(run_dir, budget, evaluate, train_to)
    return calls


def test_each_segment_end_is_evaluated_with_argmax_then_sampled_actions(tmp_path):
    budget = Budget.of_frames(800, 400, 4, eval_episodes=3, final_episodes=7, sampled_evals=True)
    assert budget.policies == (True, False) and (budget.total_steps, budget.segment_steps) == (200, 100)
    assert fake_run(tmp_path, budget) == [
        ("train", 100, 0),
        ("eval", 100, (3, True)),
        ("eval", 100, (3, False)),
        ("train", 200, 100),
        ("eval", 200, (7, True)),  # the final evaluation plays final_episodes, both ways
        ("eval", 200, (7, False)),
    ]
    assert fake_run(tmp_path, budget) == []  # all done: nothing again


def test_a_point_evaluated_only_by_argmax_gets_its_sampled_evaluation_on_resume(tmp_path):
    """A run evaluated before sampled evaluations existed (or killed between the two) resumes with the missing one."""
    run_dir_files.append_curve(tmp_path, run_dir_files.zero_point() | {"env_steps": 100.0})
    run_dir_files.append_eval(tmp_path, {"env_steps": 100.0, "episodes": 3, "deterministic": True, "mean": 1.0})
    budget = Budget.of_frames(800, 400, 4, eval_episodes=3, final_episodes=7, sampled_evals=True)
    assert fake_run(tmp_path, budget)[:2] == [("eval", 100, (3, False)), ("train", 200, 100)]
    argmax_only = Budget.of_frames(400, 400, 4, eval_episodes=3, final_episodes=7)
    assert argmax_only.policies == (True,)


def result(evals: list[dict[str, object]]) -> dict[str, object]:
    return {
        "row": "cloud:h264",
        "seed": 0,
        "action_repeat": 4,
        "frames": 800,
        "wall_seconds": 60.0,
        "wan_bytes": 1000.0,
        "wan_bytes_per_frame": 1.25,
        "train_return_last_20pct": 500.0,
        "last_segment_shadow": None,
        "curve": [],
        "evals": evals,
    }


def scores(frames: int, deterministic: bool, mean: float, episodes: int = 20) -> dict[str, object]:
    return {
        "env_steps": frames / 4,  # curve points count steps as floats
        "frames": frames * 1.0,
        "episodes": episodes,
        "deterministic": deterministic,
        "mean": mean,
        "iqm": mean + 1,
        "std": 10.0,
        "out_of_time": 12 if deterministic else 3,
        "at_threshold": 0 if deterministic else 1,
    }


def test_the_report_puts_argmax_and_sampled_scores_side_by_side(tmp_path):
    evals = [scores(400, True, 300.0), scores(400, False, 350.0), scores(800, True, -3.9, 100)]
    evals.append(scores(800, False, 594.8, 100))
    write_learning_report([result(evals)], tmp_path)
    table = (tmp_path / "learning.md").read_text()
    final = "| cloud:h264 | 0 | 800 | 1.0 | 1,000 | 1.2 | 500.0 | 100 | -3.9 | -2.9 | 10.0 | 594.8 | 595.8 | 10.0 |"
    assert final in table
    assert "| cloud:h264 | 0 | 400 | 20 | 300.0 | 301.0 | 10.0 | 350.0 | 351.0 | 10.0 | 12 / 3 | 0 / 1 |" in table
    assert (tmp_path / "learning.png").stat().st_size > 0
    argmax_only = evaluation_table_lines([result([scores(400, True, 300.0)])])
    assert argmax_only[-1] == "| cloud:h264 | 0 | 400 | 20 | 300.0 | 301.0 | 10.0 | - | - | - | 12 / - | 0 / - |"
    recorded_before = {k: v for k, v in scores(400, True, 300.0).items() if k not in ("out_of_time", "at_threshold")}
    assert evaluation_table_lines([result([recorded_before])])[-1].endswith("| - / - | - / - |")
    assert evaluation_table_lines([result([])]) == []


def test_the_frame_budget_defaults_to_the_recipes_own_length(tmp_path):
    """Without --frames a run stops where the recipe's schedules end (its steps x its action repeat); the
    shipped CarRacing recipe's is 2M frames."""
    from splitrl.bench.learning import repeat_and_frames
    from splitrl.bench.settings import LearningBenchSettings

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("env: CarRacing-v3\naction_repeat: 4\nsteps: 300\nlr_anneal_steps: 300\n")
    assert repeat_and_frames(LearningBenchSettings(config=recipe)) == (4, 1200)
    assert repeat_and_frames(LearningBenchSettings(config=recipe, frames=5000)) == (4, 5000)
    shipped = Path(__file__).resolve().parents[2] / "configs" / "carracing.yaml"
    assert repeat_and_frames(LearningBenchSettings(config=shipped)) == (4, 2_000_000)
    recipe.write_text("env: CarRacing-v3\n")  # no length of its own: the bench must be told one
    with pytest.raises(ValueError, match="sets no steps: give --frames"):
        repeat_and_frames(LearningBenchSettings(config=recipe))
    assert repeat_and_frames(LearningBenchSettings(config=recipe, frames=800)) == (1, 800)


def test_a_budget_past_the_recipes_learning_rate_schedule_is_refused_before_anything_trains(tmp_path, capsys):
    """Frames past the recipe's lr_anneal_steps would train at a rate of 0; a resumed run takes the recipe's
    schedules, so a copy with longer ones goes on from the same runs."""
    from splitrl.bench.learning import run_learning_bench, schedule_of
    from splitrl.bench.settings import LearningBenchSettings

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("env: CarRacing-v3\naction_repeat: 4\nsteps: 300\nlr_anneal_steps: 300\n")
    too_far = LearningBenchSettings(config=recipe, frames=1204, out=tmp_path / "out")
    assert run_learning_bench(too_far) == 2
    refusal = capsys.readouterr().err
    assert "--frames 1,204 is 301 agent steps at the recipe's action repeat 4" in refusal
    assert "steps=301 goes past lr_anneal_steps=300" in refusal
    assert not (tmp_path / "out").exists()
    assert schedule_of(too_far) == {"lr_anneal_steps": 300}
    recipe.write_text("env: CarRacing-v3\nlr_anneal_steps: 400\nentropy_anneal_steps: 400\n")
    assert schedule_of(too_far) == {"lr_anneal_steps": 400, "entropy_anneal_steps": 400}
    recipe.write_text("env: CarRacing-v3\nlr_anneal_steps: null\n")  # null: the run keeps its own
    assert schedule_of(too_far) == {}
