"""`splitrl bench throughput --rounds N`: the training comparison run N times, its ratios round by round.

On a shared machine one run's rate can swing by tens of percent between runs half an hour apart, so one
round's stack-to-SB3 ratio can land either side of a target. Each round trains every reference and
every stack mode once. Odd rounds run them in the bench's order (references, then stacks); even rounds in
exactly the reverse order (`round_order`), so over each pair of rounds every run holds the same mean place,
and a machine that slows (or speeds up) steadily over the bench weighs on both sides of every ratio alike;
an odd number of rounds leaves its last round unpaired. A ratio is taken within its round only: the median
and range over rounds are the verdict, not a ratio of medians.
"""

from __future__ import annotations

import math
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
    def updates_per_s(self) -> float | None:
        """The learner's pace, update to update; None where fewer than 2 updates completed in the window (a
        count of updates against the window's steps is no measure of it, baseline.update_pace)."""
        return self.paced_updates / self.paced_seconds if self.paced_seconds > 0 else None


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
    """Whether round `number` (from 1) runs the stacks before the references: even rounds do, in the reverse
    of the bench's order (round_order)."""
    if number < 1:
        raise ValueError(f"rounds are numbered from 1, got {number}")
    return number % 2 == 0


def round_order(number: int, references: list[str], modes: list[str]) -> list[tuple[str, str]]:
    """The runs of round `number` in the order they run, as ("reference", name) and ("stack", mode): odd rounds
    the references, then the stacks, each in the order given; even rounds exactly the reverse."""
    order = [("reference", name) for name in references] + [("stack", mode) for mode in modes]
    return order[::-1] if stacks_run_first(number) else order


def ratio(stack: RunRate, reference: RunRate) -> tuple[float, float]:
    """(env frames/s, updates/s) of `stack` as multiples of `reference`'s; the updates/s ratio is NaN where
    either pace is unknown (fewer than 2 updates completed in its window)."""
    stack_updates, reference_updates = stack.updates_per_s, reference.updates_per_s
    updates = stack_updates / reference_updates if stack_updates and reference_updates else math.nan
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
        f"Round by round ({len(rounds)} rounds; even rounds ran in the reverse order, stacks first, so that over "
        "each pair of rounds a steady drift of the machine weighs on both sides of a ratio alike): each "
        "reference's env frames/s, and each stack's env frames/s / updates/s (update to update; - where fewer "
        "than 2 updates completed) as multiples of the reference's in the same round.",
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
    ranges = [f"{min(frames[name]):,.1f}-{max(frames[name]):,.1f}" for name in references]
    for pair in pairs:
        sides = [[value for value in side if not math.isnan(value)] for side in zip(*ratios[pair], strict=True)]
        medians.append(" / ".join(f"{statistics.median(side):.2f}" if side else "-" for side in sides))
        ranges.append(" / ".join(f"{min(side):.2f}-{max(side):.2f}" if side else "-" for side in sides))
    lines += [f"| median | | {' | '.join(medians)} |", f"| range | | {' | '.join(ranges)} |"]
    return lines


def _pair(frames: float, updates: float) -> str:
    return f"{frames:.2f} / " + ("-" if math.isnan(updates) else f"{updates:.2f}")
