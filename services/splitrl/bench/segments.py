"""Training a run to a budget in segments, each followed by an evaluation: the loop every learning-bench row uses.

The run directory is the only state (curve.jsonl and evals.jsonl, splitrl.run.files), so an
interrupted loop resumes where it stopped: a segment end not yet evaluated is evaluated first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from splitrl.run import files as run_dir_files


@dataclass(frozen=True)
class Budget:
    """Agent steps to train to, per segment, and episodes per evaluation (the last one: `final_episodes`).

    `policies`: how each segment end is evaluated, in order: True plays the most likely action (argmax),
    False samples the policy's actions, on the same episodes.
    """

    total_steps: int
    segment_steps: int
    eval_episodes: int
    final_episodes: int
    policies: tuple[bool, ...] = (True,)

    @classmethod
    def of_frames(
        cls,
        frames: int,
        segment_frames: int,
        action_repeat: int,
        eval_episodes: int,
        final_episodes: int,
        *,
        sampled_evals: bool = False,
    ) -> Budget:
        """Frame budgets (agent steps x action repeat) as agent steps; the total rounded up. `sampled_evals`: each
        argmax evaluation is followed by one that samples."""
        return cls(
            -(-frames // action_repeat),
            max(1, segment_frames // action_repeat),
            eval_episodes,
            final_episodes,
            (True, False) if sampled_evals else (True,),
        )


def run_segments(
    run_dir: Path,
    budget: Budget,
    evaluate: Callable[[int, bool], None],
    train_to: Callable[[dict[str, float], int], None],
) -> None:
    """Until `budget.total_steps`: `evaluate(episodes, deterministic)` the curve's last point with each of
    `budget.policies` that no evaluation there has played, else `train_to(last_point, target_steps)` the next
    segment end (last_point: the curve's, or zeros)."""
    while True:
        curve = run_dir_files.load_curve(run_dir)
        last = curve[-1] if curve else run_dir_files.zero_point()
        done = int(last["env_steps"])
        played = {(e.get("env_steps"), e.get("deterministic", True)) for e in run_dir_files.load_evals(run_dir)}
        missing = [policy for policy in budget.policies if (done, policy) not in played]
        if curve and missing:
            evaluate(budget.final_episodes if done >= budget.total_steps else budget.eval_episodes, missing[0])
            continue
        if done >= budget.total_steps:
            return
        train_to(last, min(budget.total_steps, (done // budget.segment_steps + 1) * budget.segment_steps))
