"""Each training mode learns the fast pixel env, run exactly as a user runs it: `splitrl up`.

Catch's random policy scores about -0.67 (the paddle covers 2 of 12 columns).
Measured on a 2-core machine with these settings (seed 0, 4 envs, 36 x 36
frames, width 256; mean return per 4k steps; process timing varies, so onsets
shift by a few thousand steps from run to run), since hidden layers start
orthogonal with zero biases (core.models; one run each unless it says more):
  cloud             leaves random play at ~8-12k steps; +0.63 at 16-20k, +0.88 over the last 4k of 36k;
  split             leaves it at ~8-12k; +0.56 at 12-16k, +0.96 over the last 4k of 36k;
  split-accumulate  leaves it at ~8-12k (two runs); +0.78 and +0.83 by 36k, +0.98 and +0.61 over the last 4k
                    of 100k.
With torch's default init instead, a fresh encoder's features barely followed Catch's
mostly black frames (each varied by ~5% of its mean magnitude over 400 frames), so the head had nothing to act
on until the encoder trained: cloud and split left random play at ~17-20k, split-accumulate at 24-40k with a
long tail (a CI run scored -0.72 over the last 4k of 72k, another -0.13 over the last 4k of 100k).
And the narrow, cheap codecs of the bytes frontier:
  cloud --codec h264 (crf 23)                         leaves random play at ~8-12k; +0.92 over the last 4k of 36k;
  cloud --train-precision bfloat16 (the learner under bfloat16 autocast)
                                                      leaves it at ~8-12k; +0.93 over the last 4k of 36k (45 s);
  split-accumulate --width 32, int4 both ways         leaves it at ~12-16k; +0.5 to +0.7 per 4k from 20k on,
                                                      +0.58 over the last 4k of 84k (172 s);
  split --width 32 --bottleneck layernorm, int4 both ways, --encoder-epochs 1 (the encoder trains in the last
                                                      epoch only): leaves it at ~4-8k; +0.91 over the last 4k
                                                      of 40k (83 s).
  the same with --encoder-precision bfloat16 --train-precision bfloat16 (edge and learner under bfloat16
                                                      autocast): leaves it at ~8-12k; +0.92 over the last 4k
                                                      of 40k (59 s), float32 +0.86 beside it (64 s).
And scaled out:
  split-accumulate with --learners 2 --inference-replicas 2 --env-groups 2 (the ranks' encoder gradients relayed
                                                      through rank 0, one encoder step per minibatch): leaves
                                                      random play at ~12-16k in two runs; one held +0.71 to
                                                      +0.97 per 4k from 64k on (327 s), the other peaked at
                                                      +0.82 at 44-48k, then its policy's entropy fell to ~0.05
                                                      nats and it held +0.2 to +0.46 per 4k to 100k (277 s).
Each test runs past that onset: the first WINDOW_STEPS env steps must score near
random, and the last WINDOW_STEPS must clear THRESHOLD (far above random, below
what was measured).

split-accumulate (whose encoder steps on gradients from activations it made updates earlier) can lose ground
late: the scaled run above fell to +0.2 after peaking, and CI runs have scored about 0 over the last 4k of
100k, plain and scaled, where other runs of the same code held above +0.6 per 4k and ended near +0.9.
For the runs in LOSES_GROUND, and the scaled run, the test asks that the run learned (some 4k window clears
THRESHOLD) and kept most of it (the last 4k at least HELD above random: +0.4 is ~7 standard errors of a
window's ~250-300 episodes).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from splitrl.core import scrape
from splitrl.core.precision import cpu_has_native_bfloat16
from splitrl.run.summary import mean_return_between
from tests.ports import free_port

pytestmark = pytest.mark.e2e

RANDOM_RETURN = -0.67
THRESHOLD = 0.0
WINDOW_STEPS = 4000
HELD = 0.4
#: name -> (env steps, flags besides the shared ones)
RUNS: dict[str, tuple[int, list[str]]] = {
    "cloud": (36_000, ["--mode", "cloud", "--width", "256"]),
    "split": (36_000, ["--mode", "split", "--width", "256"]),
    "split-accumulate": (100_000, ["--mode", "split-accumulate", "--width", "256"]),
    "cloud-h264": (36_000, ["--mode", "cloud", "--codec", "h264", "--width", "256"]),
    "cloud-bfloat16": (36_000, ["--mode", "cloud", "--width", "256", "--train-precision", "bfloat16"]),
    "split-accumulate-w32-int4": (
        84_000,
        ["--mode", "split-accumulate", "--width", "32", "--activation-codec", "int4", "--gradient-codec", "int4"],
    ),
    "split-w32-int4-e1": (
        40_000,
        [
            *("--mode", "split", "--width", "32", "--bottleneck", "layernorm", "--encoder-epochs", "1"),
            *("--activation-codec", "int4", "--gradient-codec", "int4"),
        ],
    ),
    "split-w32-int4-e1-bfloat16": (
        40_000,
        [
            *("--mode", "split", "--width", "32", "--bottleneck", "layernorm", "--encoder-epochs", "1"),
            *("--activation-codec", "int4", "--gradient-codec", "int4"),
            *("--encoder-precision", "bfloat16", "--train-precision", "bfloat16"),
        ],
    ),
}
#: Runs whose last window may fall below THRESHOLD after they learned (see the module's docstring).
LOSES_GROUND = {"split-accumulate", "split-accumulate-w32-int4"}


def window_means(curve: list[dict[str, float]], steps: int) -> list[float]:
    """Mean return of each WINDOW_STEPS-long window of env steps in which an episode finished."""
    means = (mean_return_between(curve, start, start + WINDOW_STEPS)[0] for start in range(0, steps, WINDOW_STEPS))
    return [mean for mean in means if mean is not None]


def assert_learned(name: str, curve: list[dict[str, float]], steps: int, *, loses_ground: bool) -> None:
    """The last WINDOW_STEPS of a `steps`-long run clear THRESHOLD; for a run that loses ground, some window
    cleared it and the last stayed HELD above random play. A failure prints the whole curve."""
    last, last_episodes = mean_return_between(curve, steps - WINDOW_STEPS, steps)
    assert last_episodes >= 100, f"{name}: too few episodes in the last window: {last_episodes}"
    windows = window_means(curve, steps)
    shown = f"mean return per {WINDOW_STEPS} steps: " + ", ".join(f"{mean:+.2f}" for mean in windows)
    if loses_ground:
        assert max(windows) >= THRESHOLD, f"{name} never cleared {THRESHOLD:+.2f}; {shown}"
        assert last >= RANDOM_RETURN + HELD, f"{name} fell back towards random play ({last:+.2f}); {shown}"
    else:
        assert last >= THRESHOLD, f"{name}: {last:+.2f} over the last {WINDOW_STEPS} steps; {shown}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(RUNS))
def test_mode_learns_catch(tmp_path, name):
    steps, flags = RUNS[name]
    run_dir = tmp_path / name
    if "bfloat16" in flags and not cpu_has_native_bfloat16():
        # Emulated, bfloat16 passes are ~5x float32's (no AVX512-BF16 or AMX): the cloud run's learner made 14
        # updates in 36k env steps against float32's 70, the envs running ahead, and stayed at random play. Every
        # step trained keeps the updates per env step float32's, so the run shows learning, at ~4x its time.
        flags = [*flags, "--train-every-step"]
    command = [sys.executable, "-m", "splitrl.cli.main", "up", *flags, "--env", "splitrl/Catch-v0"]
    command += ["--steps", str(steps), "--frame-size", "36", "--seed", "0"]
    command += ["--run-dir", str(run_dir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    first, first_episodes = mean_return_between(summary["curve"], 0, WINDOW_STEPS)
    assert first_episodes >= 100, f"too few episodes in the first window: {first_episodes}"
    assert first < RANDOM_RETURN + 0.25, f"{name}: the first {WINDOW_STEPS} steps already score {first:+.2f}"
    assert_learned(name, summary["curve"], steps, loses_ground=name in LOSES_GROUND)
    assert summary["learner_updates"] > 0
    precisions = {flag: value for flag, value in itertools.pairwise(flags) if flag.endswith("-precision")}
    learner = precisions.get("--train-precision", "float32")
    assert f'train_precision="{learner}"' in (run_dir / "metrics" / "learner.prom").read_text()
    if "cloud" not in flags:  # only split modes' edges hold an encoder
        edge = precisions.get("--encoder-precision", "float32")
        assert f'encoder_precision="{edge}"' in (run_dir / "metrics" / "edge-encoder.prom").read_text()


@pytest.mark.timeout(900)
def test_split_accumulate_learns_with_two_learner_ranks_and_two_inference_replicas(tmp_path):
    """The ranks hand their encoder gradients to rank 0, which sends each minibatch's to the edge at once: the
    edge steps once per minibatch (16 per update here), both ranks end with the same weights, and it learns."""
    port = free_port()  # the rendezvous's, so parallel runs never meet
    steps, run_dir = 100_000, tmp_path / "scaled"
    command = [sys.executable, "-m", "splitrl.cli.main", "up", "--mode", "split-accumulate", "--width", "256"]
    command += ["--learners", "2", "--learner-rendezvous-port", str(port), "--inference-replicas", "2"]
    command += ["--env-groups", "2", "--env", "splitrl/Catch-v0", "--steps", str(steps), "--frame-size", "36"]
    command += ["--seed", "0", "--run-dir", str(run_dir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert_learned("scaled split-accumulate", summary["curve"], steps, loses_ground=True)

    def final(instance: str, metric: str) -> float:
        return scrape.total([(run_dir / "metrics" / f"{instance}.prom").read_text()], metric)

    updates = final("learner", "splitrl_learner_updates_total")
    assert updates == summary["learner_updates"] > 0
    # 4 epochs x 4 minibatches: one push per minibatch (128 rows draw some at 0.25), not one per rank per
    # minibatch (that would be ~32 per update). Measured: exactly 16 per update; +-1 update for the one that
    # may be under way when the run stops.
    encoder_steps = final("edge-encoder", "splitrl_encoder_updates_total")
    assert 16 * (updates - 1) <= encoder_steps <= 16 * (updates + 1), (encoder_steps, updates)
    checksums = {name: final(name, "splitrl_learner_weights_checksum") for name in ("learner", "learner-1")}
    assert checksums["learner"] == checksums["learner-1"] != 0, checksums
