"""Settings of `splitrl serve learner`, and the PPO group a run (`splitrl up`) shares with it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from splitrl.core.backoff import RedialSettings
from splitrl.core.config import (
    AddressList,
    EnvSettings,
    ModeSettings,
    Precision,
    SeedSettings,
    ServerSettings,
    Settings,
    split_addresses,
)

#: split-accumulate's share of rows that train the encoder when `encoder_fraction` is unset (split's is 1).
ACCUMULATE_ENCODER_FRACTION = 0.25
#: Longest wait (s) for one edge's answer to a training request before the learner gives up on those rows.
EDGE_REPLY_TIMEOUT_S = 60.0


class PPOSettings(Settings):
    """One PPO update and its optimizer. Defaults follow CleanRL's Atari recipe."""

    chunks_per_update: int = Field(16, ge=1, description="Trajectory chunks in one PPO update (x unroll_length steps).")
    epochs: int = Field(4, ge=1, description="Passes over each update's data (the research used 10).")
    minibatches: int = Field(4, ge=1, description="Minibatches per epoch (the research used 32).")
    learning_rate: float = Field(2.5e-4, gt=0, description="Adam learning rate (the research used 5e-5).")
    lr_anneal_steps: int | None = Field(
        None,
        ge=1,
        description="The learning rate falls linearly from --learning-rate to 0 over this many agent steps of "
        "training (updates x unroll_length x chunks_per_update, counted by the policy version, so a resumed run "
        "goes on down the same line), as CleanRL's anneal_lr. Steps trained, not env steps taken: set to the "
        "run's --steps, the rate ends above 0 when the learner trains on fewer steps than the envs take (cloud "
        "mode's ~512 of 620). Unset: constant. The split modes' edge encoders follow the same line from their "
        "--encoder-learning-rate (each gradient sent down carries the share).",
    )
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (also V-trace's lambda).")
    reward_scale: float = Field(
        1.0,
        gt=0,
        description="Rewards are multiplied by this before advantages and value targets (returns of hundreds, "
        "as CarRacing's, train a unit-scale value head badly); reported returns are unscaled.",
    )
    clip: float = Field(0.2, gt=0, description="PPO ratio clip.")
    entropy_coef: float = Field(0.01, ge=0, description="Weight of the entropy bonus.")
    entropy_anneal_steps: int | None = Field(
        None,
        ge=1,
        description="The entropy bonus falls linearly from --entropy-coef to 0 over this many agent steps of "
        "training, counted as --lr-anneal-steps counts them, so a policy that mixes actions it is indifferent "
        "between (CarRacing's throttle) sharpens as the run ends. Unset: constant.",
    )
    value_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    max_grad_norm: float = Field(0.5, gt=0, description="Gradient norm clip.")
    train_precision: Precision = Field(
        "float32",
        description="Number format of the learner's forward and backward passes. bfloat16: convolutions and "
        "matrix products in bfloat16 under torch's CPU autocast, the policy's and value's output layers, the "
        "weights, their gradients and Adam's state in float32. On a CPU with native bfloat16 (AVX512-BF16 or "
        "AMX) a CarRacing minibatch step is faster; on one without, "
        "it is slower than float32 (the learner logs a warning).",
    )
    correction: Literal["gae", "vtrace"] = Field(
        "gae", description="Advantages: GAE on behaviour values (PPO), or V-trace off-policy correction."
    )
    encoder_fraction: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Split modes: share of each minibatch's rows, drawn at random, that train the encoder. split "
        "fetches fresh activations for those rows only and sends their gradients down (the other rows train the "
        "head on the activations it holds), so its training bytes scale with this; split-accumulate pushes "
        f"their gradients. Unset: 1 in split (the research's split), {ACCUMULATE_ENCODER_FRACTION} in "
        "split-accumulate.",
    )
    encoder_epochs: int | None = Field(
        None,
        ge=1,
        description="Split modes: the last this many epochs of each update train the encoder (split: fresh "
        "activations up and their gradients down every minibatch; split-accumulate: gradients pushed down); "
        "earlier epochs train the head alone on the activations it holds, so it ends each update fitted to the "
        "encoder it will act with. Unset: every epoch (the research's split). 1 cuts split's training traffic "
        "by the number of epochs.",
    )


