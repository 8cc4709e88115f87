"""The run summary table: every link, phase and payload name whole on an 80-column terminal."""

from __future__ import annotations

from typing import get_args

from rich.console import Console

from splitrl.cli.progress import Progress
from splitrl.core.metrics import Link, Payload


def cell_texts(line: str) -> list[str]:
    """The cells of one row of a rich table as printed (empty for a line that is not a row)."""
    return [cell.strip() for cell in line.strip().strip("│").split("│")] if line.startswith("│") else []


def test_the_summary_table_fits_80_columns_without_cutting_names(tmp_path):
    counts = {"messages": 1_234_567, "bytes": 123_456_789_012, "elements": 9_876_543_210}
    ends = {"sent": counts, "received": counts}
    payloads = {payload: ends for payload in get_args(Payload)}
    summary = {
        "env_steps": 750_000,
        "env_steps_per_second": 91.2,
        "links": {link: {"rollout": payloads, "training": payloads, "weights": payloads} for link in get_args(Link)},
        "processes": {  # scaled-out instance names; a peak the system did not give
            "edge-encoder": {"cpu_ms_per_env_step": 1234.56, "resident_mib": 12345.6, "peak_resident_mib": 23456.7},
            "inference-12": {"cpu_ms_per_env_step": None, "resident_mib": 277.0, "peak_resident_mib": None},
        },
        # splitrl up's own, on a system without /proc
        "supervisor": {"cpu_ms_per_env_step": None, "resident_mib": None, "peak_resident_mib": None},
    }
    progress = Progress(750_000, interactive=False)
    progress.console = Console(width=80, record=True, file=open(tmp_path / "out.txt", "w"))  # noqa: SIM115
    progress.print_summary(summary, tmp_path / "summary.json")
    text = progress.console.export_text()
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    for link in get_args(Link):
        assert link in text
    rows = {cells[0]: cells[1:] for line in text.splitlines() if len(cells := cell_texts(line)) == 4}
    assert rows["edge-encoder"] == ["1234.56", "12346", "23457"]  # CPU ms/env step, MiB at the end, peak MiB
    assert rows["inference-12"] == ["-", "277", "-"]
    assert rows["splitrl up"] == ["-", "-", "-"]
