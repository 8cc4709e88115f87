from __future__ import annotations

from pydantic import Field, model_validator

from splitrl.core.backoff import RedialSettings
from splitrl.core.config import EnvSettings, SeedSettings, ServerSettings, Settings


class VecEnvSettings(Settings):
    """How many envs the environment process steps, and how (a run, `splitrl up`, shares this group)."""

    num_envs: int = Field(4, ge=1, le=1024, description="Envs stepped together; one message per vector step.")
    env_groups: int = Field(
        1,
        ge=1,
        le=64,
        description="Split the envs into this many groups, each on its own stream, stepped while the others "
        "wait for actions (2: double-buffered sampling; keeps the env process busy). At most num_envs.",
    )
    action_repeat: int = Field(1, ge=1, le=16, description="Times each action is repeated (rewards summed).")
    env_workers: bool = Field(
        False,
        description="Step each env group in a worker process of its own (one more core per group busy), for envs "
        "whose step is the bottleneck (CarRacing renders); costs a process per group. Same frames either way.",
    )

    @model_validator(mode="after")
    def _groups_fit(self) -> VecEnvSettings:
        if self.env_groups > self.num_envs:
            raise ValueError(f"env_groups={self.env_groups} exceeds num_envs={self.num_envs}: a group needs an env")
        return self


class EnvironmentSettings(ServerSettings, EnvSettings, SeedSettings, VecEnvSettings, RedialSettings):
    """Settings of `splitrl serve environment`. Env i is reset with seed + i."""

    encoder_address: str = Field("127.0.0.1:50051", description="host:port of the edge-encoder to stream to.")
    max_steps: int = Field(
        0, ge=0, description="Stop after this many agent steps over all envs (0: run until stopped)."
    )
    peer_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest wait (s) for the edge-encoder to accept a stream or answer one step; "
        "past it the stream is abandoned and redialled.",
    )
