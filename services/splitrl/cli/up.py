"""`splitrl up`: a whole training run on this machine, every service its own process on loopback.

Start order follows the dial direction (replay, inference, learner,
edge-encoder, environment), each waiting for the previous one's port file. The run ends
when the environment has taken `steps` agent steps; services then stop
upstream-first so every queue drains into the next, each writing its final
counters, from which `summary.json` is built. A service that dies mid-run is
restarted with the same flags and ports (cli.processes.Supervisor, up to
--max-restarts times each). Ctrl-C (or SIGTERM) stops all children; a child also
dies if this process is killed (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from splitrl.cli import run_dir as run_dir_files
from splitrl.cli.processes import START_ORDER, Child, GaveUp, StartFailed, Supervisor, stop_all
from splitrl.cli.progress import Progress
from splitrl.cli.tensorboard import TensorBoardLog
from splitrl.core import certs, scrape
from splitrl.core.config import EnvSettings, FloatCodec, Mode, ObservationCodec, Settings, TlsMode
from splitrl.core.video import VideoSettings


class UpSettings(EnvSettings, VideoSettings, Settings):
    """Train locally: start all services as processes on loopback, run STEPS env steps, write a run summary."""

    mode: Mode = Field("split", description="Training mode: cloud, split or split-accumulate.")
    codec: ObservationCodec = Field(
        "frame",
        description="Cloud mode's observation codec: frame, frame+zstd, h264 (a video stream per env, see "
        "--video-crf) or stack-bf16.",
    )
    activation_codec: FloatCodec = Field(
        "bf16", description="Split modes: activation codec on the WAN: bf16, int8, int4 or fp8, optionally +zstd."
    )
    gradient_codec: FloatCodec = Field(
        "bf16", description="Split modes: gradient codec on the WAN: bf16, int8, int4 or fp8, optionally +zstd."
    )
    steps: int = Field(2048, ge=1, description="Agent steps to take, over all envs (rounded up to num_envs).")
    num_envs: int = Field(4, ge=1, le=1024, description="Envs in the environment process.")
    env_groups: int = Field(
        1, ge=1, le=64, description="Groups the envs are split into, each stepped while the others wait for actions."
    )
    action_repeat: int = Field(1, ge=1, le=16, description="Times each action is repeated.")
    unroll_length: int = Field(32, ge=1, description="Steps per trajectory chunk.")
    seed: int = Field(0, ge=0, description="Seed for envs and initial weights.")
    run_dir: Path | None = Field(None, description="Where logs and summary.json go (default runs/<time>-<mode>).")
    progress_interval_s: float = Field(1.0, gt=0, description="Seconds between live progress updates.")
    start_timeout_s: float = Field(120.0, gt=0, description="Seconds each service may take to start serving.")
    torch_threads: int = Field(1, ge=1, description="torch threads per service process.")
    chunks_per_update: int = Field(16, ge=1, description="Learner: trajectory chunks per PPO update.")
    epochs: int = Field(4, ge=1, description="Learner: epochs per update (the research used 10).")
    minibatches: int = Field(4, ge=1, description="Learner: minibatches per epoch (the research used 32).")
    learning_rate: float = Field(2.5e-4, gt=0, description="Learner: Adam learning rate.")
    correction: Literal["gae", "vtrace"] = Field("gae", description="Learner: GAE (PPO) or V-trace advantages.")
    gamma: float = Field(0.99, ge=0, le=1, description="Learner: discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="Learner: GAE (and V-trace) lambda.")
    entropy_coef: float = Field(0.01, ge=0, description="Learner: weight of the entropy bonus.")
    reward_scale: float = Field(1.0, gt=0, description="Learner: rewards are multiplied by this for training.")
    encoder_fraction: float = Field(
        0.25, ge=0, le=1, description="split-accumulate: share of minibatch rows whose gradients go to the edge."
    )
    replay_max_size: int | None = Field(
        None,
        ge=1,
        description="Chunks replay holds, oldest evicted first. Default 2 x chunks_per_update: the learner trains "
        "on fresh chunks (policy lag about 2 updates) instead of working through a backlog.",
    )
    tensorboard: bool = Field(
        True, description="Write TensorBoard event files to RUN_DIR/tensorboard/ (--no-tensorboard: none)."
    )
    max_restarts: int = Field(
        5, ge=0, description="Times a service that dies is restarted (same flags and ports) before the run gives up."
    )
    tls: TlsMode = Field(
        "mtls",
        description="gRPC links between the services: mtls (a throwaway CA and certificates under "
        "RUN_DIR/tls/), tls, or plaintext (unencrypted and unauthenticated, with a warning).",
    )


def prepare_tls(settings: UpSettings, run_dir: Path) -> None:
    """A fresh CA and a certificate per service under RUN_DIR/tls/ (none under plaintext, which warns instead)."""
    if settings.tls == "plaintext":
        print("splitrl up: --tls plaintext: links are unencrypted and unauthenticated", file=sys.stderr)
        return
    certs.generate(run_dir / "tls", START_ORDER)


def tls_flags(name: str, settings: UpSettings, run_dir: Path) -> dict[str, Any]:
    """Service `name`'s transport flags: its own certificate from prepare_tls, and the run's CA."""
    if settings.tls == "plaintext":
        return {"tls": "plaintext"}
    tls_dir = run_dir / "tls"
    return {
        "tls": settings.tls,
        "tls_cert_file": tls_dir / f"{name}.pem",
        "tls_key_file": tls_dir / f"{name}-key.pem",
        "tls_ca_file": tls_dir / "ca.pem",
    }


def service_flags(
    name: str, settings: UpSettings, children: dict[str, Child], run_dir: Path, done_steps: int = 0
) -> dict[str, Any]:
    """Service `name`'s flags. `done_steps`: agent steps earlier segments of a resumed run took already."""
    shared = settings.env_flags()
    common = {
        "host": "127.0.0.1",
        "port": 0,
        "metrics_port": 0,
        "port_file": run_dir / f"{name}.ports.json",
        "final_metrics_file": run_dir / "metrics" / f"{name}.prom",
        "torch_threads": settings.torch_threads,
        **tls_flags(name, settings, run_dir),
    }

    def address(of: str) -> str:
        return f"127.0.0.1:{children[of].ports['grpc']}"

    if name == "replay":
        return {**common, "max_size": settings.replay_max_size or 2 * settings.chunks_per_update}
    if name == "inference":
        return {
            **common,
            **shared,
            "replay_address": address("replay"),
            "mode": settings.mode,
            "codec": settings.codec,
            "unroll_length": settings.unroll_length,
            "seed": settings.seed,
        }
    if name == "learner":
        return {
            **common,
            **shared,
            "replay_address": address("replay"),
            "inference_address": address("inference"),
            "mode": settings.mode,
            "seed": settings.seed,
            "checkpoint_dir": run_dir / "checkpoints",
            "chunks_per_update": settings.chunks_per_update,
            "epochs": settings.epochs,
            "minibatches": settings.minibatches,
            "learning_rate": settings.learning_rate,
            "correction": settings.correction,
            "gamma": settings.gamma,
            "gae_lambda": settings.gae_lambda,
            "entropy_coef": settings.entropy_coef,
            "reward_scale": settings.reward_scale,
            "encoder_fraction": settings.encoder_fraction,
            "gradient_codec": settings.gradient_codec,
        }
    if name == "edge-encoder":
        return {
            **common,
            **shared,
            "inference_address": address("inference"),
            "learner_address": address("learner"),
            "mode": settings.mode,
            "codec": settings.codec,
            "video_crf": settings.video_crf,
            "video_preset": settings.video_preset,
            "video_measure_psnr": settings.video_measure_psnr,
            "activation_codec": settings.activation_codec,
            "seed": settings.seed,
            "checkpoint_dir": run_dir / "checkpoints" / "edge-encoder",
        }
    return {
        **common,
        **shared,
        "encoder_address": address("edge-encoder"),
        "num_envs": settings.num_envs,
        "env_groups": settings.env_groups,
        "action_repeat": settings.action_repeat,
        "seed": settings.seed + done_steps,  # a resumed run plays tracks it has not played yet
        "max_steps": settings.steps - done_steps,
    }


