"""Settings of the benchmarks; light to import (`splitrl --help` builds its flags from them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field, field_validator, model_validator

from splitrl.core.config import (
    CommaList,
    CommaListOrEmpty,
    EnvSettings,
    FloatCodec,
    Mode,
    ObservationCodec,
    SeedSettings,
    Settings,
    field_of,
)
from splitrl.core.spec import Bottleneck
from splitrl.edge_encoder.settings import EncoderTrainingSettings
from splitrl.environment.settings import VecEnvSettings
from splitrl.inference.settings import ChunkSettings
from splitrl.learner.settings import PPOSettings
from splitrl.run.settings import RunSettings

#: Default share of |`cloud frame`'s return| a cloud row may end below it and still count as at matched return.
RETURN_TOLERANCE = 0.1


class NetworkBenchSettings(EnvSettings, Settings):
    """Run modes x codecs x widths with `splitrl up` at matched env steps and seeds; write the table and figures."""

    env: str = Field("splitrl/Catch-v0", description="Gymnasium env id (CarRacing-v3 for the research's claim).")
    out: Path = Field(Path("runs/bench-network"), description="Output directory: runs/, report.md, runs.csv, PNGs.")
    steps: int = Field(20_000, ge=1, description="Env steps per run, over all envs.")
    seeds: CommaList[int] = Field([0], description="Comma-separated seeds; every row runs once per seed.")
    modes: CommaList[Mode] = Field(["cloud", "split", "split-accumulate"], description="Comma-separated modes to run.")
    observation_codecs: CommaList[ObservationCodec] = Field(
        ["stack-bf16", "frame", "frame+zstd", "h264"],
        description="Cloud rows: comma-separated observation codecs (h264: one row per --video-crfs entry).",
    )
    video_crfs: CommaList[int] = Field(
        [18, 23, 28], description="Cloud h264 rows: comma-separated x264 CRFs (0 lossless ... 51)."
    )
    activation_codecs: CommaList[FloatCodec] = Field(
        ["bf16", "int8+zstd"], description="Split rows: comma-separated activation codecs."
    )
    gradient_codec: FloatCodec | Literal["same"] = Field(
        "same", description="Split rows: gradient codec, or 'same' to match each row's activation codec."
    )
    widths: CommaList[int] = Field([4096, 256], description="Split rows: comma-separated encoder widths.")
    width: int = Field(4096, ge=1, le=65536, description="Cloud rows: the cloud model's encoder width (no WAN effect).")
    num_envs: int = Field(4, ge=1, le=1024, description="Envs in the environment process.")
    unroll_length: int = Field(32, ge=1, description="Steps per trajectory chunk.")
    chunks_per_update: int = Field(16, ge=1, description="Learner: trajectory chunks per PPO update.")
    epochs: int = Field(4, ge=1, description="Learner: epochs per update (the research used 10).")
    encoder_epochs: CommaList[Annotated[int, Field(ge=1)]] = Field(
        [],
        description="Split rows: comma-separated --encoder-epochs, each a row of its own (none: the encoder "
        "trains in every epoch).",
    )
    minibatches: int = Field(4, ge=1, description="Learner: minibatches per epoch (the research used 32).")
    learning_rate: float = Field(2.5e-4, gt=0, description="Learner: Adam learning rate.")
    return_window: float = Field(
        0.2, gt=0, le=1, description="Final return: episodes ending in this last share of each run's steps."
    )
    return_tolerance: float = Field(
        RETURN_TOLERANCE,
        ge=0,
        lt=1,
        description="Baseline: the cheapest cloud row whose final return is within this share of `cloud frame`'s.",
    )

    @field_validator("widths")
    @classmethod
    def _widths_positive(cls, value: list[int]) -> list[int]:
        if any(width < 1 for width in value):
            raise ValueError(f"widths must be >= 1, got {value}")
        return value

    @field_validator("video_crfs")
    @classmethod
    def _crfs_in_range(cls, value: list[int]) -> list[int]:
        if any(not 0 <= crf <= 51 for crf in value):
            raise ValueError(f"video CRFs must be in [0, 51], got {value}")
        return value


class ThroughputBenchSettings(
    EnvSettings, SeedSettings, VecEnvSettings, ChunkSettings, PPOSettings, EncoderTrainingSettings, Settings
):
    """Env steps/s of the five-service stack per mode, side by side in one run with single-process references:
    a loop that only acts, the same PPO trained in turn in one process (sync-ppo) and, optionally,
    Stable-Baselines3 PPO; hop latencies, batch sizes, policy lag, CPU per service; a link microbenchmark vs
    raw TCP. Every run shares the env, action repeat and PPO flags below (the names `splitrl up` takes)."""

    env: str = Field("CarRacing-v3", description="Gymnasium env id (splitrl/Catch-v0 shows per-step overhead).")
    train_every_step: bool = Field(
        False,
        description="Stack: acting waits for the learner and every step is trained once (splitrl up "
        "--train-every-step), so the stack does the references' updates per frame instead of letting replay "
        "evict what its learner cannot keep up with.",
    )
    num_envs: int = Field(8, ge=1, le=1024, description="Envs stepped together, in the references and the stack.")
    env_groups: int = Field(
        2, ge=1, le=64, description="Stack: env groups in the environment process (2: double-buffered sampling)."
    )
    steps: int = Field(2400, ge=1, description="Agent steps per measurement, over all envs.")
    modes: CommaList[Mode] = Field(["cloud", "split", "split-accumulate"], description="Comma-separated stack modes.")
    codec: ObservationCodec = Field("frame", description="Cloud mode's observation codec.")
    activation_codec: FloatCodec = Field("bf16", description="Split modes' activation and gradient codec.")
    out: Path = Field(Path("runs/bench-throughput"), description="Output directory: runs/, throughput.md, .json.")
    torch_threads: int = Field(
        1, ge=1, description="torch threads in each stack service and in the act-only baseline the overhead is against."
    )
    learner_nice: int = field_of(RunSettings, "learner_nice")
    reference_torch_threads: int | None = Field(
        None,
        ge=1,
        le=256,
        description="torch threads of the single-process training references (sync-ppo, sb3-ppo); default: torch's "
        "own (a thread per core; OMP_NUM_THREADS if set), as a user runs one training process on a machine.",
    )
    warmup_fraction: float = Field(
        0.15, ge=0, lt=1, description="Share of each measurement's env steps left out of its rate (start-up)."
    )
    rounds: int = Field(
        1,
        ge=1,
        le=20,
        description="Times the training comparison runs: every reference that trains and every stack mode once "
        "a round, even rounds in exactly the reverse order (stacks first), so an even number pairs every round "
        "against a steady drift of the machine. Above 1: a table of each round's stack-to-reference ratios with "
        "their median and range, since on a shared machine one run's rate can swing 20-30%. The other tables "
        "show round 1, the only one --profile-s samples.",
    )
    sync_ppo: bool = Field(
        True, description="Also train the same PPO in one process, rollout then update (--no-sync-ppo: skip it)."
    )
    sb3_reference: bool = Field(
        False, description="Also train Stable-Baselines3 PPO on the same env and sizes (needs the sb3 extra)."
    )
    link_sizes: CommaList[int] = Field(
        [512, 8192, 73728], description="Link microbenchmark: comma-separated tensor message sizes (bytes)."
    )
    link_seconds: float = Field(2.0, gt=0, description="Link microbenchmark: seconds per size and transport.")
    skip_link: bool = Field(False, description="Leave out the link microbenchmark.")
    link_wan: bool = Field(
        False,
        description="Link microbenchmark: also a gRPC stream set as splitrl's WAN links are (fixed flow-control "
        "window, no bandwidth probing), beside gRPC's default.",
    )
    profile_s: float = Field(
        0.0,
        ge=0,
        description="Sample every service of each stack run with py-spy for this many seconds once the warm-up "
        "is over, and show where their time goes (0: no profile). Needs py-spy (dev extra) and ptrace rights; "
        "keep it shorter than a run.",
    )

    @field_validator("link_sizes")
    @classmethod
    def _sizes_fit(cls, value: list[int]) -> list[int]:
        if any(not 64 <= size <= 16 * 1024 * 1024 for size in value):
            raise ValueError(f"link sizes must be in [64, 16 MiB] bytes, got {value}")
        return value


def row_flags(spec: str) -> dict[str, Any]:
    """A learning row MODE[:CODEC][:wWIDTH][:eEPOCHS][:fFRACTION][:BOTTLENECK] as the `splitrl up` settings it
    overrides: CODEC is cloud's observation codec or split modes' activation and gradient codec, EPOCHS and
    FRACTION the split modes' encoder_epochs and encoder_fraction. ValueError quoting the row if a part is none
    of them."""
    mode, *rest = spec.split(":")
    if mode not in get_args(Mode) or len(rest) > 5:
        raise ValueError(
            f"row {spec!r}: expected MODE[:CODEC][:wWIDTH][:eEPOCHS][:fFRACTION][:BOTTLENECK], e.g. cloud:h264 or "
            "split:int4:w32:e1:f0.5:layernorm"
        )
    codecs = get_args(ObservationCodec) if mode == "cloud" else get_args(FloatCodec)
    flags: dict[str, Any] = {"mode": mode}
    for part in rest:
        number = int(part[1:]) if part[1:].isdigit() else 0
        if part.startswith("w") and number >= 1 and "width" not in flags:
            flags["width"] = number
        elif part.startswith("e") and number >= 1 and mode != "cloud" and "encoder_epochs" not in flags:
            flags["encoder_epochs"] = number
        elif part.startswith("f") and mode != "cloud" and "encoder_fraction" not in flags:
            if (fraction := _fraction(part[1:])) is None:
                raise ValueError(f"row {spec!r}: {part!r} is not fFRACTION with FRACTION in [0, 1], e.g. f0.5")
            flags["encoder_fraction"] = fraction
        elif part in get_args(Bottleneck) and "bottleneck" not in flags:
            flags["bottleneck"] = part
        elif part in codecs and "codec" not in flags and "activation_codec" not in flags:
            if mode == "cloud":
                flags["codec"] = part
            else:
                flags["activation_codec"] = flags["gradient_codec"] = part
        else:
            raise ValueError(
                f"row {spec!r}: {part!r} is not a {mode} codec ({', '.join(codecs)}), wWIDTH, "
                f"{'' if mode == 'cloud' else 'eEPOCHS, fFRACTION, '}"
                f"or a bottleneck ({', '.join(get_args(Bottleneck))}), or it is given twice"
            )
    return flags


def _fraction(text: str) -> float | None:
    """`text` as a share in [0, 1], or None if it is not one."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value <= 1 else None


