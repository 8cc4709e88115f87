"""Configuration shared by every service process.

Each service has one frozen pydantic model. Field names are the CLI flags
(`num_envs` -> `--num-envs`) and the environment variables (`SPLITRL_NUM_ENVS`);
`splitrl.core.args` does that mapping and nothing else reads the environment.
Validation happens at construction, so a bad value fails before anything starts.

What several processes must agree on is declared once, in a group (EnvSettings,
ModeSettings, SeedSettings, VideoSettings here; PPOSettings, VecEnvSettings,
ChunkSettings beside the service that acts on them). A service's model and the
run's (`splitrl.run.settings.RunSettings`) inherit the groups, so a field means
the same thing, with the same default, everywhere it appears; `splitrl.run.plan`
copies a run's values to each service by those shared names. Nothing here imports
torch or PyAV: every process parses every service's settings (`splitrl --help`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from splitrl.core.spec import Bottleneck, ModelConfig

T = TypeVar("T")


def _split_commas(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _not_empty(value: list[Any]) -> list[Any]:
    if not value:
        raise ValueError("needs at least one entry")
    return value


#: A list given as "a,b,c" on the command line (or as a list); at least one entry.
CommaList = Annotated[list[T], BeforeValidator(_split_commas), AfterValidator(_not_empty)]
#: The same, where "" (no entry) means something.
CommaListOrEmpty = Annotated[list[T], BeforeValidator(_split_commas)]


def field_of(model: type[BaseModel], name: str) -> Any:
    """Field `name` of `model`, to declare the same setting (flag, default, bounds, help) in a settings class
    outside its group: `action_repeat: int = field_of(VecEnvSettings, "action_repeat")`."""
    return model.model_fields[name]


Mode = Literal["cloud", "split", "split-accumulate"]
#: How cloud mode sends observations over the WAN (docs/design.md §3): the newest uint8 frame (stacked in the
#: cloud), the same zstd-compressed, an H.264 video stream per env (the strongest: splitrl.core.video), or
#: the research's bf16 frame stack.
ObservationCodec = Literal["frame", "frame+zstd", "h264", "stack-bf16"]
#: How a float tensor (activations, gradients) crosses a link: bfloat16, int8, int4 or float8 (e4m3) with one
#: float32 scale per row, each optionally zstd-compressed (splitrl.core.wire.encode_float).
FloatCodec = Literal["bf16", "int8", "int4", "fp8", "bf16+zstd", "int8+zstd", "int4+zstd", "fp8+zstd"]
#: The number format of a process's torch passes: float32, or bfloat16 under torch's CPU autocast
#: (splitrl.core.precision).
Precision = Literal["float32", "bfloat16"]


def split_addresses(addresses: str) -> list[str]:
    """The host:port entries of `addresses`, a comma-separated list ("a:50052,b:50052"), in order.

    ValueError quoting the bad entry for one without a host or with a port outside 0-65535, and for an entry
    listed twice (two streams' worth of one replica would skew the spread). Port 0 is allowed: a plan's
    placeholder for a service not serving yet (splitrl.run.plan.NOT_SERVING).
    """
    entries = [entry.strip() for entry in addresses.split(",")]
    for entry in entries:
        host, colon, port = entry.rpartition(":")
        if not (colon and host and port.isdigit() and int(port) <= 65535):
            raise ValueError(f"expected host:port (or a comma-separated list of them), got {entry!r} in {addresses!r}")
    twice = sorted({entry for entry in entries if entries.count(entry) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)} listed more than once in {addresses!r}")
    return entries


#: host:port of every replica of a service, comma-separated; validated as split_addresses says.
AddressList = Annotated[str, AfterValidator(lambda value: ",".join(split_addresses(value)))]


def shard_index(replica_index: int, shard_count: int) -> int:
    """The replay shard (0-based, of `shard_count`) that inference replica `replica_index` writes to: every chunk
    of the replica's streams lands on that one shard, where deduplication and order hold."""
    return replica_index % shard_count


class Settings(BaseModel):
    """Base of every config: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ModeSettings(Settings):
    """Where the encoder trains and how each payload crosses the WAN: the same for every service of a run."""

    mode: Mode = Field(
        "split",
        description="Training mode: cloud (frames cross the WAN, the whole network trains in the cloud), split "
        "(activations up, gradients down every minibatch) or split-accumulate (activations stored in replay, a "
        "share of gradients down).",
    )
    codec: ObservationCodec = Field(
        "frame",
        description="Cloud mode's observation codec: frame (one uint8 frame per step), frame+zstd, h264 (an "
        "H.264 stream per env, see --video-crf) or stack-bf16 (the research's accounting).",
    )
    activation_codec: FloatCodec = Field(
        "bf16",
        description="Split modes: how activations cross the WAN (rollout and training): bf16, int8, int4 or fp8 "
        "(per-row scale), each optionally +zstd.",
    )
    gradient_codec: FloatCodec = Field(
        "bf16",
        description="Split modes: how activation gradients cross the WAN to the edges: bf16, int8, int4 or fp8 "
        "(per-row scale), each optionally +zstd.",
    )


class SeedSettings(Settings):
    """One seed per run: envs (env i plays seed + i), initial weights (edge and cloud must agree), sampling."""

    seed: int = Field(0, ge=0, description="Seed of envs, initial weights and sampling.")


#: How gRPC links are protected (splitrl.core.security): mutual TLS (both ends show a certificate signed by the
#: CA), TLS (the server shows one), or plaintext (unencrypted, unauthenticated; only when asked for).
TlsMode = Literal["mtls", "tls", "plaintext"]


class RewardSettings(Settings):
    """How large a reward a run can produce: inference refuses an edge that reports more, replay a chunk that
    holds more. Every service of a run must agree on it."""

    max_abs_reward: float = Field(
        1e6,
        gt=0,
        description="Largest |reward| of one agent step (summed over its action repeat); beyond it an edge's "
        "step, or a chunk that holds one, is refused. Raise it for an env whose rewards are that large.",
    )


class TransportSettings(Settings):
    """How this process protects its gRPC links, as server and as client (the same certificate serves both).

    Files are PEM and are read once at startup (mounted secrets in compose/k8s); `splitrl certs` makes them.
    """

    tls: TlsMode = Field(
        "mtls",
        description="mtls: both ends present certificates signed by --tls-ca-file; tls: only servers do; "
        "plaintext: unencrypted and unauthenticated (logged as a warning).",
    )
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain this process presents (tls, mtls).")
    tls_key_file: Path | None = Field(None, description="PEM private key of --tls-cert-file.")
    tls_ca_file: Path | None = Field(None, description="PEM CA bundle that peers' certificates must chain to.")
    tls_server_name: str | None = Field(
        None, description="Name expected in servers' certificates instead of the dialled host (e.g. when dialling IPs)."
    )
    auth_token_file: Path | None = Field(
        None,
        description="File holding a bearer token: sent on every call made, and required on every call served "
        "(health checks exempt).",
    )


class ServerSettings(TransportSettings):
    """What every service process has: a gRPC server, a /metrics port, a clean shutdown."""

    host: str = Field("127.0.0.1", description="Address the gRPC and metrics servers bind to.")
    port: int = Field(0, ge=0, le=65535, description="gRPC port; 0 picks a free one (see --port-file).")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics port; 0 picks a free one.")
    port_file: Path | None = Field(
        None,
        description="Once serving, write the bound ports and the process id here as JSON "
        '{"grpc": N, "metrics": N, "pid": N}.',
    )
    torch_threads: int = Field(
        1,
        ge=1,
        le=256,
        description="torch intra-op threads per torch op in this process (a split edge-encoder runs its acting and "
        "its training ops at once, each with this many).",
    )
    nice: int = Field(
        0,
        ge=0,
        le=19,
        description="CPU niceness this process runs at, 0-19: above 0 it gives way to the others on a machine it "
        "shares (splitrl up sets the learner's, --learner-nice). Only ever raised; a process started niced more "
        "keeps its own.",
    )
    shutdown_grace_s: float = Field(5.0, gt=0, description="Seconds in-flight calls get to finish on SIGTERM.")
    deny_list_file: Path | None = Field(
        None,
        description="Under mtls: identities this server refuses, one a line (a SPIFFE ID, or an edge's instance name "
        "for all its roles); re-read while serving, and open calls of a newly listed identity are ended.",
    )
    deny_list_poll_s: float = Field(2.0, gt=0, description="Seconds between checks of --deny-list-file for changes.")
    reflection: bool = Field(
        False, description="Serve gRPC reflection (to any certificate of the CA): off, so a peer cannot list the API."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Logging level.")
    final_metrics_file: Path | None = Field(
        None, description="On shutdown, after draining, write the final /metrics text here (run summaries)."
    )


class EnvSettings(Settings):
    """Which environment is played, and how its frames are shaped. Every service must agree on these."""

    env: str = Field("CarRacing-v3", description="Gymnasium env id with image observations (e.g. splitrl/Catch-v0).")
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="JSON object of keyword arguments for gymnasium.make."
    )
    frame_size: int = Field(96, ge=36, le=512, description="Frames are resized to frame_size x frame_size gray.")
    frame_stack: int = Field(4, ge=1, le=16, description="Frames stacked into one observation.")
    width: int = Field(
        4096, ge=1, le=65536, description="Encoder activation width: numbers per step sent in split modes."
    )
    bottleneck: Bottleneck = Field(
        "relu",
        description="Encoder's last layer: relu, or layernorm (rows normalised, |activation| <= sqrt(width - 1); "
        "keeps a narrow split encoder from inflating its activations).",
    )
    max_activation: float = Field(
        65504.0,
        gt=0,
        description="Receivers refuse activations beyond this magnitude (INVALID_ARGUMENT, counted) with "
        "--bottleneck relu; with layernorm the bound is sqrt(width - 1). Default: float16's largest value.",
    )

    def env_flags(self) -> dict[str, Any]:
        """These settings as flag values for a child splitrl process (env_kwargs as its JSON text)."""
        return {
            "env": self.env,
            "env_kwargs": json.dumps(self.env_kwargs),
            "frame_size": self.frame_size,
            "frame_stack": self.frame_stack,
            "width": self.width,
            "bottleneck": self.bottleneck,
            "max_activation": self.max_activation,
        }

    def network_config(self) -> ModelConfig:
        """The shapes edge and cloud must agree on."""
        return ModelConfig(self.frame_stack, self.frame_size, self.width, self.bottleneck)

    def activation_bound(self) -> float:
        """Largest |activation| a receiver accepts (ModelConfig.activation_bound)."""
        return self.network_config().activation_bound(self.max_activation)

    @field_validator("env_kwargs", mode="before")
    @classmethod
    def _parse_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as error:
                raise ValueError(f"env_kwargs must be a JSON object, got {value!r}: {error}") from None
        return value


#: x264 speed presets, fastest first; slower ones spend more edge CPU for fewer bytes.
VideoPreset = Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium"]


class VideoSettings(Settings):
    """How cloud mode's H.264 stream is encoded on the edge (`--codec h264`)."""

    video_crf: int = Field(
        23,
        ge=0,
        le=51,
        description="H.264 constant rate factor: 0 lossless, 18 / 23 / 28 about 47 / 43 / 39 dB PSNR on "
        "CarRacing (higher = fewer bytes, lower quality).",
    )
    video_preset: VideoPreset = Field(
        "veryfast", description="x264 speed preset: slower presets spend more edge CPU for fewer bytes."
    )
    video_measure_psnr: bool = Field(
        True,
        description="Decode the edge's own packets to export the PSNR the cloud sees (splitrl_video_psnr_db); "
        "costs the edge one decode per frame.",
    )
    video_shadow: bool = Field(
        False,
        description="Split modes: also encode each env's frames as cloud mode's H.264 stream would (these "
        "--video-* settings, new encoders with each Act stream) and count the ActRequest bytes that would have "
        "crossed (splitrl_video_shadow_bytes; summary.json's cloud_h264_shadow): the cloud baseline's bytes "
        "for the same driving, so the split's ratio needs no cloud run of matched return. Costs the edge one "
        "H.264 encode per frame; sends nothing.",
    )
