"""The throughput bench's arithmetic: histogram quantiles, the steady-rate window, link messages, the table."""

from __future__ import annotations

import json
import math
import platform
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from splitrl.bench import baseline
from splitrl.bench.baseline import BaselineResult, run_sync_ppo, steady_span
from splitrl.bench.cpu_budget import cpu_model, machine_description
from splitrl.bench.link import LinkResult, tensor_message
from splitrl.bench.settings import ThroughputBenchSettings
from splitrl.bench.throughput import read_stack, run_settings
from splitrl.bench.throughput_report import Hop, StackResult, ThroughputReport, as_json, render_markdown
from splitrl.core import scrape, wire
from splitrl.learner.network import to_training_layout
from tests.bench_reports import empty_report


def _exposition(values: list[float], buckets: tuple[float, ...], **labels: str) -> str:
    registry = CollectorRegistry()
    histogram = Histogram("h", "test", list(labels), buckets=buckets, registry=registry)
    series = histogram.labels(**labels) if labels else histogram
    for value in values:
        series.observe(value)
    return generate_latest(registry).decode()


def test_quantiles_interpolate_inside_buckets_like_prometheus() -> None:
    text = _exposition([0.5] * 50 + [1.5] * 50, buckets=(1, 2, 4))
    buckets, total, count = scrape.histogram([text], "h")
    assert count == 100 and total == pytest.approx(100.0)
    assert scrape.quantile(buckets, 0.5) == pytest.approx(1.0)  # the 50th observation ends bucket (0, 1]
    assert scrape.quantile(buckets, 0.75) == pytest.approx(1.5)  # halfway through bucket (1, 2]
    assert scrape.quantile(buckets, 0.99) == pytest.approx(1.98)
    assert scrape.upper_bound(buckets) == 2


def test_histograms_sum_over_expositions_and_select_labels() -> None:
    a = _exposition([0.1, 0.1], buckets=(0.2, 1), hop="a")
    b = _exposition([0.5], buckets=(0.2, 1), hop="a")
    other = _exposition([0.9] * 5, buckets=(0.2, 1), hop="b")
    buckets, total, count = scrape.histogram([a, b, other], "h", hop="a")
    assert count == 3 and total == pytest.approx(0.7)
    assert dict(buckets)[0.2] == 2 and dict(buckets)[1.0] == 3


def test_quantile_of_nothing_is_none_and_bad_q_is_refused() -> None:
    buckets, _, count = scrape.histogram([_exposition([], buckets=(1,))], "h")
    assert count == 0 and scrape.quantile(buckets, 0.5) is None and scrape.upper_bound(buckets) is None
    with pytest.raises(ValueError, match="quantile"):
        scrape.quantile([(1.0, 1.0)], 1.5)


def test_a_quantile_past_the_last_bound_reports_that_bound() -> None:
    buckets, _, _ = scrape.histogram([_exposition([10.0], buckets=(1, 2))], "h")
    assert scrape.quantile(buckets, 0.99) == 2.0 and math.isinf(scrape.upper_bound(buckets) or 0)


def _window(points: list[tuple[float, float]], warmup_fraction: float) -> tuple[float, float]:
    """(steps, seconds) between the ends of `steady_span`: what a rate is taken over."""
    first, last = steady_span(points, warmup_fraction)
    return last[0] - first[0], last[1] - first[1]


def test_steady_window_leaves_out_the_warm_up() -> None:
    # 100 steps in the first 10 s (slow start), then 100 steps/s.
    points = [(0, 0.0), (100, 10.0), (600, 15.0), (1100, 20.0)]
    assert _window(points, warmup_fraction=0.05) == (1000, 10.0)
    assert _window(points, warmup_fraction=0.0) == (1100, 20.0)
    with pytest.raises(ValueError, match="at least 2"):
        _window([(5, 1.0)], 0.1)
    with pytest.raises(ValueError, match="no progress"):
        _window([(0, 0.0), (10, 1.0)], 0.99)


