"""splitrl.bench: run summaries -> rows, the markdown/CSV table and the figures; `splitrl report` on directories."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from splitrl.bench.network import Config, matrix
from splitrl.bench.report import FIGURES, markdown, pareto_front, write_report
from splitrl.bench.results import best_cloud, find_runs, group_rows, load_run, row_name
from splitrl.bench.settings import NetworkBenchSettings
from splitrl.cli.main import main

STEPS = 10_000


def _ends(sent_bytes: int, elements: int) -> dict[str, Any]:
    counts = {"bytes": sent_bytes, "messages": 100, "elements": elements}
    return {"sent": counts, "received": dict(counts)}


def _summary(settings: dict[str, Any], rollout: int, training: int, final_return: float) -> dict[str, Any]:
    links: dict[str, Any] = {
        "env-encoder": {"rollout": {"observation": _ends(92_000_000, 92_160_000)}},
        "encoder-inference": {"rollout": {"observation": _ends(rollout, 40_000), "action": _ends(0, 0)}},
    }
    if training:
        links["learner-encoder"] = {"training": {"gradient": _ends(training, 8_000)}}
    # 100 episodes, 10 per 1,000 steps; returns -1 until the last fifth, then final_return.
    curve, return_sum = [], 0.0
    for i in range(1, 11):
        return_sum += 10 * (final_return if i > 8 else -1.0)
        curve.append(
            {
                "env_steps": 1000.0 * i,
                "episodes": 10.0 * i,
                "return_sum": return_sum,
                "updates": i,
                "wan_bytes": i * (rollout + training) / 10,
            }
        )
    curve.insert(0, {"env_steps": 0.0, "episodes": 0.0, "return_sum": 0.0, "updates": 0, "wan_bytes": 0.0})
    return {"settings": settings, "env_steps": STEPS, "wall_seconds": 50.0, "links": links, "curve": curve}


def _write(run_dir: Path, summary: dict[str, Any]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


@pytest.fixture
def study(tmp_path: Path) -> Path:
    base = {"env": "CarRacing-v3", "width": 4096}
    _write(
        tmp_path / "runs" / "baseline", _summary({**base, "mode": "cloud", "codec": "frame+zstd"}, 13_540_000, 0, 0.9)
    )
    # The reference (lossless) and two video rows: crf 28 is cheapest but learns worse than 10% below the reference,
    # so the baseline is crf 23.
    _write(tmp_path / "runs" / "frame", _summary({**base, "mode": "cloud", "codec": "frame"}, 92_410_000, 0, 0.9))
    video = {**base, "mode": "cloud", "codec": "h264"}
    _write(tmp_path / "runs" / "crf23", _summary({**video, "video_crf": 23}, 2_000_000, 0, 0.85))
    _write(tmp_path / "runs" / "crf28", _summary({**video, "video_crf": 28}, 1_250_000, 0, 0.5))
    acc = {
        **base,
        "mode": "split-accumulate",
        "activation_codec": "int8+zstd",
        "gradient_codec": "int8+zstd",
        "width": 256,
    }
    _write(tmp_path / "runs" / "acc-0", _summary({**acc, "seed": 0}, 2_000_000, 1_000_000, 0.8))
    _write(tmp_path / "runs" / "acc-1", _summary({**acc, "seed": 1}, 2_200_000, 1_200_000, 0.6))
    return tmp_path


def test_row_names_say_what_crossed_the_wan():
    assert row_name({"mode": "cloud", "codec": "stack-bf16"})[0] == "cloud stack-bf16"
    split = {"mode": "split", "activation_codec": "fp8", "gradient_codec": "fp8", "width": 256}
    assert row_name(split)[0] == "split fp8 w256"
    assert row_name({**split, "gradient_codec": "bf16"})[0] == "split fp8 w256 grad bf16"
    assert row_name({"mode": "cloud", "codec": "h264", "video_crf": 18})[0] == "cloud h264 crf18"
    assert row_name({**split, "encoder_epochs": 1})[0] == "split fp8 w256 e1"
    assert row_name({**split, "encoder_epochs": 1, "encoder_fraction": 0.5})[0] == "split fp8 w256 e1 f0.5"


def test_runs_give_per_step_bytes_numbers_and_the_final_return(study):
    run = load_run(study / "runs" / "acc-0")
    assert run.wan_bytes == {"rollout": 2_000_000, "training": 1_000_000, "weights": 0}
    assert run.wan_elements["rollout"] == 40_000 and run.wan_elements["training"] == 8_000
    assert run.wan_bytes_per_step == 300.0
    assert run.final_return == pytest.approx(0.8)  # only the last 20% of steps count
    assert run.link_bytes["env-encoder/rollout"] == 92_000_000  # local links are in the CSV too


def test_seeds_of_one_configuration_form_one_row(study):
    rows = group_rows([load_run(d) for d in find_runs([study])])
    assert [row.name for row in rows] == [
        "split-accumulate int8+zstd w256",
        "cloud frame+zstd",
        "cloud h264 crf23",
        "cloud h264 crf28",
        "cloud frame",
    ]
    accumulate = rows[0]
    assert accumulate.wan_bytes_per_step == pytest.approx((300 + 340) / 2)
    assert accumulate.returns == pytest.approx([0.8, 0.6])


def test_the_baseline_is_the_cheapest_cloud_row_at_matched_return(study):
    rows = group_rows([load_run(d) for d in find_runs([study])])
    baseline, why = best_cloud(rows)
    assert baseline is not None and baseline.name == "cloud h264 crf23"  # crf28 is cheaper but ends at +0.5
    assert "+0.81" in why and "cloud frame" in why
    assert best_cloud(rows, tolerance=0.5)[0].name == "cloud h264 crf28"  # type: ignore[union-attr]
    without_reference = [row for row in rows if row.name != "cloud frame"]
    cheapest, why = best_cloud(without_reference)
    assert cheapest is not None and cheapest.name == "cloud h264 crf28" and "returns not matched" in why
    assert best_cloud([row for row in rows if not row.is_cloud]) == (None, "no cloud row was run")


def test_markdown_compares_with_the_best_cloud_codec_and_the_research(study):
    text = markdown(group_rows([load_run(d) for d in find_runs([study])]))
    assert "Baseline: **cloud h264 crf23**" in text and "| vs `cloud h264 crf23` |" in text
    assert "| cloud frame+zstd | 10,000 |" in text and "| 1,354 | 0 | 0% | 1,354 | 6.77x |" in text
    assert "| 200 | 0 | 0% | 200 | 1x | +0.85 |" in text
    # split-accumulate: 210 B rollout + 110 B training per step (means over two seeds): share 52%
    assert "| 210 | 110 | 52% | 320 | 1.6x | +0.70 (+0.60..+0.80, 2 seeds) |" in text
    assert "| cloud stack-bf16 | 73,728 + 0 |  | not run |" in text


def test_pareto_front_keeps_rows_nothing_beats_on_both_bytes_and_return(study):
    rows = group_rows([load_run(d) for d in find_runs([study])])
    front = [row.name for row in pareto_front(rows)]
    assert front == ["cloud h264 crf28", "cloud h264 crf23", "cloud frame+zstd"]


def test_report_writes_table_csv_and_figures(study, tmp_path):
    written = write_report([load_run(d) for d in find_runs([study])], tmp_path / "report")
    assert {p.name for p in written} == {"report.md", "runs.csv", *FIGURES}
    for name in FIGURES:
        assert (tmp_path / "report" / name).read_bytes().startswith(b"\x89PNG")
    with (tmp_path / "report" / "runs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6
    assert {row["seed"] for row in rows} == {"0", "1"}
    assert rows[0]["bytes:env-encoder/rollout"] == "92000000"


def test_report_command_reads_directories_and_refuses_empty_ones(study, tmp_path, capsys):
    assert main(["report", str(study), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "report.md").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exited:
        main(["report", str(tmp_path / "empty")])
    assert exited.value.code == 2
    assert "no summary.json under" in capsys.readouterr().err


def test_matrix_is_cloud_codecs_then_split_modes_x_codecs_x_widths():
    settings = NetworkBenchSettings.model_validate(
        {
            "modes": "cloud,split-accumulate",
            "observation_codecs": "frame+zstd",
            "activation_codecs": "bf16,fp8",
            "widths": "4096, 256",
            "gradient_codec": "int8",
        }
    )
    configs = matrix(settings)
    assert configs[0] == Config("cloud", "frame+zstd", 4096, "-")
    video = matrix(settings.model_copy(update={"observation_codecs": ["h264"], "video_crfs": [18, 28]}))
    assert [(c.codec, c.video_crf) for c in video[:2]] == [("h264", 18), ("h264", 28)]
    assert video[0].up_flags()["video_crf"] == 18 and "crf18" in video[0].slug
    assert [(c.codec, c.width, c.gradient_codec) for c in configs[1:]] == [
        ("bf16", 4096, "int8"),
        ("bf16", 256, "int8"),
        ("fp8", 4096, "int8"),
        ("fp8", 256, "int8"),
    ]
    assert len({c.slug for c in configs}) == len(configs)  # every run gets its own directory
    by_epochs = matrix(settings.model_copy(update={"modes": ["split"], "widths": [32], "encoder_epochs": [1, 4]}))
    assert [(c.codec, c.encoder_epochs, c.up_flags()["encoder_epochs"]) for c in by_epochs] == [
        ("bf16", 1, 1),
        ("bf16", 4, 4),
        ("fp8", 1, 1),
        ("fp8", 4, 4),
    ]
    assert len({c.slug for c in by_epochs}) == len(by_epochs)


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"widths": ""}, "at least one entry"),
        ({"widths": "0"}, "widths must be >= 1"),
        ({"activation_codecs": "int2"}, "Input should be"),
        ({"video_crfs": "52"}, "video CRFs must be in"),
    ],
)
def test_bad_bench_settings_are_refused(values, error):
    with pytest.raises(ValueError, match=error):
        NetworkBenchSettings.model_validate(values)


def test_report_appends_framing_measurements_found_under_the_run_dirs(study, tmp_path):
    from splitrl.bench.framing import FramingResult

    framing = FramingResult("cloud", "frame+zstd", 800, 4.0, None, 1000, 100, 1200, 200, 10, 10)
    (study / "framing").mkdir()
    (study / "framing" / "framing.json").write_text(json.dumps(framing.__dict__))
    assert main(["report", str(study), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Counters vs the kernel: cloud (frame+zstd)" in text
    assert "| kernel, veth bytes | 1,200 | 200 | 1,400 | 100% |" in text
    assert framing.http2_grpc == 1400 - 1100 - 20 * 66