def run_up(settings: UpSettings, resume: bool = False) -> int:
    """Run the whole stack until `settings.steps` agent steps; returns the process exit code.

    `resume`: `settings.run_dir` holds an earlier segment of this run; its checkpoints and curve go on.
    """
    run_dir = settings.run_dir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{settings.mode}"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics").mkdir(exist_ok=True)
    for stale in (run_dir / "metrics").glob("*.prom"):  # a reused run dir: count only this run
        stale.unlink()
    curve = run_dir_files.load_curve(run_dir) if resume else []
    offset = curve[-1] if curve else run_dir_files.zero_point()
    done_steps = int(offset["env_steps"])
    if done_steps >= settings.steps:
        print(f"splitrl up: {run_dir} already took {done_steps} of --steps {settings.steps}; raise --steps to go on")
        return 0
    if not resume:
        (run_dir / run_dir_files.CURVE_FILE).unlink(missing_ok=True)
    run_dir_files.save_settings(run_dir, settings.model_copy(update={"run_dir": run_dir}).model_dump_json(indent=2))
    interrupted = start_failed = died = False

    def flags_for(name: str) -> dict[str, Any] | None:
        steps = done_steps
        if name == "environment":  # a restarted environment takes only the steps still to take, on new tracks
            steps += int(scrape.total(supervisor.retired_texts("environment"), "splitrl_env_steps_total"))
            if steps >= settings.steps:
                return None
        return service_flags(name, settings, supervisor.children, run_dir, steps)

    supervisor = Supervisor(
        run_dir, flags_for, max_restarts=settings.max_restarts, start_timeout_s=settings.start_timeout_s
    )
    # Set SIGINT explicitly: a shell starts background jobs with it ignored, and Ctrl-C (or a
    # supervisor's SIGINT) must still stop the run cleanly.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    started = time.monotonic()
    progress = Progress(settings.steps, sys.stdout.isatty(), done_steps)
    tensorboard = TensorBoardLog(run_dir) if settings.tensorboard else None
    try:
        prepare_tls(settings, run_dir)
        supervisor.start_all()
        started = time.monotonic()
        while not supervisor.environment_done():
            supervisor.watch()
            live = supervisor.live_texts()
            texts = live + supervisor.retired_texts()
            progress.update(texts, time.monotonic() - started, supervisor.restarts)
            seconds = round(time.monotonic() - started, 3)
            point = run_dir_files.shifted(_curve_point(texts) | {"seconds": seconds}, offset)
            if _extend_curve(curve, point, run_dir) and tensorboard is not None:
                tensorboard.add(point, texts, live, offset)
            time.sleep(settings.progress_interval_s)
        elapsed = time.monotonic() - started
    except KeyboardInterrupt:
        interrupted, elapsed = True, time.monotonic() - started
        print("\ninterrupted: stopping services", file=sys.stderr)
    except StartFailed as error:
        print(f"splitrl up: {error}", file=sys.stderr)
        start_failed, elapsed = True, time.monotonic() - started
    except GaveUp as error:  # a service kept dying
        print(f"splitrl up: {error}", file=sys.stderr)
        died, elapsed = True, time.monotonic() - started
    finally:
        # A second Ctrl-C must not cut the clean-up short: children would linger and no summary be written.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_all(supervisor.children)
        progress.close()
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    if start_failed:  # no run took place: nothing that looks like a result
        return 1
    summary = build_summary(settings, run_dir, supervisor, elapsed, interrupted, curve, offset)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if tensorboard is not None:  # the final counters too: a short run may update only near its end
        shutdown = shutdown_texts(run_dir)
        tensorboard.add(curve[-1], shutdown + supervisor.retired_texts(), shutdown, offset)
        tensorboard.close()
    from splitrl.cli.plots import plot_run  # here: `splitrl serve` parses UpSettings too, and needs no matplotlib

    plot_run(summary, run_dir / "learning.png", run_dir_files.load_evals(run_dir))
    progress.print_summary(summary, run_dir / "summary.json")
    failed = [name for name, code in summary["exit_codes"].items() if code != 0]
    return 130 if interrupted else (1 if failed or died else 0)