def test_steady_span_carries_further_counters_along() -> None:
    points = [(0, 0.0, 0), (100, 10.0, 0), (600, 15.0, 1), (1100, 20.0, 3)]
    first, last = steady_span(points, warmup_fraction=0.05)
    assert first == (100, 10.0, 0) and last == (1100, 20.0, 3)


def test_every_run_the_bench_times_is_described_by_its_flags() -> None:
    bench = ThroughputBenchSettings(
        env="splitrl/Catch-v0", action_repeat=3, chunks_per_update=5, unroll_length=7, epochs=2, learning_rate=1e-3,
        num_envs=5, seed=4, codec="frame+zstd", activation_codec="int8", steps=999, torch_threads=2,
        learner_nice=7,
    )  # fmt: skip
    run = run_settings(bench, "split")
    assert (run.env, run.action_repeat, run.chunks_per_update, run.unroll_length) == ("splitrl/Catch-v0", 3, 5, 7)
    assert (run.epochs, run.learning_rate, run.num_envs, run.seed, run.steps) == (2, 1e-3, 5, 4, 999)
    assert (run.mode, run.codec, run.activation_codec, run.gradient_codec) == ("split", "frame+zstd", "int8", "int8")
    assert run.torch_threads == 2 and run.learner_nice == 7 and not run.train_every_step
    assert run_settings(bench.model_copy(update={"train_every_step": True}), "cloud").train_every_step


