"""`RunSettings`: one description of a whole run, the model `splitrl up` parses and saves as RUN_DIR/settings.json.

It inherits the groups the services share (env, mode and codecs, seed, vectorised envs, chunks, PPO, video);
what it declares itself is only what no service has: the step budget, the run directory, and how the local
launcher behaves. `splitrl.run.plan` turns it into every service's settings. `EvalSettings` describes
`splitrl eval` (splitrl.run.evaluate). Nothing here imports torch: every command parses these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from splitrl.core.config import (
    CommaList,
    EnvSettings,
    ModeSettings,
    RewardSettings,
    SeedSettings,
    Settings,
    TlsMode,
    VideoSettings,
    field_of,
)
from splitrl.edge_encoder.settings import EncoderTrainingSettings
from splitrl.environment.settings import VecEnvSettings
from splitrl.inference.settings import ChunkSettings
from splitrl.learner.settings import PPOSettings


class RunSettings(
    EnvSettings,
    ModeSettings,
    SeedSettings,
    VecEnvSettings,
    ChunkSettings,
    PPOSettings,
    VideoSettings,
    EncoderTrainingSettings,
    RewardSettings,
):
    """Train locally: start all services as processes on loopback, run STEPS env steps, write a run summary."""

    steps: int = Field(2048, ge=1, description="Agent steps to take, over all envs (rounded up to num_envs).")
    run_dir: Path | None = Field(None, description="Where logs and summary.json go (default runs/<time>-<mode>).")
    progress_interval_s: float = Field(1.0, gt=0, description="Seconds between live progress updates.")
    verbose: bool = Field(False, description="Live progress shows each link's bytes sent too, per phase.")
    start_timeout_s: float = Field(120.0, gt=0, description="Seconds each service may take to start serving.")
    torch_threads: int = Field(1, ge=1, le=256, description="torch threads per service process.")
    learner_nice: int = Field(
        0,
        ge=0,
        le=19,
        description="CPU niceness of the learner processes (0-19; 0: as the others). Above 0, on a machine the "
        "services share, acting (environment, edge, inference) gets a core first and training the rest; whether "
        "that is faster depends on the mode (measure it with splitrl bench throughput).",
    )
    replay_max_size: int | None = Field(
        None,
        ge=1,
        description="Chunks replay holds, oldest evicted first. Default 2 x chunks_per_update: the learner trains "
        "on fresh chunks (policy lag about 2 updates) instead of working through a backlog.",
    )
    train_every_step: bool = Field(
        False,
        description="Acting waits for the learner instead of replay evicting chunks it has not trained on: replay "
        "holds at most one update's chunks that no update has taken (a samples-per-insert rate limiter of 1), and "
        "inference at most num_envs unacknowledged ones. Every env step is then trained once, as in synchronous "
        "PPO, on chunks about one update old, at the slower of the envs' and the learner's pace. Off: the envs "
        "run ahead and replay evicts the oldest chunks (a sixth to a quarter of cloud mode's CarRacing steps, "
        "once the learner is the slower side).",
    )
    tensorboard: bool = Field(
        True, description="Write TensorBoard event files to RUN_DIR/tensorboard/ (--no-tensorboard: none)."
    )
    inference_replicas: int = Field(
        1,
        ge=1,
        le=16,
        description="Inference processes: environment streams (--env-groups) are spread over them round-robin, "
        "and the learner publishes every version to each (instances inference, inference-1, ...).",
    )
    replay_shards: int = Field(
        1,
        ge=1,
        le=16,
        description="Replay servers (replay, replay-1, ...): inference replica r writes to shard r mod K, and the "
        "learner samples every shard; at most --inference-replicas, so that every shard is written.",
    )
    learners: int = Field(
        1,
        ge=1,
        le=16,
        description="Data-parallel learners (learner, learner-1, ...): each samples its share of every update, "
        "gradients are averaged every minibatch, learner (rank 0) publishes and checkpoints; in split modes the "
        "edges dial rank 0, which relays every rank's activations and gradients (one encoder step per minibatch).",
    )
    learner_rendezvous_port: int = Field(
        29500, ge=1, le=65535, description="--learners > 1: port where the learners meet (rank 0 serves it)."
    )
    max_restarts: int = Field(
        5, ge=0, description="Times a service that dies is restarted (same flags and ports) before the run gives up."
    )
    progress_timeout_s: float = Field(
        600.0,
        ge=0,
        description="End the run (non-zero, with the reason and the stuck services' last log lines) when its env "
        "steps or its learner updates stop growing for this many seconds; 0: never. Above the longest pause a "
        "healthy run takes: the first update's wait for chunks_per_update chunks, one update's duration with "
        "--train-every-step.",
    )
    replay_durable: bool = Field(
        True,
        description="Replay keeps its tables on disk under RUN_DIR/replay/ (write-ahead log and snapshots): a "
        "restarted replay, or --resume, restores every chunk it acknowledged. --no-replay-durable: in memory only.",
    )
    replay_fsync: Literal["always", "never"] = Field(
        "always",
        description="With --replay-durable: always = each insert is fsynced before replay acknowledges it "
        "(survives a power loss); never = written to the OS first (survives the replay's crash, not the machine's).",
    )
    tls: TlsMode = Field(
        "mtls",
        description="gRPC links between the services: mtls (a throwaway CA and certificates under "
        "RUN_DIR/tls/), tls, or plaintext (unencrypted and unauthenticated, with a warning).",
    )

    @model_validator(mode="after")
    def _replicas_fit(self) -> RunSettings:
        if self.chunks_per_update % self.learners:
            raise ValueError(f"chunks_per_update={self.chunks_per_update} must divide among learners={self.learners}")
        if self.replay_shards > self.inference_replicas:
            raise ValueError(
                f"replay_shards={self.replay_shards} exceeds inference_replicas={self.inference_replicas}: each "
                "inference replica writes to one shard, so a shard beyond them would never be written"
            )
        return self

    @model_validator(mode="after")
    def _steps_within_the_learning_rate_schedule(self) -> RunSettings:
        """A run that goes on past its annealed learning rate's end takes steps at a rate of 0: refused, since a
        longer --steps given alone (a resumed run) would otherwise train nothing past the old end."""
        if self.lr_anneal_steps is not None and self.steps > self.lr_anneal_steps:
            raise ValueError(
                f"steps={self.steps} goes past lr_anneal_steps={self.lr_anneal_steps}: the learning rate is 0 once "
                f"{self.lr_anneal_steps} steps are trained, so the steps after them would train nothing. To train "
                "further, raise --lr-anneal-steps with --steps (and --entropy-anneal-steps): the rate then resumes "
                "from the longer line's value at the steps already trained"
            )
        return self


#: The groups a run shares with services (RunSettings' bases): `plan` copies exactly these fields to each service
#: that has the group.
SHARED_GROUPS: tuple[type[Settings], ...] = RunSettings.__bases__


EVAL_SEED_BASE = 1_000_000_000
VIDEO_SUFFIXES = (".mp4", ".mkv", ".mov")


class PretrainSettings(EnvSettings, SeedSettings):
    """Pretrain the split edge's encoder on the edge alone: play a random policy in the env, train the encoder
    with a mirrored decoder to reconstruct its frame stacks, and write its weights for `splitrl up
    --encoder-init` (edge_encoder/pretrain.py says why). --config takes a run recipe's env, shapes and seed."""

    out: Path = Field(Path("encoder.pt"), description="File to write: the encoder's weights and the shapes they fit.")
    action_repeat: int = field_of(VecEnvSettings, "action_repeat")
    random_steps: int = Field(
        6000,
        ge=2,
        description="Agent steps the random policy plays, episodes restarting as they end; a tenth of the stacks "
        "is held out to measure the result. CarRacing at action repeat 4: ~25 s, ~230 steps an episode.",
    )
    random_action_hold: float = Field(
        0.75,
        ge=0,
        lt=1,
        description="Probability that the random policy keeps its previous action at each agent step.",
    )
    random_action_weights: CommaList[float] | None = Field(
        None,
        description="Discrete actions: comma-separated relative weights, one per action, of the random policy's "
        "draws (CarRacing's five: nothing, left, right, gas, brake; 1,2,2,4,1 drives the car down the track). "
        "Unset: uniform.",
    )
    pretrain_steps: int = Field(
        3000,
        ge=1,
        description="Adam steps of the autoencoder (CarRacing, 64 stacks of 4 x 96 x 96 on 2 threads: ~0.1 s each).",
    )
    pretrain_batch_size: int = Field(64, ge=1, description="Frame stacks per Adam step.")
    pretrain_learning_rate: float = Field(1e-3, gt=0, description="Adam learning rate of encoder and decoder.")
    torch_threads: int = Field(2, ge=1, le=256, description="torch intra-op threads.")


class EvalSettings(Settings):
    """Play the agent a run trained on episodes it never trained on; report mean, IQM and std of returns."""

    episodes: int = Field(100, ge=1, le=100_000, description="Episodes to play.")
    seed: int = Field(0, ge=0, description=f"Episode k is reset with seed {EVAL_SEED_BASE:,} + seed + k.")
    deterministic: bool = Field(
        True, description="Act with the most likely action (the mean, if continuous); --no-deterministic samples."
    )
    record: Path | None = Field(
        None, description="Write an MP4 (H.264; .mp4, .mkv or .mov) of the first --record-episodes here."
    )
    record_episodes: int = Field(1, ge=1, description="Episodes filmed into --record.")
    torch_threads: int = Field(1, ge=1, le=256, description="torch intra-op threads.")

    @field_validator("record")
    @classmethod
    def _video_file(cls, path: Path | None) -> Path | None:
        if path is not None and path.suffix.lower() not in VIDEO_SUFFIXES:
            raise ValueError(f"give an .mp4, .mkv or .mov file, got {str(path)!r}")
        return path