def _row_spec(value: str) -> str:
    row_flags(value)
    return value


class LearningBenchSettings(Settings):
    """Train rows x seeds to a budget of env frames with `splitrl up`, in resumable segments, evaluating after
    each on unseen episodes: return vs env frames and vs cumulative WAN bytes (table and figure)."""

    config: Path = Field(
        Path("configs/carracing.yaml"),
        description="Recipe every row starts from (a `splitrl up --config` file); rows override mode, codecs, "
        "width, encoder epochs and fraction, and bottleneck.",
    )
    rows: CommaListOrEmpty[Annotated[str, AfterValidator(_row_spec)]] = Field(
        ["cloud:h264", "split:int4+zstd:w32:e1:f0.5:layernorm"],
        description="Comma-separated MODE[:CODEC][:wWIDTH][:eEPOCHS][:fFRACTION][:BOTTLENECK]: CODEC is cloud's "
        "observation codec or split modes' activation (and gradient) codec; WIDTH the encoder width; EPOCHS and "
        "FRACTION the split modes' --encoder-epochs and --encoder-fraction; BOTTLENECK relu or layernorm. Empty "
        "('') with --sb3-reference: the reference peer alone.",
    )
    seeds: CommaList[int] = Field([0], description="Comma-separated seeds; every row runs once per seed.")
    frames: int | None = Field(
        None,
        ge=1,
        description="Env frames per run (agent steps x the recipe's action repeat); default: the recipe's steps "
        "x its action repeat.",
    )
    segment_frames: int = Field(
        250_000, ge=1, description="Env frames per segment; each segment ends with an evaluation and can be resumed."
    )
    eval_episodes: int = Field(
        20, ge=1, description="Unseen episodes per evaluation (the final one plays --final-episodes)."
    )
    final_episodes: int = Field(100, ge=1, description="Unseen episodes of each run's final evaluation.")
    sampled_evals: bool = Field(
        True,
        description="Evaluate each segment end twice on the same episodes: with the most likely action (argmax), "
        "then sampling the policy's actions (--no-sampled-evals: argmax only). A discrete CarRacing policy that "
        "drives by mixing 'nothing' and 'gas' can stand still under argmax.",
    )
    out: Path = Field(Path("runs/bench-learning"), description="Output directory: runs/, learning.md, .json, PNG.")
    report_only: bool = Field(
        False, description="Train and evaluate nothing: write the table and figure from the runs under OUT as they are."
    )
    sb3_reference: bool = Field(
        False,
        description="Also train Stable-Baselines3 PPO on the same env, recipe and frames per seed (row sb3-ppo; "
        "needs the sb3 extra).",
    )

    @model_validator(mode="after")
    def _something_to_train(self) -> LearningBenchSettings:
        if not self.rows and not self.sb3_reference:
            raise ValueError("--rows needs at least one entry ('' only with --sb3-reference: the peer alone)")
        return self


class ReplicasBenchSettings(Settings):
    """What inference replicas buy and cost, side by side in one run: simulated edge streams (split mode, one
    env each, random activations) into 1, then N inference replicas, each a process started as `splitrl up`
    starts it; env steps/s, step latency, batch sizes and inference CPU per replica count."""

    streams: int = Field(64, ge=1, le=4096, description="Simulated edge streams (one lockstep Act stream each).")
    replica_counts: CommaList[Annotated[int, Field(ge=1, le=16)]] = Field(
        [1, 2], description="Comma-separated inference replica counts, measured in this order."
    )
    seconds: float = Field(10.0, gt=0, description="Seconds measured per replica count, after the warm-up.")
    warmup_s: float = Field(2.0, ge=0, description="Seconds of load before measuring (connections, first batches).")
    width: int = Field(256, ge=1, le=65536, description="Activation width the streams send (bf16).")
    torch_threads: int = Field(1, ge=1, le=256, description="torch threads in each inference process.")
    out: Path = Field(Path("runs/bench-replicas"), description="Output directory: replicas.md, replicas.json, logs.")
