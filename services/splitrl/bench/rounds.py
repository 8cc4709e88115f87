"""`splitrl bench throughput --rounds N`: the training comparison run N times, its ratios round by round.

On a shared 2-core machine one run's rate swings 20-30% between runs half an hour apart (docs/throughput),
so one round's stack-to-SB3 ratio can land either side of a target. Each round trains every reference and
every stack mode once; even rounds run the stacks first and odd rounds the references first, so a machine
that slows (or speeds up) over the bench weighs on both sides of the ratios alike. A ratio is taken within
its round only: the median and range over rounds are the verdict, not a ratio of medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


class _Timed(Protocol):
    """A training run's rate window (BaselineResult, StackResult; read-only, as their frozen fields are)."""

    @property
    def steps(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def updates(self) -> int: ...
    @property
    def paced_updates(self) -> int: ...
    @property
    def paced_seconds(self) -> float: ...


@dataclass(frozen=True)
class RunRate:
    """One training run's rate window: `steps` agent steps and `updates` PPO updates in `seconds` (after the
    warm-up), and the learner's pace inside it (baseline.update_pace): `paced_updates` from the first to the
    last update completed in the window, in `paced_seconds` (0: fewer than 2 completed). Agent steps/s is env
    frames/s over the action repeat, the same in every run of a bench."""

    steps: int
    seconds: float
    updates: int
    paced_updates: int = 0
    paced_seconds: float = 0.0

    @classmethod
    def of(cls, run: _Timed) -> RunRate:
        return cls(run.steps, run.seconds, run.updates, run.paced_updates, run.paced_seconds)

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def updates_per_s(self) -> float:
        """Update to update where two or more completed in the window; else the updates counted in it."""
        if self.paced_seconds > 0:
            return self.paced_updates / self.paced_seconds
        return self.updates / self.seconds


@dataclass(frozen=True)
class TrainingRound:
    """Round `number` (from 1) of the training comparison: each single-process reference that trains, by name
    (sync-ppo, sb3-ppo), and each stack, by mode, once; `stacks_first` says which ran first."""

    number: int
    stacks_first: bool
    references: dict[str, RunRate]
    stacks: dict[str, RunRate]

    @classmethod
    def of(
        cls, number: int, stacks_first: bool, references: Mapping[str, _Timed], stacks: Mapping[str, _Timed]
    ) -> TrainingRound:
        return cls(
            number,
            stacks_first,
            {name: RunRate.of(run) for name, run in references.items()},
            {mode: RunRate.of(run) for mode, run in stacks.items()},
        )


def stacks_run_first(number: int) -> bool:
    """Whether round `number` (from 1) runs the stacks before the references: even rounds do, so round 1 keeps
    the bench's order (references first) and the rounds alternate."""
    if number < 1:
        raise ValueError(f"rounds are numbered from 1, got {number}")
    return number % 2 == 0


def ratio(stack: RunRate, reference: RunRate) -> tuple[float, float]:
    """(env frames/s, updates/s) of `stack` as multiples of `reference`'s (updates/s: NaN if the reference
    made no update in its window)."""
    updates = stack.updates_per_s / reference.updates_per_s if reference.updates_per_s else float("nan")
    return stack.steps_per_s / reference.steps_per_s, updates


def round_lines(rounds: list[TrainingRound], action_repeat: int) -> list[str]:
    """The round-by-round table: each reference's env frames/s, and each stack's frames/s and updates/s as
    multiples of each reference's in the same round, then their median and range over the rounds. Empty for a
    single round, or without both a reference and a stack."""
    if len(rounds) < 2 or not rounds[0].references or not rounds[0].stacks:
        return []
    references, modes = list(rounds[0].references), list(rounds[0].stacks)
    pairs = [(mode, name) for mode in modes for name in references]
    lines = [
        "",
        f"Round by round ({len(rounds)} rounds; even rounds ran the stacks first, so a machine that drifts over "
        "the bench weighs on both sides of a ratio alike): each reference's env frames/s, and each stack's env "
        "frames/s / updates/s (update to update) as multiples of the reference's in the same round.",
        "",
        "| round | ran first | "
        + " | ".join(f"{name} frames/s" for name in references)
        + " | "
        + " | ".join(f"{mode} x {name}" for mode, name in pairs)
        + " |",
        "|---|---|" + "---:|" * (len(references) + len(pairs)),
    ]
    frames = {name: [r.references[name].steps_per_s * action_repeat for r in rounds] for name in references}
    ratios = {(mode, name): [ratio(r.stacks[mode], r.references[name]) for r in rounds] for mode, name in pairs}
    for index, one in enumerate(rounds):
        cells = [f"{frames[name][index]:,.1f}" for name in references]
        cells += [_pair(*ratios[pair][index]) for pair in pairs]
        lines.append(f"| {one.number} | {'stacks' if one.stacks_first else 'references'} | " + " | ".join(cells) + " |")
    medians = [f"{statistics.median(frames[name]):,.1f}" for name in references]
    medians += [_pair(*(statistics.median(side) for side in zip(*ratios[pair], strict=True))) for pair in pairs]
    ranges = [f"{min(frames[name]):,.1f}-{max(frames[name]):,.1f}" for name in references]
    ranges += [
        " / ".join(f"{min(side):.2f}-{max(side):.2f}" for side in zip(*ratios[pair], strict=True)) for pair in pairs
    ]
    lines += [f"| median | | {' | '.join(medians)} |", f"| range | | {' | '.join(ranges)} |"]
    return lines


def _pair(frames: float, updates: float) -> str:
    return f"{frames:.2f} / {updates:.2f}"
