"""Benchmark report (not a test): the stack's training speed as a multiple of Stable-Baselines3's, pooled over
many `splitrl bench throughput --rounds N` reports. It renders the training-speed table of docs/results/sb3.md:

    python benchmarks/pooled_rounds.py docs/results/data/sb3-throughput/long-*.md

Each report's round-by-round table ("| round | ran first | sb3-ppo frames/s | cloud x sb3-ppo | ... |") gives,
per round and stack mode, the stack's env frames/s and updates/s as multiples of SB3's in the same round
("1.48 / 1.45"). One bench is noisy (on a shared machine its rounds spread by a tenth or more), so this
pools them: per mode and measure, the benches' medians, their mean with a
95% interval from resampling whole benches (rounds of one bench share the machine's state, so they are not
independent draws), every round's spread, and how often a bench median and a round reached `--target`; then
every round's ratio by which side ran first in it.

Benches are pooled per machine: a report's "Machine: ..." line names its CPU, and machines of one kind can
differ by tens of percent in SB3's pace. Each machine's benches get their own tables; reports without the
line pool as "not recorded".
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

from splitrl.bench.cpu_budget import MACHINE_PREFIX

CELL = re.compile(r"^(?P<frames>[\d.]+) / (?P<updates>[\d.]+|-)$")
MEASURES = ("frames", "updates")
ORDERS = ("stacks", "references")  # which ran first in a round


class Round(NamedTuple):
    """One round's ratio of a stack to the reference (a multiple), and which side ran first in it."""

    ratio: float
    ran_first: str  # one of ORDERS


Bench = dict[tuple[str, str], list[Round]]  # one report: per (stack mode, measure), its rounds in order


def read_bench(path: Path, reference: str) -> Bench:
    """The round-by-round table of one report, its columns "<mode> x <reference>"; ValueError (naming the file)
    if it has none or a row is malformed. A round's updates/s read "-" (fewer than 2 updates) is left out."""
    columns: dict[int, str] | None = None  # cell index -> stack mode, in the table being read
    rounds: Bench = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells[:2] == ["round", "ran first"]:
            suffix = f" x {reference}"
            columns = {index: cell.removesuffix(suffix) for index, cell in enumerate(cells) if cell.endswith(suffix)}
            columns = columns or None  # a table of other references only: read as none
            continue
        if columns is None or not cells or not cells[0].isdigit():
            continue
        if len(cells) <= max(columns):
            raise ValueError(f"{path}:{number}: a round's row shorter than its table's header: {line!r}")
        if cells[1] not in ORDERS:
            raise ValueError(f"{path}:{number}: 'ran first' must be one of {ORDERS}, got {cells[1]!r}")
        for index, mode in columns.items():
            if (ratio := CELL.match(cells[index])) is None:
                raise ValueError(f"{path}:{number}: not 'frames / updates': {cells[index]!r}")
            for measure in MEASURES:
                if (value := ratio[measure]) != "-":
                    rounds.setdefault((mode, measure), []).append(Round(float(value), cells[1]))
    if not rounds:
        raise ValueError(f"{path}: no round-by-round table with columns '<mode> x {reference}'")
    return rounds


#: The machine of a report that does not name one.
UNRECORDED = "not recorded"


def machine_of(path: Path) -> str:
    """The machine a report names in its "Machine: ..." line (bench.cpu_budget.machine_line), or UNRECORDED."""
    for line in path.read_text().splitlines():
        if line.startswith(MACHINE_PREFIX):
            return line.removeprefix(MACHINE_PREFIX).strip()
    return UNRECORDED


def by_machine(paths: list[Path], benches: list[Bench]) -> dict[str, list[Bench]]:
    """`benches` (read from `paths`, in the same order) grouped by the machine each report names, machines in
    the order they first appear."""
    groups: dict[str, list[Bench]] = {}
    for path, bench in zip(paths, benches, strict=True):
        groups.setdefault(machine_of(path), []).append(bench)
    return groups


def interval(values: list[float], resamples: int, seed: int) -> tuple[float, float]:
    """95% percentile interval of the mean of `values`, resampled with replacement."""
    generator = random.Random(seed)
    means = sorted(statistics.fmean(generator.choices(values, k=len(values))) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def report(benches: list[Bench], reference: str, target: float, resamples: int, seed: int) -> str:
    """Two markdown tables: per (mode, measure) the benches' medians pooled, then every round by its order."""
    keys = sorted({key for bench in benches for key in bench}, key=lambda key: (key[0], MEASURES.index(key[1])))
    return "\n".join(pooled_lines(benches, keys, reference, target, resamples, seed) + order_lines(benches, keys))


def pooled_lines(
    benches: list[Bench], keys: list[tuple[str, str]], reference: str, target: float, resamples: int, seed: int
) -> list[str]:
    lines = [
        f"{len(benches)} benches; x {reference} per stack mode and measure (medians over each bench's rounds)",
        "",
        "| mode | measure | benches | mean of medians (95% interval) | medians' range "
        f"| medians >= {target} | rounds | rounds' range | rounds >= {target} |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, measure in keys:
        per_bench = [[one.ratio for one in bench[mode, measure]] for bench in benches if (mode, measure) in bench]
        medians = [statistics.median(ratios) for ratios in per_bench]
        every_round = [ratio for ratios in per_bench for ratio in ratios]
        low, high = interval(medians, resamples, seed)
        lines.append(
            f"| {mode} | {measure}/s | {len(medians)} | {statistics.fmean(medians):.3f} ({low:.3f}-{high:.3f}) "
            f"| {min(medians):.2f}-{max(medians):.2f} | {sum(m >= target for m in medians)} "
            f"| {len(every_round)} | {min(every_round):.2f}-{max(every_round):.2f} "
            f"| {sum(r >= target for r in every_round)} |"
        )
    return lines


def order_lines(benches: list[Bench], keys: list[tuple[str, str]]) -> list[str]:
    lines = [
        "",
        "Every round by which ran first in it (the bench alternates: a steady drift of the machine favours one order)",
        "",
        "| mode | measure | rounds, stacks first | mean | rounds, references first | mean |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for mode, measure in keys:
        by_order: dict[str, list[float]] = {order: [] for order in ORDERS}
        for one in (one for bench in benches for one in bench.get((mode, measure), [])):
            by_order[one.ran_first].append(one.ratio)
        cells = [f"{len(v)} | {statistics.fmean(v):.3f}" if v else "0 | -" for v in by_order.values()]
        lines.append(f"| {mode} | {measure}/s | {' | '.join(cells)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="reports of --rounds 2 or more (throughput.md)")
    parser.add_argument("--reference", default="sb3-ppo", help="the reference the ratios are to (sb3-ppo, sync-ppo)")
    parser.add_argument("--target", type=float, default=1.5, help="the ratio to count reaching")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples of the benches")
    parser.add_argument("--seed", type=int, default=0, help="the resampling's seed (the report is reproducible)")
    args = parser.parse_args(argv)
    if args.resamples < 100:
        parser.error(f"--resamples must be at least 100, got {args.resamples}")
    try:
        benches = [read_bench(path, args.reference) for path in args.reports]
    except (OSError, ValueError) as error:
        print(f"pooled_rounds: {error}", file=sys.stderr)
        return 2
    for machine, group in by_machine(args.reports, benches).items():
        print(f"{MACHINE_PREFIX}{machine}\n")
        print(report(group, args.reference, args.target, args.resamples, args.seed) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
