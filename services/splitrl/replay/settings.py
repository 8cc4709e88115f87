from __future__ import annotations

from pydantic import Field

from splitrl.core.config import ServerSettings


class ReplaySettings(ServerSettings):
    """Settings of `splitrl serve replay`."""

    table: str = Field("rollouts", min_length=1, description="Name of the table inference writes to.")
    max_size: int = Field(4096, ge=1, description="Items the table holds; the oldest is evicted beyond it.")
    min_size_to_sample: int = Field(1, ge=1, description="Sample calls wait until the table holds this many items.")
    max_trajectory_length: int = Field(4096, ge=1, description="Longest chunk (steps) an insert may carry.")