def test_sync_ppo_trains_once_per_chunks_per_update_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 envs, chunks of 4: a chunk per env is cut at vector steps 5, 9, 13, ... (a cut waits for its bootstrap
    # step is acted on), so 4 chunks are in after vector steps 9, 17, 25, and the final act after the 32nd
    # vector step (64 agent steps) cuts the last rollout for its update, as SB3 ends with one: 4 updates.
    bench = ThroughputBenchSettings(
        env="splitrl/Catch-v0", frame_size=36, width=32, num_envs=2, unroll_length=4, chunks_per_update=4,
        epochs=2, minibatches=2, steps=64,
    )  # fmt: skip
    laid_out: list[torch.nn.Module] = []
    monkeypatch.setattr(
        baseline, "to_training_layout", lambda network: laid_out.append(network) or to_training_layout(network)
    )
    result = run_sync_ppo(run_settings(bench, "cloud"), warmup_fraction=0.0)
    assert result.total_steps == result.steps == 64 and result.updates == 4
    assert len(laid_out) == 1  # the acting network trains in the stack learner's layout
    assert result.update_us_per_step is not None and result.update_us_per_step > 0
    assert result.env_us_per_step is not None and result.model_us_per_step is not None
    assert result.wall_seconds >= result.seconds > 0
    # Its pace: 3 updates, from the 1st one's completion to the 4th's, on its points' wall clock (not CPU time).
    assert result.paced_updates == 3 and 0 < result.paced_seconds <= result.seconds
    # CPU over the same window as the rate: at least its env and update time (one thread), at most its cores' worth.
    assert result.cpu_seconds is not None and result.cpu_ms_per_step is not None
    assert 0.5 * (result.env_us_per_step + result.update_us_per_step) * 64 / 1e6 < result.cpu_seconds
    assert result.cpu_seconds < (result.seconds + 0.05) * max(torch.get_num_threads(), 1) * 1.5


def test_the_single_process_references_train_on_their_own_threads(monkeypatch, tmp_path) -> None:
    """sync-ppo and SB3 run as a user runs one training process (--reference-torch-threads: torch's default
    unless given), while the act-only baseline, the overhead's reference, runs on each stack service's threads."""
    from splitrl.bench import sb3_reference, throughput

    threads: dict[str, int] = {}

    def timed(name: str):
        def measure(run, warmup_fraction: float) -> BaselineResult:
            threads[name] = run.torch_threads
            return BaselineResult(1000, 1.0, 1.0, 1.0, 1.0, updates=1, wall_seconds=1.0, total_steps=1000)

        return measure

    def stack(settings, mode, run_dir) -> StackResult:
        threads[f"stack {mode}"] = throughput.run_settings(settings, mode, run_dir).torch_threads
        return StackResult(mode, 1000, 1.0, 1.0, {}, 1.0, 0.0, 0.0, 0, {}, str(run_dir))

    monkeypatch.setattr(throughput, "run_baseline", timed("baseline"))
    monkeypatch.setattr(throughput, "run_sync_ppo", timed("sync-ppo"))
    monkeypatch.setattr(sb3_reference, "measure_sb3", timed("sb3-ppo"))
    monkeypatch.setattr(throughput, "run_stack", stack)
    bench = ThroughputBenchSettings(
        env="splitrl/Catch-v0", modes=["cloud"], sb3_reference=True, skip_link=True, torch_threads=1,
        reference_torch_threads=3, out=tmp_path,
    )  # fmt: skip
    report = ThroughputReport(settings=json.loads(bench.model_dump_json()))
    throughput._measure_all(bench, run_settings(bench, "cloud"), report)
    assert threads == {"baseline": 1, "sync-ppo": 3, "sb3-ppo": 3, "stack cloud": 1}
    assert "torch threads 1 per process (3 in sync-ppo and sb3-ppo)" in render_markdown(report)


def test_the_training_table_compares_every_trainer_with_each_reference() -> None:
    report = empty_report(action_repeat=4)
    report.baselines = [BaselineResult(1000, 1.0, 700.0, 300.0)]
    paced = {"paced_updates": 1, "paced_seconds": 5.0}  # updates/s: the learner's pace, 1 update in 5 s
    report.trained = {
        "sync-ppo": BaselineResult(1000, 10.0, 50.0, 20.0, 30.0, 2, wall_seconds=12.0, total_steps=1024, **paced),
        "sb3-ppo": BaselineResult(1000, 20.0, None, None, None, 2, wall_seconds=25.0, total_steps=1024,
                                  paced_updates=1, paced_seconds=10.0),
    }  # fmt: skip
    report.stacks = [
        StackResult("cloud", 2000, 10.0, 15.0, {}, 8.0, 1.0, 2.0, 5, {}, "r", env_steps_total=2048, updates=4,
                    paced_updates=2, paced_seconds=5.0)
    ]  # fmt: skip
    text = render_markdown(report)
    assert "one PPO update per 512 agent steps (16 chunks of 32), 4 epochs of 4 minibatches" in text
    assert "| sync-ppo | 400.0 | 1.00 | 2.00 | 0.200 | 500 | 12.0 to 4,096 frames |" in text
    assert "| sb3-ppo | 200.0 | 0.50 | 1.00 | 0.100 | 500 | 25.0 to 4,096 frames |" in text
    assert "| stack cloud | 800.0 | 2.00 | 4.00 | 0.400 | 500 | 15.0 to 8,192 frames |" in text
    assert "sync-ppo time per agent step: env 50 us, act 20 us, update 30 us." in text
    report.stacks[0] = replace(report.stacks[0], paced_updates=0, paced_seconds=0.0)  # fewer than 2 updates seen
    assert "| stack cloud | 800.0 | 2.00 | 4.00 | - | 500 | 15.0 to 8,192 frames |" in render_markdown(report)
    assert "float32" not in text
    report.settings["train_precision"] = "bfloat16"
    assert "trains in bfloat16 (--train-precision); SB3 in float32." in render_markdown(report)


@pytest.mark.parametrize("size", [64, 512, 8192, 73728, 300_001])
def test_link_messages_are_tensors_of_exactly_the_asked_size(size: int) -> None:
    data = tensor_message(size)
    assert len(data) == size
    assert wire.decode(wire.Tensor.FromString(data)).dtype.is_floating_point is False


def test_the_report_states_ratios_overheads_and_link_costs() -> None:
    report = ThroughputReport(settings={"env": "E", "num_envs": 8, "steps": 800, "torch_threads": 1})
    report.baselines = [BaselineResult(1000, 1.0, 700.0, 300.0), BaselineResult(1000, 1.0, 700.0, 300.0)]
    hop = Hop(count=10, mean_s=0.002, p50_s=0.0015, p99_s=0.009)
    report.stacks = [
        StackResult(
            "split-accumulate",
            800,
            1.0,
            1.2,
            {"edge-inference": hop},
            8.0,
            1.5,
            3.0,
            4,
            {"learner": 0.6, "environment": 0.5},
            "r",
            resident_bytes={"environment": 98 * 2**20},
            env_steps_total=1000,
            peak_resident_bytes={"environment": 103 * 2**20},
        )
    ]
    report.links = [LinkResult("tcp", 512, 1000, 1.0), LinkResult("grpc", 512, 100, 1.0)]
    text = render_markdown(report)
    assert "| stack split-accumulate | 800.0 | **0.80** | 250 | 8.0 | 1.50 / 3 | 4 |" in text
    assert "| edge-inference | 2.00 / 1.50 / 9.00 |" in text
    assert "| learner | 0.50 |" in text  # 0.6 CPU s over 1.2 wall s
    assert "| environment | 98 (103) / 0.50 |" in text  # 98 MiB, at most 103; 0.5 CPU s over 1,000 env steps
    assert "| edge-encoder | - |" in text
    assert "| 512 B | 1,000 | 100 | 0.5 | 0.1 | 0.10 |" in text
    assert "gRPC WAN" not in text
    report.links.append(LinkResult("grpc-wan", 512, 120, 1.0))
    assert "| 512 B | 1,000 | 100 | 0.5 | 0.1 | 0.10 | 120 | 1.20 |" in render_markdown(report)
    report.settings |= {"train_precision": "float32", "encoder_precision": "bfloat16", "modes": ["cloud"]}
    title = "### Throughput: E, 8 envs, 800 env steps per run, torch threads 1 per process"
    assert render_markdown(report).startswith(title + "\n")  # no split mode ran: no edge encoder to name
    report.settings["modes"] = ["cloud", "split-accumulate"]
    assert render_markdown(report).startswith(title + ", split edge encoder in bfloat16\n")
    report.cores, report.machine = 2, "AMD EPYC, torch kernels AVX2"
    assert render_markdown(report).startswith(
        title + ", split edge encoder in bfloat16\n\nMachine: 2 cores of AMD EPYC, torch kernels AVX2\n\n| run |"
    )
    assert as_json(report)["machine"] == "AMD EPYC, torch kernels AVX2"


def test_the_machine_is_named_by_its_cpu_model_and_torch_kernels(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\nflags\t: avx2\n")
    assert cpu_model(cpuinfo) == "AMD EPYC 9B14"
    cpuinfo.write_text("processor\t: 0\nmodel name\t:\n")  # a blank name, as some VMs give: the platform's
    assert cpu_model(cpuinfo) == (platform.processor() or "unknown")
    assert cpu_model(tmp_path / "absent") == (platform.processor() or "unknown")
    assert machine_description().endswith(f", torch kernels {torch.backends.cpu.get_cpu_capability()}")


def test_sb3s_learning_rate_anneals_by_the_models_own_steps_across_a_save_and_load(tmp_path):
    """The SB3 reference follows --lr-anneal-steps as splitrl's learner does, resumed segments included."""
    sb3 = pytest.importorskip("stable_baselines3")
    from splitrl.bench.sb3_reference import AnnealedRate, _with_schedule

    env = gym.make("CartPole-v1")
    model = _with_schedule(
        sb3.PPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=1, learning_rate=AnnealedRate(1e-3, 256))
    )
    model.learn(64)  # update 0: splitrl's learner trains it at the full rate
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    model.learn(64, reset_num_timesteps=False)  # update 1, after 64 steps of training
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 64 / 256))
    model.save(tmp_path / "model.zip")
    loaded = _with_schedule(sb3.PPO.load(tmp_path / "model.zip", env=env))
    loaded.learn(64, reset_num_timesteps=False)  # update 2
    assert loaded.policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 128 / 256))


