"""Reading splitrl's own Prometheus text back: link counters and a few totals.

Used by `splitrl up` for live progress and run summaries, and by tests that
check the counters. Both ends of a link appear (direction sent / received).
"""

from __future__ import annotations

import functools
import math
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from splitrl.core.metrics import (
    LINK_BYTES,
    LINK_ELEMENTS,
    LINK_MESSAGES,
    PEAK_RESIDENT_BYTES,
    WAN_LINKS,
    WORKER_CPU_SECONDS,
    WORKER_PEAK_RESIDENT_BYTES,
    WORKER_RESIDENT_BYTES,
)

_LINK_FAMILIES = {
    LINK_BYTES: "bytes",
    LINK_MESSAGES: "messages",
    LINK_ELEMENTS: "elements",
}


def fetch(metrics_port: int, host: str = "127.0.0.1", timeout_s: float = 2.0) -> str:
    """GET http://host:port/metrics (only ever a splitrl service the caller started)."""
    with urllib.request.urlopen(f"http://{host}:{metrics_port}/metrics", timeout=timeout_s) as response:
        return response.read().decode()


#: One sample of an exposition: (sample name, labels, value). Its labels are shared between callers: read only.
Sample = tuple[str, dict[str, str], float]


def samples(text: str) -> Iterable[Sample]:
    """(sample name, labels, value) for every sample in a Prometheus text exposition.

    Each text is parsed once while it is recent: `splitrl up` reads every service's newest exposition for its
    progress line, its curve point and TensorBoard, ~10 readings per text, and prometheus_client's parser takes
    milliseconds for each exposition: parsing at every reading would keep `splitrl up` a noticeable share of a
    core busy, several times what parsing once costs.
    """
    return _parsed(text)


@functools.lru_cache(maxsize=64)  # a run's newest and retired expositions, several times over
def _parsed(text: str) -> tuple[Sample, ...]:
    return tuple(
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )


def link_counts(texts: Iterable[str]) -> dict[str, Any]:
    """links[link][phase][payload][direction][bytes|messages|elements], summed over expositions."""
    links: dict[str, Any] = defaultdict(
        lambda: defaultdict(
            lambda: defaultdict(lambda: defaultdict(lambda: {"bytes": 0, "messages": 0, "elements": 0}))
        )
    )
    for text in texts:
        for name, labels, value in samples(text):
            unit = _LINK_FAMILIES.get(name.removesuffix("_total"))
            if unit is None or not name.endswith("_total"):
                continue
            entry = links[labels["link"]][labels["phase"]][labels["payload"]][labels["direction"]]
            entry[unit] += int(value)
    return _plain(links)


def link_totals(links: dict[str, Any], *, direction: str = "sent", unit: str = "bytes") -> dict[tuple[str, str], int]:
    """`unit` (bytes, messages or elements) per (link, phase) as counted at the `direction` end, over all
    payloads, from a `link_counts` result."""
    return {
        (link, phase): sum(ends.get(direction, {}).get(unit, 0) for ends in payloads.values())
        for link, phases in links.items()
        for phase, payloads in phases.items()
    }


def sent_bytes(links: dict[str, Any]) -> dict[tuple[str, str], int]:
    """Bytes sent per (link, phase), over all payloads, from a `link_counts` result."""
    return link_totals(links)


def wan_by_phase(links: dict[str, Any], unit: str = "bytes") -> dict[str, int]:
    """`unit` sent on WAN links (each direction once, by its sender) per phase, from a `link_counts` result."""
    wan: dict[str, int] = {}
    for (link, phase), sent in link_totals(links, unit=unit).items():
        if link in WAN_LINKS:
            wan[phase] = wan.get(phase, 0) + sent
    return wan


def total(texts: Iterable[str], sample_name: str) -> float:
    """Sum of every sample called `sample_name` (e.g. splitrl_env_steps_total), over all expositions."""
    return sum(value for text in texts for name, _, value in samples(text) if name == sample_name)


def largest(texts: Iterable[str], sample_name: str) -> float:
    """The largest sample called `sample_name` over all expositions (a gauge only one service sets, such as
    a timestamp, which a registry of every family exports at 0); 0 where there is none."""
    return max((value for text in texts for name, _, value in samples(text) if name == sample_name), default=0.0)


@dataclass(frozen=True)
class ProcessCost:
    """What one service used, from one exposition of its /metrics (its final one: up to then), its env worker
    processes included: CPU seconds (user + system), resident bytes now, and peak resident bytes (its process's
    peak plus each worker's: an upper bound on their peak together). NaN for what the exposition does not say
    (the process_* series and the peak need Linux's /proc)."""

    cpu_seconds: float
    resident_bytes: float
    peak_resident_bytes: float


def process_cost(text: str) -> ProcessCost:
    """The ProcessCost in one service's exposition `text`."""
    values: dict[str, float] = {name: value for name, _, value in samples(text)}

    def own_and_workers(own: str, workers: str) -> float:
        return values.get(own, math.nan) + values.get(workers, 0.0)

    return ProcessCost(
        cpu_seconds=own_and_workers("process_cpu_seconds_total", WORKER_CPU_SECONDS),
        resident_bytes=own_and_workers("process_resident_memory_bytes", WORKER_RESIDENT_BYTES),
        peak_resident_bytes=own_and_workers(PEAK_RESIDENT_BYTES, WORKER_PEAK_RESIDENT_BYTES),
    )


def histogram(texts: Iterable[str], name: str, **match: str) -> tuple[list[tuple[float, float]], float, float]:
    """(cumulative buckets [(le, count)], sum, count) of histogram `name`, summed over expositions and over
    every series whose labels include `match` (e.g. hop="edge-inference")."""
    buckets: dict[float, float] = defaultdict(float)
    total_sum = total_count = 0.0
    for text in texts:
        for sample, labels, value in samples(text):
            if any(labels.get(key) != wanted for key, wanted in match.items()):
                continue
            if sample == f"{name}_bucket":
                buckets[float(labels["le"])] += value
            elif sample == f"{name}_sum":
                total_sum += value
            elif sample == f"{name}_count":
                total_count += value
    return sorted(buckets.items()), total_sum, total_count


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The `q` quantile of cumulative `buckets`, interpolated linearly inside its bucket (Prometheus's
    histogram_quantile); None without observations. A quantile in the +Inf bucket is the largest finite bound."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def upper_bound(buckets: list[tuple[float, float]]) -> float | None:
    """The smallest bucket bound that holds every observation (an upper bound on the maximum); None if empty."""
    if not buckets or buckets[-1][1] == 0:
        return None
    total_count = buckets[-1][1]
    return next(bound for bound, count in buckets if count >= total_count)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in sorted(value.items())}
    return value
