from __future__ import annotations

from typing import Literal

from pydantic import Field

from splitrl.core.backoff import RedialSettings
from splitrl.core.config import (
    AddressList,
    EnvSettings,
    ModeSettings,
    RewardSettings,
    SeedSettings,
    ServerSettings,
    Settings,
    shard_index,
    split_addresses,
)

#: What runs inference's acting pass: ONNX Runtime, or torch's own eager kernels (inference.policy).
ActingRuntime = Literal["onnxruntime", "torch"]


class ChunkSettings(Settings):
    """How inference cuts each env's steps into the trajectory chunks replay stores and the learner trains on."""

    unroll_length: int = Field(32, ge=1, le=4096, description="Steps per trajectory chunk written to replay.")


class InferenceSettings(
    ServerSettings, EnvSettings, ModeSettings, SeedSettings, ChunkSettings, RedialSettings, RewardSettings
):
    """Settings of `splitrl serve inference`. `mode` decides which streams it accepts; in cloud mode `codec`
    is what edges send (h264 streams are decoded per env)."""

    replay_address: AddressList = Field(
        "127.0.0.1:50053",
        description="host:port of replay, where trajectories go; with replay shards, every shard's, comma-separated, "
        "and this replica writes to entry (replica_index mod their count).",
    )
    replica_index: int = Field(
        0,
        ge=0,
        description="This inference's place among the replicas (0, 1, ...): it picks its replay shard. On "
        "Kubernetes, the StatefulSet pod's index (label apps.kubernetes.io/pod-index).",
    )
    replay_table: str = Field("rollouts", description="Replay table trajectories are inserted into.")
    acting_runtime: ActingRuntime = Field(
        "onnxruntime",
        description="What runs the policy's forward pass when acting: 'onnxruntime' (the same outputs within float32 "
        "rounding; on CarRacing's few-row batches far less CPU than torch, a session built per weights version off the "
        "acting thread) or 'torch' (its eager kernels, as the learner trains). Either uses --torch-threads threads.",
    )
    max_batch_size: int = Field(256, ge=1, le=65536, description="Most env rows in one policy batch.")
    max_wait_ms: float = Field(
        0.0,
        ge=0,
        description="Longest a request waits for others to join its batch (ms). 0: a batch runs as soon as the "
        "policy is free, with every request queued by then (more queue while it runs). More: the batch also waits, "
        "until every open stream is in, for streams whose envs are still stepping (larger batches, for a GPU).",
    )
    max_queued_requests: int = Field(
        1024,
        ge=1,
        description="Edge requests waiting for a batch before further ones wait to be queued (backpressure; "
        "each stream has at most one in flight).",
    )
    max_pending_inserts: int = Field(
        1024, ge=1, description="Chunks buffered for replay before acting blocks (backpressure)."
    )
    max_weight_magnitude: float = Field(
        1e4,
        gt=0,
        description="Published weights with any |value| above this are refused. Adam moves a weight by about the "
        "learning rate per step, so training reaches this only after ~1e7 steps at 1e-3; a bigger value is a "
        "broken or hostile learner (its forward pass overflows float32 long before 1e30).",
    )
    max_version_step: int = Field(
        1000,
        ge=1,
        description="On one Publish stream, each version may exceed the stream's previous by at most this many "
        "updates (a learner publishes after each update; coalesced publishes skip a few).",
    )

    @property
    def replay_shard_address(self) -> str:
        """The one replay this replica writes to (core.config.shard_index of the listed shards)."""
        shards = split_addresses(self.replay_address)
        return shards[shard_index(self.replica_index, len(shards))]