def test_sb3s_entropy_bonus_anneals_as_splitrls_before_each_update():
    """--entropy-anneal-steps: SB3 has no entropy schedule, so a callback sets ent_coef after each rollout."""
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.callbacks import BaseCallback

    from splitrl.bench.sb3_reference import _callbacks
    from splitrl.run.settings import RunSettings

    seen: list[float] = []

    class TrainSpy(BaseCallback):  # runs after the anneal callback at each rollout's end, before train()
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            seen.append(self.model.ent_coef)

    run = RunSettings(entropy_coef=0.02, entropy_anneal_steps=256)
    model = sb3.PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=64, batch_size=32, n_epochs=1, ent_coef=0.5)
    model.learn(64 * 5, callback=[*_callbacks(run, TrainSpy()), TrainSpy()])
    assert seen[1::2] == pytest.approx([0.02, 0.015, 0.01, 0.005, 0.0])  # the update after k updates of 64
    assert _callbacks(RunSettings(), TrainSpy())[1:] == []  # constant: nothing added


def test_sb3_reference_takes_the_recipes_ppo_settings():
    """Equal hyperparameters: the SB3 peer's clip, loss weights and gradient clip are the recipe's, not SB3's."""
    pytest.importorskip("stable_baselines3")
    from splitrl.bench.sb3_reference import _new_model, _vector_env
    from splitrl.run.settings import RunSettings

    run = RunSettings(
        env="splitrl/Catch-v0",
        frame_size=36,
        num_envs=2,
        env_groups=1,
        unroll_length=8,
        chunks_per_update=4,
        epochs=3,
        minibatches=2,
        clip=0.1,
        entropy_coef=0.02,
        value_coef=0.25,
        max_grad_norm=1.5,
        gamma=0.97,
        gae_lambda=0.9,
    )
    venv = _vector_env(run, seed=0)
    try:
        model = _new_model(run, venv, seed=0)
    finally:
        venv.close()
    assert model.clip_range(1.0) == pytest.approx(0.1)
    assert (model.ent_coef, model.vf_coef, model.max_grad_norm) == (0.02, 0.25, 1.5)
    assert (model.n_steps, model.batch_size, model.n_epochs) == (16, 16, 3)
    assert (model.gamma, model.gae_lambda) == (0.97, 0.9)


