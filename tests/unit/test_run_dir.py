"""What a run directory keeps for `up --resume` and `eval`, the eval statistics, and the learning bench's rows."""

from __future__ import annotations

import json

import pytest

from splitrl.bench.learning import Row, last_segment_edge_costs, last_segment_shadow, last_summary
from splitrl.bench.learning_report import edge_cost_table_lines, shadow_table_lines
from splitrl.bench.settings import LearningBenchSettings
from splitrl.run import files as run_dir_files
from splitrl.run.evaluate import summarize
from splitrl.run.settings import EvalSettings


def point(steps: float, **extra: float) -> dict[str, float]:
    return {**run_dir_files.zero_point(), "env_steps": steps, **extra}


def test_curve_round_trips_and_a_line_cut_by_a_crash_ends_it(tmp_path):
    run_dir_files.append_curve(tmp_path, point(10, episodes=1))
    run_dir_files.append_curve(tmp_path, point(20, episodes=2))
    with (tmp_path / run_dir_files.CURVE_FILE).open("a") as file:
        file.write('{"env_steps": 30, "epis')  # killed mid-write
    assert [p["env_steps"] for p in run_dir_files.load_curve(tmp_path)] == [10, 20]
    assert run_dir_files.load_curve(tmp_path / "missing") == []


def test_a_resumed_segment_is_shifted_by_the_last_point():
    offset = point(100, episodes=5, return_sum=-2.5, updates=3, wan_bytes=1000, seconds=60)
    shifted = run_dir_files.shifted(point(10, episodes=1, return_sum=1.0, wan_bytes=50, seconds=2), offset)
    assert shifted == {
        "env_steps": 110, "episodes": 6, "return_sum": -1.5, "updates": 3, "wan_bytes": 1050, "seconds": 62,
    }  # fmt: skip
    # When the last update completed is a time: the earlier segment's until the new learner's first update.
    earlier = {**offset, "last_update_at": 1_700_000_000.0}
    assert run_dir_files.shifted(point(10, last_update_at=0.0), earlier)["last_update_at"] == 1_700_000_000.0
    assert run_dir_files.shifted(point(10, last_update_at=1_700_000_900.0), earlier)["last_update_at"] == 1.7000009e9


def test_settings_must_exist_and_be_an_object(tmp_path):
    with pytest.raises(ValueError, match="not a run directory"):
        run_dir_files.load_settings(tmp_path)
    (tmp_path / run_dir_files.SETTINGS_FILE).write_text("[1]")
    with pytest.raises(ValueError, match="no settings object"):
        run_dir_files.load_settings(tmp_path)
    (tmp_path / run_dir_files.SETTINGS_FILE).write_text(json.dumps({"env": "x"}))
    assert run_dir_files.load_settings(tmp_path) == {"env": "x"}


def test_summarize_gives_mean_iqm_and_std():
    stats = summarize([0.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 1000.0])
    assert stats["mean"] == pytest.approx(132.5)
    assert stats["iqm"] == 10.0  # the outliers at both ends are the quartiles left out
    assert stats["min"] == 0.0 and stats["max"] == 1000.0
    assert summarize([3.0])["iqm"] == 3.0 and summarize([3.0])["std"] == 0.0


def test_eval_settings_refuse_a_file_that_is_not_a_video():
    with pytest.raises(ValueError, match="mp4"):
        EvalSettings(record="agent.gif")
    assert EvalSettings(record="agent.MP4").record is not None


@pytest.mark.parametrize(
    ("spec", "flags"),
    [
        ("cloud", {"mode": "cloud"}),
        ("cloud:h264", {"mode": "cloud", "codec": "h264"}),
        (
            "split-accumulate:int4+zstd:w32",
            {"mode": "split-accumulate", "activation_codec": "int4+zstd", "gradient_codec": "int4+zstd", "width": 32},
        ),
        (
            "split:int8:layernorm",
            {"mode": "split", "activation_codec": "int8", "gradient_codec": "int8", "bottleneck": "layernorm"},
        ),
        (
            "split:int4+zstd:w32:e1:layernorm",
            {
                "mode": "split",
                "activation_codec": "int4+zstd",
                "gradient_codec": "int4+zstd",
                "width": 32,
                "encoder_epochs": 1,
                "bottleneck": "layernorm",
            },
        ),
        (
            "split:int4:e1:f0.5",
            {
                "mode": "split",
                "activation_codec": "int4",
                "gradient_codec": "int4",
                "encoder_epochs": 1,
                "encoder_fraction": 0.5,
            },
        ),
        ("split-accumulate:f0", {"mode": "split-accumulate", "encoder_fraction": 0.0}),
    ],
)
def test_learning_rows_become_up_flags(spec, flags):
    assert Row(spec).up_flags() == flags
    assert "+" not in Row(spec).slug and ":" not in Row(spec).slug


BAD_ROWS = [
    "sideways:h264", "cloud:h264:32", "split:int8:w32:extra", "split:int8:w32:relu:w8", "cloud:int8", "split:h264",
    "cloud:h264:e1", "split:e0", "split:int4:int8", "split:int8:w32:e1:relu:e2", "cloud:f0.5", "split:f1.5",
    "split:fhalf", "split:f0.5:f0.25",
]  # fmt: skip


