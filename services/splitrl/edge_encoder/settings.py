from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field, model_validator

from splitrl.core.backoff import RedialSettings
from splitrl.core.config import (
    AddressList,
    EnvSettings,
    ModeSettings,
    Precision,
    SeedSettings,
    ServerSettings,
    Settings,
    VideoSettings,
)


class EncoderTrainingSettings(Settings):
    """How the edge's encoder learns from the gradients the learner sends down (split modes); a run's group."""

    encoder_learning_rate: float = Field(
        2.5e-4,
        gt=0,
        description="Adam learning rate of the edge encoder, before the learner's schedule: with "
        "--lr-anneal-steps each gradient the learner sends down carries the share of it to step at.",
    )
    encoder_max_grad_norm: float = Field(0.5, gt=0, description="Gradient norm clip of the edge encoder.")
    encoder_precision: Precision = Field(
        "float32",
        description="Number format of the split edge's encoder: its acting forwards and its training's forward and "
        "backward passes (and `splitrl eval`'s replay of it). bfloat16: convolutions and matrix products in "
        "bfloat16 under torch's CPU autocast; the activations sent to the codec, the weights, their gradients "
        "and Adam's state are float32. On a CPU with native bfloat16 (AVX512-BF16 or AMX) a CarRacing training "
        "step is faster and acting about the same; on one without, "
        "slower than float32 (the edge logs a warning). Cloud mode has no edge encoder.",
    )
    encoder_init: Path | None = Field(
        None,
        description="Split modes: start the edge's encoder from this file of `splitrl pretrain-encoder` (an "
        "autoencoder the edge trained on its own frames, no WAN bytes) instead of the seed's random weights; a "
        "checkpoint of the run's own (a restart, --resume) comes first, and then the file is not read. With "
        "--encoder-fraction 0 it stays as pretrained, so split-accumulate's stored activations never go stale.",
    )
    encoder_rows_per_pass: int = Field(
        0,
        ge=0,
        description="Rows the edge's encoder runs with a graph at once in training. 0: split keeps each "
        "minibatch's graph from its activations until its gradients come (~50 MB for 128 rows of 4 x 96 x 96). "
        "N > 0: activations are sent without a graph and run again N rows at a time when the gradients come, "
        "which bounds the edge's training memory by N rows for one more encoder forward pass per row.",
    )


#: How many times over the store holds the steps training may still ask for: as much again for a learner that
#: lags the edge (policy lag is ~2 updates; replay's rate limit, when set, bounds it).
STORE_HEADROOM = 2


def observation_store_size_for(replay_chunks: int, unroll_length: int, chunks_per_update: int, num_envs: int) -> int:
    """Steps one edge keeps so the learner finds every step it may ask for (split modes), with STORE_HEADROOM.

    A step can be asked for while its chunk is being filled (num_envs chunks per edge), waits in replay
    (replay_chunks, all of them this edge's at worst) or is in the update being trained (chunks_per_update);
    each chunk is unroll_length steps. A run of the defaults (4 envs, chunks of 32, 16 per update) keeps 3,328.
    """
    return STORE_HEADROOM * unroll_length * (num_envs + replay_chunks + chunks_per_update)


class EdgeEncoderSettings(
    ServerSettings, EnvSettings, ModeSettings, SeedSettings, RedialSettings, VideoSettings, EncoderTrainingSettings
):
    """Settings of `splitrl serve edge-encoder`. `seed` sets the encoder's initial weights (unless --encoder-init)."""

    inference_address: AddressList = Field(
        "127.0.0.1:50052",
        description="host:port of inference (the edge dials out); several, comma-separated, for inference "
        "replicas: each environment stream goes to the next replica in turn, and moves on when its stream breaks.",
    )
    edge_id: str = Field(
        default_factory=socket.gethostname, description="Name of this edge in logs (not a metric label)."
    )
    learner_address: str = Field(
        "127.0.0.1:50054", description="host:port of the learner, dialled for encoder training (split modes)."
    )
    observation_store_size: int = Field(
        16384,
        ge=1,
        description="Steps whose frame stacks the edge keeps for training, by step id (about one frame each: "
        "consecutive stacks share frames, kept zstd-compressed, ~1.1 KB for a 96x96 CarRacing frame). "
        "`splitrl up` and a recipe size it from the run "
        "(observation_store_size_for); a step asked for after eviction is counted and skipped.",
    )
    checkpoint_dir: Path | None = Field(
        None,
        description="Split modes: save encoder, its optimizer and encoder version here (encoder.pt) and resume "
        "from it at start; unset = a restarted edge starts again from the seed's weights (or --encoder-init's).",
    )
    checkpoint_every: int = Field(
        200, ge=1, description="Encoder optimizer steps between checkpoints (also saved on shutdown)."
    )
    inference_timeout_s: float = Field(
        20.0,
        gt=0,
        description="Longest wait (s) for inference to answer one step; past it the Act stream is reopened "
        "(keep it below the environment's peer_timeout_s).",
    )

    @model_validator(mode="after")
    def _shadow_in_split_modes(self) -> EdgeEncoderSettings:
        if self.video_shadow and self.mode == "cloud":
            raise ValueError(
                "video_shadow=True counts what cloud mode's H.264 stream would send during a split run; in "
                "mode='cloud' run --codec h264 instead, whose bytes are the measure itself"
            )
        return self

    @model_validator(mode="after")
    def _encoder_init_in_split_modes(self) -> EdgeEncoderSettings:
        if self.encoder_init is not None and self.mode == "cloud":
            raise ValueError(
                f"encoder_init={str(self.encoder_init)!r} starts the split edge's encoder, but mode='cloud' has "
                "none on the edge (it sends frames); use it with --mode split or split-accumulate"
            )
        return self
