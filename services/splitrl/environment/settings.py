from __future__ import annotations

from pydantic import Field, model_validator

from splitrl.core.backoff import RedialSettings
from splitrl.core.config import EnvSettings, ServerSettings


class EnvironmentSettings(ServerSettings, EnvSettings, RedialSettings):
    """Settings of `splitrl serve environment`."""

    encoder_address: str = Field("127.0.0.1:50051", description="host:port of the edge-encoder to stream to.")
    num_envs: int = Field(4, ge=1, le=1024, description="Envs stepped together; one message per vector step.")
    action_repeat: int = Field(1, ge=1, le=16, description="Times each action is repeated (rewards summed).")
    seed: int = Field(0, ge=0, description="Seed of the first env; env i gets seed + i.")
    max_steps: int = Field(
        0, ge=0, description="Stop after this many agent steps over all envs (0: run until stopped)."
    )
    env_groups: int = Field(
        1,
        ge=1,
        le=64,
        description="Split the envs into this many groups, each on its own stream, stepped while the others "
        "wait for actions (2: double-buffered sampling; keeps the env process busy). At most num_envs.",
    )
    peer_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest wait (s) for the edge-encoder to accept a stream or answer one step; "
        "past it the stream is abandoned and redialled.",
    )

    @model_validator(mode="after")
    def _groups_fit(self) -> EnvironmentSettings:
        if self.env_groups > self.num_envs:
            raise ValueError(f"env_groups={self.env_groups} exceeds num_envs={self.num_envs}: a group needs an env")
        return self