def test_a_stack_run_too_brief_to_time_says_to_raise_steps(tmp_path):
    """800 Catch steps end before the curve's second point: one live point, no rate, a message, not a trace."""
    live = {"env_steps": 800, "seconds": 0.9, "updates": 1, "last_update_at": 1.7e9}
    curve = [live, {"env_steps": 800, "updates": 1}]  # the last: the final point
    (tmp_path / "summary.json").write_text(json.dumps({"curve": curve}))
    with pytest.raises(RuntimeError, match=r"stack cloud ran too briefly to time .*raise --steps"):
        read_stack("cloud", tmp_path, warmup_fraction=0.15)


def _budget_report(**settings: object) -> ThroughputReport:
    """2 cores; sync-ppo at 4 CPU ms per agent step (env 2 ms), SB3 at 250 agent steps/s, and a cloud stack at
    300 agent steps/s spending 6 CPU ms per agent step after the warm-up (its CPU read when 1,000 of its 4,000
    env steps were taken)."""
    report = empty_report(**({"steps": 4000} | settings))
    report.cores = 2
    report.baselines = [BaselineResult(1000, 1.0, 700.0, 300.0)]
    report.trained = {
        "sync-ppo": BaselineResult(3000, 10.0, 2000.0, 500.0, 1500.0, updates=6, cpu_seconds=12.0),
        "sb3-ppo": BaselineResult(2500, 10.0, None, None, None, updates=5, cpu_seconds=11.5),
    }
    cpu_at_end = {"environment": 10.0, "learner": 9.0, "inference": 4.0}
    cpu_at_warm_up = {"environment": 2.5, "learner": 2.0, "inference": 0.5}  # 18 CPU s over 3,000 steps
    report.stacks = [
        StackResult(
            "cloud", 3000, 10.0, 14.0, {}, 4.0, 1.0, 2.0, 6, cpu_at_end, "r",
            env_steps_total=4000, warm_env_steps=1000, warm_cpu_seconds=cpu_at_warm_up,
        ),
        StackResult("split", 2000, 10.0, 14.0, {}, 4.0, 1.0, 2.0, 6, cpu_at_end, "r", env_steps_total=4000),
    ]  # fmt: skip
    return report


