"""Reading splitrl's own Prometheus text back: link counters and a few totals.

Used by `splitrl up` for live progress and run summaries, and by tests that
check the counters. Both ends of a link appear (direction sent / received).
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_LINK_FAMILIES = {
    "splitrl_link_bytes": "bytes",
    "splitrl_link_messages": "messages",
    "splitrl_link_elements": "elements",
}


def fetch(metrics_port: int, host: str = "127.0.0.1", timeout_s: float = 2.0) -> str:
    """GET http://host:port/metrics (only ever a splitrl service the caller started)."""
    with urllib.request.urlopen(f"http://{host}:{metrics_port}/metrics", timeout=timeout_s) as response:
        return response.read().decode()


def samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) for every sample in a Prometheus text exposition."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


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


def total(texts: Iterable[str], sample_name: str) -> float:
    """Sum of every sample called `sample_name` (e.g. splitrl_env_steps_total), over all expositions."""
    return sum(value for text in texts for name, _, value in samples(text) if name == sample_name)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in sorted(value.items())}
    return value
