"""benchmarks/pooled_rounds.py pools the round-by-round tables of several throughput reports (docs/results/sb3.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "pooled_rounds.py"

# As `splitrl bench throughput --rounds N` writes it (bench.rounds.round_lines), with both references.
HEADER = (
    "| round | ran first | sync-ppo frames/s | sb3-ppo frames/s | cloud x sync-ppo | cloud x sb3-ppo |\n"
    "|---|---|---:|---:|---:|---:|\n"
)


def report(tmp_path: Path, name: str, rows: list[str], machine: str | None = None) -> Path:
    """A report as the bench writes it, its "Machine: ..." line naming `machine` (None: a report without one)."""
    path = tmp_path / name
    named = "" if machine is None else f"Machine: 2 cores of {machine}\n\n"
    body = (
        "# a bench\n\n" + named + "some prose | with a bar\n\n" + HEADER + "".join(rows) + "| median | | x |\n\nafter\n"
    )
    path.write_text(body)
    return path


def pooled(*arguments: object) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SCRIPT), *map(str, arguments)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def row_of(stdout: str, measure: str, table: int = 0) -> list[str]:
    """The cells of cloud's `measure` row in the `table`th table (0: pooled medians, 1: rounds by order)."""
    lines = [line for line in stdout.splitlines() if line.startswith(f"| cloud | {measure}/s |")]
    assert len(lines) == 2, stdout
    return [cell.strip() for cell in lines[table].strip("|").split("|")]


@pytest.mark.timeout(90)
def test_pools_bench_medians_and_rounds_against_the_target(tmp_path: Path) -> None:
    first = report(
        tmp_path,
        "a.md",
        [
            "| 1 | references | 1,200.0 | 640.0 | 0.70 / 0.71 | 1.40 / 1.38 |\n",
            "| 2 | stacks | 1,210.0 | 650.0 | 0.71 / 0.70 | 1.50 / 1.48 |\n",
            "| 3 | references | 1,190.0 | 630.0 | 0.72 / - | 1.60 / - |\n",
            "| 4 | stacks | 1,200.0 | 660.0 | 0.69 / 0.70 | 1.46 / 1.44 |\n",
        ],
    )
    second = report(
        tmp_path,
        "b.md",
        [
            "| 1 | references | 1,200.0 | 640.0 | 0.70 / 0.71 | 1.54 / 1.54 |\n",
            "| 2 | stacks | 1,210.0 | 650.0 | 0.71 / 0.70 | 1.50 / 1.50 |\n",
        ],
    )
    done = pooled(first, second, "--resamples", 1000)
    assert done.returncode == 0, done.stderr
    assert "2 benches; x sb3-ppo" in done.stdout
    # mode, measure, benches, mean (interval), medians' range, medians >= 1.5, rounds, rounds' range, rounds >= 1.5
    frames = row_of(done.stdout, "frames")
    assert frames[2:] == ["2", "1.500 (1.480-1.520)", "1.48-1.52", "1", "6", "1.40-1.60", "4"], frames
    updates = row_of(done.stdout, "updates")  # the "-" round is left out: medians 1.44 and 1.52
    assert updates[2:] == ["2", "1.480 (1.440-1.520)", "1.44-1.52", "1", "5", "1.38-1.54", "2"], updates
    # every round by which ran first: rounds, mean with the stacks first, then with the references first
    assert row_of(done.stdout, "frames", table=1)[2:] == ["3", "1.487", "3", "1.513"], done.stdout
    assert row_of(done.stdout, "updates", table=1)[2:] == ["3", "1.473", "2", "1.460"], done.stdout

    against_sync = pooled(first, "--reference", "sync-ppo", "--target", "0.7")
    assert against_sync.returncode == 0, against_sync.stderr
    assert "1 benches; x sync-ppo" in against_sync.stdout
    assert row_of(against_sync.stdout, "frames")[3:6] == ["0.705 (0.705-0.705)", "0.70-0.70", "1"]