def test_the_report_says_what_the_cores_allow_the_stack() -> None:
    report = _budget_report(reference_torch_threads=1)
    assert report.stacks[0].cpu_ms_per_step == pytest.approx(6.0)
    assert report.stacks[1].cpu_ms_per_step is None  # no warm-up reading: unknown, not counted from the start
    text = render_markdown(report)
    assert "| sync-ppo | 300.0 | 4.00 | 1.20 |" in text
    assert "| sb3-ppo | 250.0 | 4.60 | 1.15 |" in text
    assert "| stack cloud | 300.0 | 6.00 | 1.80 |" in text
    assert "| stack split | 200.0 | - | - |" in text
    # sync-ppo's work on one thread: 2 + 0.5 + 1.5 = 4 ms per agent step; 2 cores / 4 ms = 500 agent steps/s,
    # no more than the env process's 1 / 2 ms = 500: not capped.
    assert (
        "at most 500 agent steps/s on these 2 cores (1.67x sync-ppo, 2.00x sb3-ppo): sync-ppo's work, 4.00 ms" in text
    )
    assert "capped" not in text
    # 1.5 x 250 = 375 agent steps/s on 2 cores: 5.33 ms per agent step.
    assert "1.5x sb3-ppo (375 agent steps/s) allows 5.33 CPU ms per agent step with every core busy" in text
    assert "| cloud | 6.00 | 0.67 (11%) |" in text
    assert "| split | - | - |" in text
    report.stacks[0] = replace(report.stacks[0], cpu_seconds={"environment": 8.0, "learner": 7.0, "inference": 3.0})
    assert "| cloud | 4.33 | none |" in render_markdown(report)  # 13 CPU s over 3,000 steps


def test_the_cores_bound_needs_sync_ppo_on_one_thread_and_is_capped_by_one_env_process() -> None:
    report = _budget_report(reference_torch_threads=1)
    report.trained["sync-ppo"] = BaselineResult(3000, 10.0, 2500.0, 500.0, 1000.0, updates=6, cpu_seconds=12.0)
    assert "at most 400 agent steps/s on these 2 cores (1.33x sync-ppo, 1.60x sb3-ppo)" in render_markdown(report)
    assert "capped by the environment process stepping every env on one core (400)" in render_markdown(report)
    workers = _budget_report(reference_torch_threads=1, env_workers=True)  # the envs step on every core: no cap
    workers.trained["sync-ppo"] = report.trained["sync-ppo"]
    assert "at most 500 agent steps/s" in render_markdown(workers)
    # On 2 threads sync-ppo's phases are not one core's work (and its CPU counts spinning threads): no bound.
    two_threads = render_markdown(_budget_report(reference_torch_threads=2))
    assert "At no CPU cost" not in two_threads and "--reference-torch-threads 1 adds the stack's bound" in two_threads
    assert "| cloud | 6.00 | 0.67 (11%) |" in two_threads  # the budget stands on SB3's rate alone
    report.cores = 0  # not recorded (a report from before the cores were): CPU per run, no bound, no budget
    assert "| stack cloud | 300.0 | 6.00 | 1.80 |" in render_markdown(report)
    assert "At no CPU cost" not in render_markdown(report) and "allows" not in render_markdown(report)
    report.trained = {name: replace(r, cpu_seconds=None) for name, r in report.trained.items()}
    report.stacks = []
    assert "CPU per agent step" not in render_markdown(report)
