"""Settings of `splitrl serve replay`: a primary table from flat flags, more from --extra-tables JSON.

The defaults are a FIFO queue of 4096 items sampled as soon as it holds one
(no samples-per-insert ratio), so inserts never wait and the pipeline cannot
stall on replay. Every combination is checked at construction, rate limiter
included, with the bad value in the message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from splitrl.core.chunk_content import ChunkLimits
from splitrl.core.config import RewardSettings, ServerSettings, Settings
from splitrl.core.spec import ActionSpec
from splitrl.replay.rate_limiter import RateLimiter
from splitrl.replay.selectors import SelectorName


class TableOptions(Settings):
    """How one table selects, removes and rate-limits (fields shared by the primary and extra tables)."""

    selector: SelectorName = Field(
        "fifo",
        description="fifo: oldest first, each item handed out once; uniform: with replacement; "
        "prioritized: P(i) = priority_i^priority_exponent / sum (all priorities 0: uniform).",
    )
    max_size: int = Field(4096, ge=1, description="Items the table holds; the oldest is evicted beyond it.")
    min_size_to_sample: int = Field(1, ge=1, description="Sample calls wait until the table holds this many items.")
    max_times_sampled: int = Field(
        0, ge=0, description="An item is removed once sampled this many times; 0 = never (fifo: always 1)."
    )
    priority_exponent: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="Exponent applied to priorities by the prioritized selector."
    )
    samples_per_insert: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Target samples per inserted item (Reverb SampleToInsertRatio); unset = no ratio, "
        "inserts never wait. Needs error_buffer.",
    )
    error_buffer: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        validate_default=True,
        description="With samples_per_insert: the allowed drift of inserts*samples_per_insert - samples around "
        "samples_per_insert*min_size_to_sample; at least max(1, samples_per_insert).",
    )

    @field_validator("min_size_to_sample")
    @classmethod
    def _within_max_size(cls, value: int, info: ValidationInfo) -> int:
        max_size = info.data.get("max_size")
        if max_size is not None and value > max_size:
            raise ValueError(f"min_size_to_sample={value} exceeds max_size={max_size}: sampling would never start")
        return value

    @field_validator("max_times_sampled")
    @classmethod
    def _fifo_samples_once(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("selector") == "fifo" and value not in (0, 1):
            raise ValueError(f"a fifo table hands each item out once; max_times_sampled must be 0 or 1, got {value}")
        return value

    @field_validator("error_buffer")
    @classmethod
    def _valid_rate_limiter(cls, value: float | None, info: ValidationInfo) -> float | None:
        if "samples_per_insert" not in info.data:  # it failed its own validation; that error says enough
            return value
        spi, min_size = info.data["samples_per_insert"], info.data.get("min_size_to_sample")
        if spi is None:
            if value is not None:
                raise ValueError(f"error_buffer={value} needs samples_per_insert")
            return value
        if value is None:
            raise ValueError(f"samples_per_insert={spi} needs an error_buffer (at least max(1, {spi}))")
        if min_size is not None:
            RateLimiter.sample_to_insert_ratio(spi, min_size, value)  # raises with the values
        return value

    def rate_limiter(self) -> RateLimiter:
        """A new limiter for one table: min size only, or a samples-per-insert ratio."""
        if self.samples_per_insert is None or self.error_buffer is None:
            return RateLimiter.min_size(self.min_size_to_sample)
        return RateLimiter.sample_to_insert_ratio(self.samples_per_insert, self.min_size_to_sample, self.error_buffer)


class TableSettings(TableOptions):
    """One entry of --extra-tables."""

    name: str = Field(min_length=1, description="Table name.")


class ReplaySettings(ServerSettings, TableOptions, RewardSettings):
    """Settings of `splitrl serve replay`. The flat table fields configure the primary table, `table`."""

    table: str = Field("rollouts", min_length=1, description="Name of the primary table (inference writes to it).")
    extra_tables: list[TableSettings] = Field(
        default_factory=list,
        description='JSON list of more tables, e.g. [{"name": "per", "selector": "prioritized", "max_size": 100000}]; '
        "unset fields take the defaults above, not the primary table's flags.",
    )
    max_trajectory_length: int = Field(4096, ge=1, description="Longest chunk (steps) an insert may carry.")
    seed: int | None = Field(None, description="Seed of the uniform / prioritized draws; unset = random.")
    data_dir: Path | None = Field(
        None,
        description="Persist the tables here (write-ahead log + snapshots) and restore them at start; "
        "unset = in memory only, lost when the process ends.",
    )
    fsync: Literal["always", "never"] = Field(
        "always",
        description="With data_dir: always = each insert is fsynced (inserts in flight share one fsync) before "
        "it is acknowledged, surviving power loss; never = written to the OS before it is acknowledged, "
        "surviving a crash or kill of the process, not of the machine.",
    )
    checkpoint_every_s: float = Field(
        60.0, gt=0, description="With data_dir: seconds between snapshots (each truncates the write-ahead log)."
    )
    checkpoint_every_inserts: int = Field(
        0, ge=0, description="With data_dir: also snapshot after this many logged changes (0 = by time only)."
    )
    keep_snapshots: int = Field(
        2,
        ge=1,
        description="With data_dir: snapshots kept, newest first, with the log back to the oldest: one that fails "
        "its check at restore is set aside and the next older one used.",
    )
    action_space: ActionSpec | None = Field(
        None,
        description='The run\'s action space as JSON, e.g. {"kind": "discrete", "size": 5}: an insert whose actions '
        "lie outside it is refused. Unset: discrete actions need only be indices >= 0, continuous ones finite. "
        "`splitrl up` sets it from the env.",
    )
    observation_shape: list[int] | None = Field(
        None,
        description="One step's observation shape as JSON, e.g. [4, 96, 96] (cloud frame stacks) or [64] "
        "(split activations): inserts of another shape are refused. Unset: any. Set from the run like action_space.",
    )
    max_abs_value: float = Field(1e9, gt=0, description="An insert with a |value estimate| above this is refused.")
    dedup_window: int = Field(
        4096,
        ge=1,
        description="Sequences per writer whose keys replay remembers to answer a re-send with its original key; "
        "at least the writers' max_pending_inserts.",
    )

    @field_validator("action_space", "observation_shape", mode="before")
    @classmethod
    def _parse_json_value(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else None
            except json.JSONDecodeError as error:
                raise ValueError(f"{info.field_name} must be JSON, got {value!r}: {error}") from None
        return value

    def chunk_limits(self) -> ChunkLimits:
        """What an inserted chunk may hold (core.chunk_content), from these settings."""
        shape = None if self.observation_shape is None else tuple(self.observation_shape)
        return ChunkLimits(self.action_space, shape, self.max_abs_reward, self.max_abs_value)

    @field_validator("extra_tables", mode="before")
    @classmethod
    def _parse_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else []
            except json.JSONDecodeError as error:
                raise ValueError(f"extra_tables must be a JSON list, got {value!r}: {error}") from None
        return value

    @field_validator("extra_tables")
    @classmethod
    def _unique_names(cls, value: list[TableSettings], info: ValidationInfo) -> list[TableSettings]:
        names = [info.data.get("table"), *(t.name for t in value)]
        duplicates = sorted({n for n in names if n is not None and names.count(n) > 1})
        if duplicates:
            raise ValueError(f"table names must be unique; {duplicates} given more than once")
        return value

    def tables(self) -> list[TableSettings]:
        """The primary table, then the extra tables."""
        primary = TableSettings(name=self.table, **self.model_dump(include=set(TableOptions.model_fields)))
        return [primary, *self.extra_tables]