@pytest.mark.parametrize("rows", BAD_ROWS)
def test_bad_learning_rows_are_refused(rows):
    with pytest.raises(ValueError, match="row"):
        LearningBenchSettings(rows=rows)


def test_a_run_with_a_video_shadow_reports_its_last_segment_beside_cloud_h264(tmp_path):
    shadowed, plain, broken = tmp_path / "shadowed", tmp_path / "plain", tmp_path / "broken"
    for run_dir in (shadowed, plain, broken):
        run_dir.mkdir()
    summary = {"env_steps": 25_000, "wan_bytes_per_env_step": {"rollout": 40.0, "training": 15.0}}
    shadow = {"wan_bytes": 5_500_000, "wan_bytes_per_env_step": 220.0, "split_share": 0.25}
    (shadowed / "summary.json").write_text(json.dumps(summary | {"cloud_h264_shadow": shadow}))
    (plain / "summary.json").write_text(json.dumps(summary | {"cloud_h264_shadow": None}))
    (broken / "summary.json").write_text("{not json")
    assert last_segment_shadow(last_summary(shadowed)) == {
        "env_steps": 25_000,
        "split_wan_bytes_per_env_step": 55.0,
        "cloud_h264_wan_bytes_per_env_step": 220.0,
        "split_share": 0.25,
    }
    assert last_summary(broken) is None and last_summary(tmp_path / "never-ran") is None
    assert last_segment_shadow(last_summary(plain)) is None and last_segment_shadow(None) is None
    rows = [
        {"row": "split:int4+zstd:w32", "seed": 2, "last_segment_shadow": last_segment_shadow(last_summary(shadowed))},
        {"row": "cloud:h264", "seed": 2, "last_segment_shadow": None},
    ]
    lines = shadow_table_lines(rows)
    assert lines[-1] == "| split:int4+zstd:w32 | 2 | 25,000 | 55.0 | 220.0 | 0.250 |"
    assert not any("cloud:h264" in line for line in lines)
    assert shadow_table_lines(rows[1:]) == []


def test_the_learning_report_gives_the_edge_processes_costs_of_runs_that_recorded_them():
    cost = {"cpu_seconds": 90.0, "cpu_ms_per_env_step": 0.72, "resident_mib": 101.4, "peak_resident_mib": 103.6}
    processes = {"environment": cost, "edge-encoder": cost | {"peak_resident_mib": None}, "learner": cost}
    edge = last_segment_edge_costs({"processes": processes})
    assert edge is not None and set(edge) == {"environment", "edge-encoder"}  # the cloud's are left out
    assert last_segment_edge_costs({"env_steps": 10}) is None and last_segment_edge_costs(None) is None
    rows = [
        {"row": "split-accumulate:int4+zstd:w64:f0.0", "seed": 0, "last_segment_edge_costs": edge},
        {"row": "cloud:h264", "seed": 0, "last_segment_edge_costs": None},  # recorded before summaries had it
    ]
    lines = edge_cost_table_lines(rows)
    assert lines[-1] == "| split-accumulate:int4+zstd:w64:f0.0 | 0 | 0.72 | 101 | 104 | 0.72 | 101 | - |"
    assert not any("cloud:h264" in line for line in lines)
    assert edge_cost_table_lines(rows[1:]) == []


def test_no_learning_rows_trains_the_reference_peer_alone_or_is_refused():
    assert LearningBenchSettings(rows="", sb3_reference=True).rows == []
    with pytest.raises(ValueError, match="--rows needs at least one entry"):
        LearningBenchSettings(rows="")


def test_a_new_run_over_an_earlier_runs_checkpoints_is_refused_naming_resume(tmp_path):
    run_dir_files.refuse_a_new_run_over_checkpoints(tmp_path / "new")  # nothing there yet
    (tmp_path / "logs-only" / run_dir_files.CHECKPOINTS_DIR).mkdir(parents=True)  # a run that never checkpointed
    run_dir_files.refuse_a_new_run_over_checkpoints(tmp_path / "logs-only")
    edge = tmp_path / "used" / run_dir_files.CHECKPOINTS_DIR / "edge-encoder"
    edge.mkdir(parents=True)
    (edge / "edge-encoder.pt").write_bytes(b"weights")
    with pytest.raises(ValueError, match=r"holds an earlier run's checkpoints .*`splitrl up --resume .*used`"):
        run_dir_files.refuse_a_new_run_over_checkpoints(tmp_path / "used")
    assert (edge / "edge-encoder.pt").read_bytes() == b"weights"  # refused, nothing removed


def test_a_new_run_over_an_earlier_runs_replay_data_is_refused(tmp_path):
    data = run_dir_files.replay_data_dir(tmp_path, "replay")
    data.mkdir(parents=True)
    (data / "snapshot-00000001.bin").write_bytes(b"chunks")
    with pytest.raises(ValueError, match=r"holds an earlier run's replay data .*`splitrl up --resume"):
        run_dir_files.refuse_a_new_run_over_checkpoints(tmp_path)