@pytest.mark.timeout(90)
def test_pools_each_machine_apart(tmp_path: Path) -> None:
    rows = [
        "| 1 | references | 1.0 | 640.0 | 0.70 / 0.71 | {0} / {0} |\n",
        "| 2 | stacks | 1.0 | 650.0 | 0.7 / 0.7 | {0} / {0} |\n",
    ]
    fast = [
        report(tmp_path, f"fast{i}.md", [row.format(1.4) for row in rows], "CPU A, torch kernels AVX512")
        for i in (1, 2)
    ]
    slow = report(tmp_path, "slow.md", [row.format(1.6) for row in rows], "CPU B, torch kernels AVX2")
    old = report(tmp_path, "old.md", [row.format(1.5) for row in rows])
    done = pooled(fast[0], slow, old, fast[1], "--resamples", 1000)
    assert done.returncode == 0, done.stderr
    machines = [line for line in done.stdout.splitlines() if line.startswith("Machine: ")]
    assert machines == [
        "Machine: 2 cores of CPU A, torch kernels AVX512",
        "Machine: 2 cores of CPU B, torch kernels AVX2",
        "Machine: not recorded",
    ], done.stdout
    benches = [line for line in done.stdout.splitlines() if " benches; x sb3-ppo" in line]
    assert [line.split(" ")[0] for line in benches] == ["2", "1", "1"], done.stdout
    pooled_frames = [line for line in done.stdout.splitlines() if line.startswith("| cloud | frames/s | ")]
    means = [line.strip("|").split("|")[3].strip() for line in pooled_frames[::2]]  # each then in its order table
    assert means == ["1.400 (1.400-1.400)", "1.600 (1.600-1.600)", "1.500 (1.500-1.500)"], done.stdout


@pytest.mark.timeout(90)
def test_refuses_a_report_without_rounds_a_malformed_cell_and_too_few_resamples(tmp_path: Path) -> None:
    plain = tmp_path / "plain.md"
    plain.write_text("# a single-round bench\n\n| run | env frames/s |\n|---|---:|\n| sb3-ppo | 640.0 |\n")
    refused = pooled(plain)
    assert refused.returncode == 2 and f"{plain}: no round-by-round table" in refused.stderr, refused.stderr

    malformed = report(tmp_path, "bad.md", ["| 1 | references | 1.0 | 640.0 | 0.70 / 0.71 | 1.40 |\n"])
    refused = pooled(malformed)
    assert refused.returncode == 2 and "bad.md:7: not 'frames / updates': '1.40'" in refused.stderr, refused.stderr

    short = report(tmp_path, "short.md", ["| 1 | references | 1.0 | 640.0 | 0.70 / 0.71 |\n"])
    refused = pooled(short)
    assert refused.returncode == 2 and "shorter than its table's header" in refused.stderr, refused.stderr

    unordered = report(tmp_path, "order.md", ["| 1 | both | 1.0 | 640.0 | 0.70 / 0.71 | 1.40 / 1.38 |\n"])
    refused = pooled(unordered)
    assert (
        refused.returncode == 2 and "'ran first' must be one of ('stacks', 'references'), got 'both'" in refused.stderr
    )

    other_reference = pooled(malformed, "--reference", "sb3-zoo")
    assert other_reference.returncode == 2 and "no round-by-round table with columns '<mode> x sb3-zoo'" in (
        other_reference.stderr
    )
    assert "No such file" in pooled(tmp_path / "missing.md").stderr
    too_few = pooled(plain, "--resamples", "10")
    assert too_few.returncode == 2 and "--resamples must be at least 100, got 10" in too_few.stderr


@pytest.mark.timeout(90)
def test_renders_the_results_pages_table_from_the_committed_reports() -> None:
    """The long window's row of docs/results/sb3.md, from the reports it names: 7 benches of 2 rounds each."""
    reports = sorted((REPO / "docs" / "results" / "data" / "sb3-throughput").glob("long-*.md"))
    done = pooled(*reports)
    assert done.returncode == 0 and f"{len(reports)} benches" in done.stdout, done.stderr
    assert {row_of(done.stdout, measure)[6] for measure in ("frames", "updates")} == {str(2 * len(reports))}
    page = (REPO / "docs" / "results" / "sb3.md").read_text().replace("**", "")
    for measure in ("updates", "frames"):
        mean, interval = row_of(done.stdout, measure)[3].split(" ")  # "1.486 (1.461-1.512)"
        shown = interval.replace("-", "\N{EN DASH}")  # the page writes ranges with an en dash
        assert f"{mean} {shown}" in page, (measure, mean, interval)
