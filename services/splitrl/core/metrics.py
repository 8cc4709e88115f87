"""Every Prometheus series splitrl exports is defined here, and only here.

Each service builds one `Metrics` on its own `CollectorRegistry` (so several
services can share a process in tests without sharing counters) and serves it
on its `/metrics` port.

Link accounting (docs/design.md §4): on every link both ends count each message
they send or receive, as the serialized protobuf size (the payload of gRPC's
length-prefixed frame), one message, and the number of tensor elements it
carries (`splitrl.core.link_meter.LinkMeter`, on the link families here).
Labels are low-cardinality by construction: link, direction, phase, payload are
drawn from the fixed sets below.
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector, Summary
from prometheus_client.metrics import MetricWrapperBase

from splitrl.core.memory import peak_resident_bytes

Link = Literal[
    "env-encoder", "encoder-inference", "inference-replay", "replay-learner", "learner-inference", "learner-encoder"
]
#: Links that cross the edge <-> cloud boundary.
WAN_LINKS: frozenset[str] = frozenset({"encoder-inference", "learner-encoder"})
Direction = Literal["sent", "received"]
Phase = Literal["rollout", "training", "weights"]
Payload = Literal["observation", "activation", "action", "gradient", "trajectory", "ack", "batch", "request", "weights"]

#: Families that readers of /metrics text (run summaries, progress, TensorBoard, benches) look up by name.
#: A counter's sample is NAME_total; a summary's are NAME_count and NAME_sum; a histogram's NAME_bucket too.
LINK_BYTES = "splitrl_link_bytes"
LINK_MESSAGES = "splitrl_link_messages"
LINK_ELEMENTS = "splitrl_link_elements"
ENV_STEPS = "splitrl_env_steps"
EPISODE_RETURN = "splitrl_episode_return"
INFERENCE_BATCH_SIZE = "splitrl_inference_batch_size"
HOP_LATENCY = "splitrl_hop_latency_seconds"
LEARNER_UPDATES = "splitrl_learner_updates"
LEARNER_LAST_UPDATE = "splitrl_learner_last_update_timestamp_seconds"
LEARNER_LOSS = "splitrl_learner_loss"
LEARNING_RATE = "splitrl_learning_rate"
ENTROPY_COEF = "splitrl_entropy_coef"
POLICY_LAG = "splitrl_policy_lag"
STREAMS_OPENED = "splitrl_streams_opened"
VIDEO_SHADOW_BYTES = "splitrl_video_shadow_bytes"
#: CPU and memory of a service's worker processes (environment --env-workers), beside its own process_* series.
WORKER_CPU_SECONDS = "splitrl_worker_cpu_seconds"
WORKER_RESIDENT_BYTES = "splitrl_worker_resident_memory_bytes"
WORKER_PEAK_RESIDENT_BYTES = "splitrl_worker_peak_resident_memory_bytes"
#: The service process's own peak resident memory (process_resident_memory_bytes is the current figure).
PEAK_RESIDENT_BYTES = "splitrl_process_peak_resident_memory_bytes"

#: The families each service exports (`Metrics(registry, service=...)`), beside its process_* series and
#: SHARED_FAMILIES: a service's /metrics lists what it updates, not the other services' families at 0 (each
#: family a service registers costs every scrape its text, and every reader its parsing). Readers of the run's
#: texts look families up by name, so a family is counted wherever it is exported.
SERVICE_FAMILIES: dict[str, frozenset[str]] = {
    "environment": frozenset(
        {
            ENV_STEPS,
            EPISODE_RETURN,
            "splitrl_episode_length",
            HOP_LATENCY,
            WORKER_CPU_SECONDS,
            WORKER_RESIDENT_BYTES,
            WORKER_PEAK_RESIDENT_BYTES,
        }
    ),
    "edge-encoder": frozenset(
        {
            HOP_LATENCY,
            "splitrl_encoder_version",
            "splitrl_encoder_updates",
            "splitrl_observation_store_size",
            "splitrl_unknown_step_ids",
            "splitrl_video_psnr_db",
            VIDEO_SHADOW_BYTES,
        }
    ),
    "inference": frozenset(
        {
            HOP_LATENCY,
            INFERENCE_BATCH_SIZE,
            "splitrl_policy_version",
            "splitrl_trajectories",
            "splitrl_trajectory_chunks_dropped",
            "splitrl_video_decode_errors",
        }
    ),
    "replay": frozenset(
        {
            "splitrl_replay_table_size",
            "splitrl_replay_inserts",
            "splitrl_replay_samples",
            "splitrl_replay_table_max_size",
            "splitrl_replay_evictions",
            "splitrl_replay_rate_limiter_diff",
            "splitrl_replay_rate_limiter_blocked",
            "splitrl_replay_priority_updates",
            "splitrl_replay_acknowledged_items",
            "splitrl_replay_duplicate_inserts",
            "splitrl_replay_log_bytes",
            "splitrl_replay_snapshots",
            "splitrl_replay_restore_seconds",
        }
    ),
    "learner": frozenset(
        {
            LEARNER_UPDATES,
            LEARNER_LAST_UPDATE,
            "splitrl_learner_weights_checksum",
            LEARNER_LOSS,
            LEARNING_RATE,
            ENTROPY_COEF,
            POLICY_LAG,
            "splitrl_policy_version",
            "splitrl_stale_chunks_dropped",
            "splitrl_encoder_lag",
            "splitrl_stale_activations_dropped",
            "splitrl_unknown_step_ids",
            "splitrl_learner_skipped_steps",
            "splitrl_refused_chunks",
        }
    ),
}
#: Families every service exports: what the shared core updates (links, streams, reconnects, refusals) and
#: what describes the process (its run's mode, its peak memory).
SHARED_FAMILIES = frozenset(
    {
        "splitrl_run",
        LINK_BYTES,
        LINK_MESSAGES,
        LINK_ELEMENTS,
        "splitrl_reconnects",
        "splitrl_rejected_requests",
        "splitrl_streams_open",
        STREAMS_OPENED,
        PEAK_RESIDENT_BYTES,
    }
)

LINK_LABELS = ("link", "direction", "phase", "payload")
#: Seconds; roughly x1.5-2 apart so that p50 / p99 read from buckets are within ~25% (`splitrl bench throughput`).
_LATENCY_BUCKETS = (
    0.0001, 0.00015, 0.00025, 0.0004, 0.0006, 0.001, 0.0015, 0.0025, 0.004, 0.006,
    0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.15, 0.25, 0.4, 0.6, 1, 2.5,
)  # fmt: skip


class Metrics:
    """All of splitrl's series, one attribute each; those `service` exports are registered on `registry` (one
    per service). Every attribute exists whatever the service, so shared code can update any of them; a family
    the service does not export is then counted but never served (`unexported_in_use` finds such slips)."""

    def __init__(self, registry: CollectorRegistry, service: str | None = None) -> None:
        """`service`: a key of SERVICE_FAMILIES (its families and the shared ones are registered), or None for
        every family (tools and tests that read one registry for several roles)."""
        if service is not None and service not in SERVICE_FAMILIES:
            raise ValueError(f"service must be one of {sorted(SERVICE_FAMILIES)} or None, got {service!r}")
        self.registry = registry
        self.exported = None if service is None else SHARED_FAMILIES | SERVICE_FAMILIES[service]
        # process_cpu_seconds_total, process_resident_memory_bytes, ...: where CPU and memory go, per service
        # (`splitrl bench throughput`, the load test). Services in one process (tests) report the same process.
        ProcessCollector(registry=registry)
        # Every family is built off prometheus_client's global REGISTRY (registry=None); those `service` exports
        # are registered on `registry` at the end, in this order.
        self.run = Info(
            "splitrl_run",
            "The training mode (and, where it applies, the observation codec; the learner's train_precision; the split "
            "edge's encoder_precision) of "
            "the run this service is part of. "
            "Set by the services that have a mode (edge-encoder, inference, learner; the others export it "
            "without labels), so that rules can label WAN traffic by mode.",
            registry=None,
        )
        self.link_bytes = Counter(
            LINK_BYTES,
            "Serialized protobuf bytes moved on a link, as counted at this end.",
            LINK_LABELS,
            registry=None,
        )
        self.link_messages = Counter(
            LINK_MESSAGES,
            "Messages moved on a link, as counted at this end.",
            LINK_LABELS,
            registry=None,
        )
        self.link_elements = Counter(
            LINK_ELEMENTS,
            "Tensor elements ('numbers') moved on a link, as counted at this end.",
            LINK_LABELS,
            registry=None,
        )
        self.env_steps = Counter(
            ENV_STEPS,
            "Agent steps taken, summed over all envs (one per env per action).",
            registry=None,
        )
        # A Summary, not a Histogram: prometheus-client drops a histogram's _sum when buckets go negative,
        # and mean return = rate(_sum) / rate(_count) is what dashboards and run summaries need.
        self.episode_return = Summary(EPISODE_RETURN, "Undiscounted return of each finished episode.", registry=None)
        self.episode_length = Histogram(
            "splitrl_episode_length",
            "Agent steps in each finished episode.",
            buckets=(10, 25, 50, 100, 250, 500, 1000, 2500),
            registry=None,
        )
        self.inference_batch_size = Histogram(
            INFERENCE_BATCH_SIZE,
            "Env rows in each batch the policy ran on.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=None,
        )
        self.hop_latency = Histogram(
            HOP_LATENCY,
            "Latency of one hop: a request/response round trip as seen by the caller, or a stage inside a service.",
            ["hop"],
            buckets=_LATENCY_BUCKETS,
            registry=None,
        )
        self.policy_version = Gauge(
            "splitrl_policy_version", "Version of the policy this service currently holds.", registry=None
        )
        self.trajectories = Counter("splitrl_trajectories", "Trajectory chunks completed by inference.", registry=None)
        self.trajectory_chunks_dropped = Counter(
            "splitrl_trajectory_chunks_dropped",
            "Trajectory chunks inference dropped, by reason: reconnect (per-env chunks left unfinished when their "
            "Act stream ended; the edge's next stream starts new chunks, so no chunk spans the gap; a stream closed "
            "at the end of a run counts too), refused by replay (content replay's checks refused).",
            ["reason"],
            registry=None,
        )
        self.reconnects = Counter(
            "splitrl_reconnects",
            "Times this service lost a peer it dials and redialled it (peer: the service dialled).",
            ["peer"],
            registry=None,
        )
        self.replay_size = Gauge(
            "splitrl_replay_table_size", "Items stored in a replay table.", ["table"], registry=None
        )
        self.replay_inserts = Counter(
            "splitrl_replay_inserts", "Items acknowledged into a replay table.", ["table"], registry=None
        )
        self.replay_samples = Counter(
            "splitrl_replay_samples", "Items handed out by a replay table.", ["table"], registry=None
        )
        self.replay_max_size = Gauge(
            "splitrl_replay_table_max_size",
            "Capacity of a replay table in items (its fill is table_size / table_max_size).",
            ["table"],
            registry=None,
        )
        self.replay_evictions = Counter(
            "splitrl_replay_evictions",
            "Items a replay table dropped, oldest first, to stay within max_size.",
            ["table"],
            registry=None,
        )
        self.replay_rate_limiter_diff = Gauge(
            "splitrl_replay_rate_limiter_diff",
            "A replay table's rate-limiter diff: inserts x samples_per_insert - samples.",
            ["table"],
            registry=None,
        )
        self.replay_rate_limiter_blocked = Counter(
            "splitrl_replay_rate_limiter_blocked",
            "Insert or Sample calls that had to wait for a replay table's rate limiter (op: insert | sample).",
            ["table", "op"],
            registry=None,
        )
        self.replay_priority_updates = Counter(
            "splitrl_replay_priority_updates",
            "Priority updates received by a replay table (outcome: applied | unknown_key).",
            ["table", "outcome"],
            registry=None,
        )
        self.replay_acknowledged = Gauge(
            "splitrl_replay_acknowledged_items",
            "Items ever acknowledged into a replay table; with --data-dir restored at start, so it never goes "
            "backwards across restarts (the inserts counter counts this process only).",
            ["table"],
            registry=None,
        )
        self.replay_duplicates = Counter(
            "splitrl_replay_duplicate_inserts",
            "Re-sent inserts (same writer id and sequence) replay had already stored: acknowledged, not stored again.",
            ["table"],
            registry=None,
        )
        self.replay_log_bytes = Counter(
            "splitrl_replay_log_bytes", "Bytes appended to replay's write-ahead log (--data-dir).", registry=None
        )
        self.replay_snapshots = Counter(
            "splitrl_replay_snapshots",
            "Snapshots replay wrote to --data-dir (each lets it delete the log segments it covers).",
            registry=None,
        )
        self.replay_restore_seconds = Gauge(
            "splitrl_replay_restore_seconds",
            "Seconds replay took at start to restore its tables from --data-dir.",
            registry=None,
        )
        self.rejected_requests = Counter(
            "splitrl_rejected_requests",
            "Requests refused for bad input, by RPC method and gRPC status code.",
            ["method", "code"],
            registry=None,
        )
        self.learner_updates = Counter(
            LEARNER_UPDATES,
            "Policy updates completed by the learner (with data-parallel learners: counted by rank 0 only).",
            registry=None,
        )
        # Registered after the count, so a scrape reads the count first: a point showing an update's count shows
        # its time too (learner.service sets the time first), unless the next update lands between the two reads.
        self.learner_last_update = Gauge(
            LEARNER_LAST_UPDATE,
            "Unix time at which the learner completed its last update (set with the count, by rank 0); 0 before.",
            registry=None,
        )
        self.learner_skipped_steps = Counter(
            "splitrl_learner_skipped_steps",
            "Optimizer steps the learner did not take because their gradients were not finite (NaN or Inf): the "
            "weights stay as they were.",
            registry=None,
        )
        self.learner_weights_checksum = Gauge(
            "splitrl_learner_weights_checksum",
            "Sum of the learner's weights after its last update (float64): the same on every data-parallel rank.",
            registry=None,
        )
        self.learner_loss = Gauge(LEARNER_LOSS, "Mean of each loss term over the last update.", ["term"], registry=None)
        self.learning_rate = Gauge(
            LEARNING_RATE, "The learner's Adam learning rate in its last update (--lr-anneal-steps).", registry=None
        )
        self.entropy_coef = Gauge(
            ENTROPY_COEF,
            "The entropy bonus's weight in the learner's last update (--entropy-anneal-steps).",
            registry=None,
        )
        self.policy_lag = Histogram(
            POLICY_LAG,
            "Versions between the learner's policy and the oldest action of a sampled chunk.",
            buckets=(0, 1, 2, 3, 4, 5, 7, 10, 15, 20, 50),
            registry=None,
        )
        self.refused_chunks = Counter(
            "splitrl_refused_chunks",
            "Chunks the learner sampled and refused: content no run of its spec makes (core.chunk_content).",
            registry=None,
        )
        self.stale_chunks_dropped = Counter(
            "splitrl_stale_chunks_dropped",
            "Chunks the learner dropped for exceeding max_policy_lag.",
            registry=None,
        )
        self.encoder_version = Gauge(
            "splitrl_encoder_version", "Optimizer steps the edge encoder has taken (split modes).", registry=None
        )
        self.encoder_updates = Counter(
            "splitrl_encoder_updates", "Gradient batches the edge applied to its encoder.", registry=None
        )
        self.observation_store_size = Gauge(
            "splitrl_observation_store_size",
            "Frame stacks the edge keeps for recomputing activations, by step id (split modes).",
            registry=None,
        )
        self.unknown_step_ids = Counter(
            "splitrl_unknown_step_ids",
            "Step ids asked for by the learner that the edge no longer holds, by request kind.",
            ["request"],
            registry=None,
        )
        self.encoder_lag = Histogram(
            "splitrl_encoder_lag",
            "Encoder versions between the edge's encoder and a stored activation the learner sends a gradient for.",
            buckets=(0, 1, 2, 3, 5, 10, 20, 50, 100, 200),
            registry=None,
        )
        self.stale_activations_dropped = Counter(
            "splitrl_stale_activations_dropped",
            "Stored activations whose gradient the learner did not send: more than max_encoder_lag versions old.",
            registry=None,
        )
        self.streams_open = Gauge(
            "splitrl_streams_open", "Client streams this server is serving now.", ["method"], registry=None
        )
        self.streams_opened = Counter(
            STREAMS_OPENED,
            "Streams this client opened to each replica of a service (core.replicas spreads them round-robin; a "
            "reconnect opens one more). Label replica: its host:port, one of the configured list.",
            ["service", "replica"],
            registry=None,
        )
        self.video_psnr = Summary(
            "splitrl_video_psnr_db",
            "PSNR (dB) of each batch of frames as the cloud decodes them, measured on the edge by decoding its own "
            "H.264 packets (cloud --codec h264); identical frames count as 100 dB. Mean = _sum / _count.",
            registry=None,
        )
        self.worker_cpu_seconds = Gauge(
            WORKER_CPU_SECONDS,
            "CPU seconds (user + system) this service's worker processes have used, ended workers included; "
            "0 without workers. The service's own are process_cpu_seconds_total.",
            registry=None,
        )
        self.worker_resident_bytes = Gauge(
            WORKER_RESIDENT_BYTES,
            "Resident memory of this service's worker processes (bytes; as last seen for ended workers).",
            registry=None,
        )
        self.worker_peak_resident_bytes = Gauge(
            WORKER_PEAK_RESIDENT_BYTES,
            "The sum of this service's worker processes' peak resident memory (bytes; 0 without workers).",
            registry=None,
        )
        self.peak_resident_bytes = Gauge(
            PEAK_RESIDENT_BYTES,
            "Peak resident memory (bytes) of this service's own process since it started (VmHWM; NaN where the "
            "system does not say); its worker processes' are splitrl_worker_peak_resident_memory_bytes.",
            registry=None,
        )
        self.peak_resident_bytes.set_function(peak_resident_bytes)
        self.video_shadow_bytes = Counter(
            VIDEO_SHADOW_BYTES,
            "Split modes with --video-shadow: bytes (protobuf, as splitrl_link_bytes counts them) the rollout's "
            "ActRequests would have had in cloud mode over H.264: each request as sent, with its frames' H.264 "
            "packets in place of the activations. Cloud's uplink bytes for this very driving; nothing is sent.",
            registry=None,
        )
        self.video_decode_errors = Counter(
            "splitrl_video_decode_errors",
            "H.264 packets inference could not decode to one frame of the stream's size; each ends its stream "
            "(also counted in splitrl_rejected_requests).",
            registry=None,
        )
        for metric in self._families():  # in the order defined above: a scrape reads them in this order
            if self.exported is None or _family(metric) in self.exported:
                registry.register(metric)

    def _families(self) -> list[MetricWrapperBase]:
        return [value for value in vars(self).values() if isinstance(value, MetricWrapperBase)]

    def unexported_in_use(self) -> list[str]:
        """Families this service updated but does not export (SERVICE_FAMILIES lacks them): each was counted and
        then never served. A family is in use once it has a labelled series or a value other than 0 (so a gauge
        only ever set to 0 goes unseen, and an Info, 1 without labels, always counts: splitrl_run is shared)."""
        if self.exported is None:
            return []
        return sorted(
            _family(metric) for metric in self._families() if _family(metric) not in self.exported and _in_use(metric)
        )


def _family(metric: MetricWrapperBase) -> str:
    return next(iter(metric.describe())).name


def _in_use(metric: MetricWrapperBase) -> bool:
    return any(
        set(sample.labels) - {"le"} or (sample.value != 0 and not sample.name.endswith("_created"))
        for family in metric.collect()
        for sample in family.samples
    )