class LearnerSettings(ServerSettings, EnvSettings, ModeSettings, SeedSettings, PPOSettings, RedialSettings):
    """Settings of `splitrl serve learner`. `seed` sets the initial weights and minibatch shuffling; in split
    modes the encoder trains on the edges that dial in (port --port)."""

    replay_address: AddressList = Field(
        "127.0.0.1:50053",
        description="host:port of replay, where batches come from; several, comma-separated, for replay shards "
        "(each draw takes its share from every shard).",
    )
    replay_table: str = Field("rollouts", description="Replay table to sample from.")
    inference_address: AddressList = Field(
        "127.0.0.1:50052",
        description="host:port of inference, where weights go; several, comma-separated, for inference replicas "
        "(every version goes to each).",
    )
    max_policy_lag: int = Field(
        10, ge=0, description="Drop chunks whose oldest action is more than this many versions behind."
    )
    max_encoder_lag: int = Field(
        64,
        ge=0,
        description="split-accumulate: skip gradients of stored activations this many encoder versions behind.",
    )
    importance_beta: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Prioritized replay: importance-weight exponent beta (0 weighs every chunk 1; use 0 for fifo).",
    )
    priority_updates: bool = Field(
        False, description="After each update, send each chunk's mean |advantage| to replay as its new priority."
    )
    checkpoint_dir: Path | None = Field(None, description="Save model, optimizer and version here; resume from it.")
    checkpoint_every: int = Field(10, ge=1, description="Updates between checkpoints.")
    publish_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest wait (s) for inference to accept the weights stream or acknowledge one version; "
        "past it the stream is redialled.",
    )
    max_updates: int = Field(0, ge=0, description="Stop after this many updates (0: until stopped).")
    rank: int = Field(0, ge=0, description="Data-parallel learners: this learner's rank (0 publishes, checkpoints).")
    world_size: int = Field(
        1,
        ge=1,
        le=64,
        description="Data-parallel learners: ranks training together (1: alone). Split modes: edges dial rank 0, "
        "which relays the other ranks' activations and gradients.",
    )
    rendezvous_endpoint: str = Field(
        "127.0.0.1:29500",
        description="Data-parallel learners: host:port of the TCP store rank 0 serves, where the ranks meet.",
    )
    rendezvous_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Data-parallel learners: longest wait (s) for every rank to join, or for one step. In split "
        f"modes a step may wait on the edges' answers ({EDGE_REPLY_TIMEOUT_S:g} s at most), so it must be at least "
        "twice that.",
    )

    @field_validator("rendezvous_endpoint")
    @classmethod
    def _one_endpoint(cls, value: str) -> str:
        entries = split_addresses(value)
        if len(entries) != 1:
            raise ValueError(f"expected one host:port, got {value!r}")
        return entries[0]

    @model_validator(mode="after")
    def _data_parallel_fits(self) -> LearnerSettings:
        if self.rank >= self.world_size:
            raise ValueError(f"rank={self.rank} must be below world_size={self.world_size}")
        if self.chunks_per_update % self.world_size:
            raise ValueError(
                f"chunks_per_update={self.chunks_per_update} must divide among world_size={self.world_size} ranks"
            )
        if self.mode != "cloud" and self.world_size > 1 and self.rendezvous_timeout_s < 2 * EDGE_REPLY_TIMEOUT_S:
            raise ValueError(
                f"rendezvous_timeout_s={self.rendezvous_timeout_s:g} must be at least twice the "
                f"{EDGE_REPLY_TIMEOUT_S:g} s a {self.mode} step may wait on the edges while the other ranks wait "
                "in a collective"
            )
        return self