def _extend_curve(curve: list[dict[str, float]], point: dict[str, float], run_dir: Path) -> bool:
    """Append `point` (and log it to RUN_DIR/curve.jsonl) unless a counter went backwards: a service that just
    exited took its series with it. Returns whether it was appended.

    return_sum is not checked: negative returns make it fall.
    """
    if not curve or all(point[key] >= curve[-1][key] for key in ("env_steps", "episodes", "updates", "wan_bytes")):
        curve.append(point)
        run_dir_files.append_curve(run_dir, point)
        return True
    return False


def _curve_point(texts: list[str]) -> dict[str, float]:
    """Cumulative counters at one moment; consecutive points give the mean return of each interval.

    `wan_bytes` is every byte sent on a WAN link so far (each direction counted once, by its sender).
    """
    wan = sum(scrape.wan_by_phase(scrape.link_counts(texts)).values())
    return {
        "env_steps": scrape.total(texts, "splitrl_env_steps_total"),
        "episodes": scrape.total(texts, "splitrl_episode_return_count"),
        "return_sum": scrape.total(texts, "splitrl_episode_return_sum"),
        "updates": scrape.total(texts, "splitrl_learner_updates_total"),
        "wan_bytes": float(wan),
    }


def shutdown_texts(run_dir: Path) -> list[str]:
    """The final /metrics each service wrote on shutdown."""
    return [p.read_text() for p in sorted((run_dir / "metrics").glob("*.prom"))]


