"""`splitrl up`'s console: the live status line (steps, rate, ETA, recent return, WAN bytes per step), and the
end-of-run tables (every link, phase and payload name whole on an 80-column terminal, the return reached beside
the bytes)."""

from __future__ import annotations

from typing import get_args

from rich.console import Console

from splitrl.cli.progress import Progress, duration, result_line, status_line
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
        "wan_bytes": {"rollout": 97_500_000, "training": 7_500_000},
        "curve": [{"env_steps": 750_000.0, "episodes": 750.0, "return_sum": 600_000.0}],
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
    assert (
        "return 800 (mean of the last 750 episodes) at 750,000 env steps; WAN 105.0 MB sent, 140 B/env step "
        "(rollout 130, training 10)" in " ".join(text.split())
    )


def test_the_status_line_says_steps_rate_eta_recent_return_and_wan_bytes_per_step():
    line = status_line(5_000, 20_000, 250.0, (-0.2125, 104), 650_000, 5_000, 3)
    assert line == (
        "5,000/20,000 env steps (25%) | 250 steps/s | ETA 1m 00s | return -0.212 (last 104 episodes) | "
        "WAN 130 B/step | 3 updates"
    )


def test_the_status_line_before_anything_happened():
    line = status_line(0, 20_000, 0.0, (None, 0), 0, 0, 0)
    assert "ETA -" in line and "return - (no episode ended yet)" in line and "WAN - B/step" in line


def test_a_resumed_run_counts_its_earlier_steps_and_times_what_is_left_by_this_segments_rate():
    # 15,000 of 20,000 done, 5,000 of them in this segment at 100 steps/s: 50 s to go
    assert "15,000/20,000 env steps (75%) | 100 steps/s | ETA 50s |" in status_line(
        15_000, 20_000, 100.0, (1.0, 10), 0, 5_000, 0
    )


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (12, 95, 3600, 7384)] == ["12s", "1m 35s", "1h 00m", "2h 03m"]


def exposition(steps: int, episodes: int, return_sum: float, wan: int) -> str:
    """What the services' /metrics would show (the families Progress reads), as one text."""
    return (
        f"splitrl_env_steps_total {steps}\n"
        f"splitrl_episode_return_count {episodes}\n"
        f"splitrl_episode_return_sum {return_sum}\n"
        'splitrl_link_bytes_total{link="encoder-inference",direction="sent",phase="rollout",payload="action"} '
        f"{wan}\n"
    )


def test_progress_shows_the_mean_return_of_the_last_hundred_episodes_and_never_goes_back(capsys):
    progress = Progress(1_000, interactive=False)
    progress.update([exposition(100, 50, -50.0, 1_000)], elapsed_s=10.0)
    progress.update([exposition(500, 150, 50.0, 5_000)], elapsed_s=20.0)  # the last 100 episodes earned +100
    progress.update([exposition(0, 0, 0.0, 0)], elapsed_s=30.0)  # a service that exited took its counters
    lines = capsys.readouterr().out.splitlines()
    assert "return -1 (last 50 episodes)" in lines[0] and "WAN 10 B/step" in lines[0]
    assert "500/1,000 env steps (50%) | 25 steps/s" in lines[1] and "return 1 (last 100 episodes)" in lines[1]
    assert "500/1,000 env steps" in lines[2] and "return 1 (last 100 episodes)" in lines[2]
    assert "encoder-inference" not in "".join(lines)  # per-link detail only with --verbose


def test_verbose_progress_adds_each_links_bytes(capsys):
    progress = Progress(1_000, interactive=False, verbose=True)
    progress.update([exposition(100, 0, 0.0, 1_234)], elapsed_s=10.0)
    assert "| encoder-inference/rollout 1.2 KB" in capsys.readouterr().out


def test_the_result_line_of_a_run_without_episodes():
    summary = {"curve": [{"env_steps": 64.0, "episodes": 0.0, "return_sum": 0.0}], "env_steps": 64, "wan_bytes": {}}
    assert result_line(summary) == "return - (no episode ended) at 64 env steps; WAN 0.0 B sent, 0 B/env step"


def test_the_start_says_which_services_start_and_where_their_logs_go(tmp_path, capsys):
    Progress(1_000, interactive=False).starting(("replay", "inference"), tmp_path / "logs")
    assert capsys.readouterr().out == f"starting 2 services (replay, inference); their logs: {tmp_path}/logs/\n"
