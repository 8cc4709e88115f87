from __future__ import annotations

import socket

from pydantic import Field

from splitrl.core.config import EnvSettings, Mode, ObservationCodec, ServerSettings


class EdgeEncoderSettings(ServerSettings, EnvSettings):
    """Settings of `splitrl serve edge-encoder`."""

    inference_address: str = Field("127.0.0.1:50052", description="host:port of inference (the edge dials out).")
    mode: Mode = Field("split", description="Training mode: what crosses the WAN (see DESIGN.md §3).")
    codec: ObservationCodec = Field(
        "frame", description="Cloud mode only: 'frame' (one uint8 frame per step) or 'stack-bf16' (research)."
    )
    seed: int = Field(0, ge=0, description="Seed of the encoder's initial weights (must match the learner's).")
    edge_id: str = Field(
        default_factory=socket.gethostname, description="Name of this edge in logs (not a metric label)."
    )