def build_summary(
    settings: UpSettings,
    run_dir: Path,
    supervisor: Supervisor,
    elapsed_s: float,
    interrupted: bool,
    curve: list[dict[str, float]],
    offset: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The run summary: settings, env steps, and bytes / messages / elements per link, phase and payload.

    Counters are this segment's (services that died and were restarted included: `restarts` counts them);
    `resumed_at` is the curve point earlier segments of a resumed run ended at
    (zeros for a fresh run). Its `curve` is the whole run's, cumulative, ended with a point from the final
    counters; each point's `seconds` count service-serving time over all segments.
    """
    offset = offset or run_dir_files.zero_point()
    texts = shutdown_texts(run_dir) + supervisor.retired_texts()  # a restarted service's earlier counters too
    final = _curve_point(texts) | {"seconds": round(elapsed_s, 3)}
    _extend_curve(curve, run_dir_files.shifted(final, offset), run_dir)
    steps = int(scrape.total(texts, "splitrl_env_steps_total"))
    links = scrape.link_counts(texts)
    wan_bytes = scrape.wan_by_phase(links)
    episodes = int(scrape.total(texts, "splitrl_episode_return_count"))
    return_sum = scrape.total(texts, "splitrl_episode_return_sum")
    return {
        "settings": json.loads(settings.model_dump_json()),
        "interrupted": interrupted,
        "resumed_at": offset,
        "exit_codes": {name: child.process.returncode for name, child in supervisor.children.items()},
        "restarts": dict(supervisor.restarts),
        "env_steps": steps,
        "wall_seconds": round(elapsed_s, 3),
        "env_steps_per_second": round(steps / elapsed_s, 1) if elapsed_s > 0 else None,
        "episodes": episodes,
        "mean_episode_return": return_sum / episodes if episodes else None,
        "learner_updates": int(scrape.total(texts, "splitrl_learner_updates_total")),
        "wan_bytes": wan_bytes,
        "wan_bytes_per_env_step": {phase: b / steps for phase, b in wan_bytes.items()} if steps else {},
        "links": links,
        "curve": curve,
    }
