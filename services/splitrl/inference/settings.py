from __future__ import annotations

from pydantic import Field

from splitrl.core.backoff import RedialSettings
from splitrl.core.config import EnvSettings, Mode, ObservationCodec, ServerSettings


class InferenceSettings(ServerSettings, EnvSettings, RedialSettings):
    """Settings of `splitrl serve inference`."""

    replay_address: str = Field("127.0.0.1:50053", description="host:port of replay, where trajectories go.")
    replay_table: str = Field("rollouts", description="Replay table trajectories are inserted into.")
    mode: Mode = Field("split", description="Training mode; decides which streams inference accepts.")
    codec: ObservationCodec = Field(
        "frame",
        description="Cloud mode only: the observation codec edges use (frame and frame+zstd both work; h264 "
        "streams are decoded per env).",
    )
    max_batch_size: int = Field(256, ge=1, le=65536, description="Most env rows in one policy batch.")
    max_wait_ms: float = Field(
        2.0, ge=0, description="Longest a request waits for others to join its batch (ms), unless all streams are in."
    )
    max_queued_requests: int = Field(
        1024,
        ge=1,
        description="Edge requests waiting for a batch before further ones wait to be queued (backpressure; "
        "each stream has at most one in flight).",
    )
    unroll_length: int = Field(32, ge=1, le=4096, description="Steps per trajectory chunk written to replay.")
    max_pending_inserts: int = Field(
        1024, ge=1, description="Chunks buffered for replay before acting blocks (backpressure)."
    )
    seed: int = Field(0, ge=0, description="Seed of the initial policy weights and of action sampling.")
