#!/usr/bin/env python3
"""Write deploy/grafana/dashboards/splitrl-network.json, the network-usage dashboard.

    python3 deploy/grafana/make-dashboard.py          # rewrite the JSON
    python3 deploy/grafana/make-dashboard.py --check  # exit 1 if the JSON is not what this writes

The panels are declared below as (title, PromQL, unit); this script adds Grafana's
boilerplate and lays them out on the 24-column grid. Every query reads only series that
splitrl exports (services/splitrl/core/metrics.py) or that deploy/prometheus/rules/
records; check-dashboards.py checks that, and runs every query against a real Prometheus.
Run it with splitrl installed: the WAN links come from splitrl.core.metrics.WAN_LINKS.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from splitrl.core.metrics import WAN_LINKS

OUT = Path(__file__).resolve().parent / "dashboards" / "splitrl-network.json"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}  # provisioning/datasources/prometheus.yml
WAN = f'link=~"{"|".join(sorted(WAN_LINKS))}"'
RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    description: str = ""
    width: int = 12


@dataclass
class Row:
    title: str
    panels: list[Panel] = field(default_factory=list)


def q(expr: str, legend: str = "") -> tuple[Query, ...]:
    return (Query(expr, legend),)


ROWS = [
    Row(
        "WAN (edge <-> cloud)",
        [
            Panel(
                "WAN bytes per env step",
                q(
                    f'sum(rate(splitrl_link_bytes_total{{{WAN}, direction="sent"}}{RATE}))'
                    f" / sum(rate(splitrl_env_steps_total{RATE}))",
                    "bytes/step",
                ),
                unit="decbytes",
                kind="stat",
                description="Both directions of every WAN link, counted once (direction=sent at each end), "
                "per agent step.",
                width=6,
            ),
            Panel(
                "WAN numbers per env step",
                q(
                    f'sum(rate(splitrl_link_elements_total{{{WAN}, direction="sent"}}{RATE}))'
                    f" / sum(rate(splitrl_env_steps_total{RATE}))",
                    "numbers/step",
                ),
                kind="stat",
                description="Tensor elements per agent step: the talk's unit (x2 for its bf16 bytes).",
                width=6,
            ),
            Panel(
                "Cumulative WAN bytes, by phase",
                q(f'sum by (phase) (splitrl_link_bytes_total{{{WAN}, direction="sent"}})', "{{phase}}"),
                unit="decbytes",
                kind="stat",
                description="Since the services started (a restarted service starts its counters again).",
                width=6,
            ),
            Panel(
                "Env steps / s",
                q(f"sum(rate(splitrl_env_steps_total{RATE}))", "steps/s"),
                kind="stat",
                width=6,
            ),
            Panel(
                "WAN bytes/s by link, payload and phase",
                q(
                    f'sum by (link, payload, phase) (rate(splitrl_link_bytes_total{{{WAN}, direction="sent"}}{RATE}))',
                    "{{link}} {{payload}} ({{phase}})",
                ),
                unit="Bps",
            ),
            Panel(
                "WAN bytes per env step, by mode and phase",
                q("splitrl:wan_bytes_per_env_step_by_mode_phase:rate1m", "{{mode}} {{phase}}"),
                unit="decbytes",
                description="Recording rule (deploy/prometheus/rules): the mode comes from splitrl_run_info.",
            ),
            Panel(
                "Cumulative WAN bytes, by link and phase",
                q(
                    f'sum by (link, phase) (splitrl_link_bytes_total{{{WAN}, direction="sent"}})',
                    "{{link}} ({{phase}})",
                ),
                unit="decbytes",
                width=24,
            ),
        ],
    ),
    Row(
        "Every link",
        [
            Panel(
                "Bytes/s sent, per link and phase",
                q(
                    f'sum by (link, phase) (rate(splitrl_link_bytes_total{{direction="sent"}}{RATE}))',
                    "{{link}} {{phase}}",
                ),
                unit="Bps",
            ),
            Panel(
                "Messages/s sent, per link",
                q(f'sum by (link) (rate(splitrl_link_messages_total{{direction="sent"}}{RATE}))', "{{link}}"),
            ),
            Panel(
                "Sent minus received bytes/s, per link (should be ~0)",
                q(
                    f'sum by (link) (rate(splitrl_link_bytes_total{{direction="sent"}}{RATE}))'
                    f' - sum by (link) (rate(splitrl_link_bytes_total{{direction="received"}}{RATE}))',
                    "{{link}}",
                ),
                unit="Bps",
                description="Each end of a link counts what it sends and receives; a gap is a lost or uncounted "
                "message (or a scrape taken mid-transfer).",
            ),
            Panel(
                "Numbers/s sent, per link",
                q(f'sum by (link) (rate(splitrl_link_elements_total{{direction="sent"}}{RATE}))', "{{link}}"),
            ),
        ],
    ),
    Row(
        "Learning",
        [
            Panel(
                "Mean episode return",
                q(
                    "sum(rate(splitrl_episode_return_sum[5m])) / sum(rate(splitrl_episode_return_count[5m]))",
                    "return (5m mean)",
                ),
            ),
            Panel(
                "Learner updates / s and policy version",
                (
                    Query(f"sum(rate(splitrl_learner_updates_total{RATE}))", "updates/s"),
                    Query("max by (job) (splitrl_policy_version)", "version ({{job}})"),
                ),
            ),
            Panel(
                "Policy lag (versions), p50 / p95",
                (
                    Query(f"histogram_quantile(0.5, sum by (le) (rate(splitrl_policy_lag_bucket{RATE})))", "p50"),
                    Query(f"histogram_quantile(0.95, sum by (le) (rate(splitrl_policy_lag_bucket{RATE})))", "p95"),
                ),
                description="Versions between the learner's policy and the oldest action of each sampled chunk.",
            ),
            Panel(
                "Learner loss terms",
                q("max by (term) (splitrl_learner_loss)", "{{term}}"),
            ),
            Panel(
                "Encoder version and lag (split modes)",
                (
                    Query("max(splitrl_encoder_version)", "edge encoder version"),
                    Query(f"histogram_quantile(0.95, sum by (le) (rate(splitrl_encoder_lag_bucket{RATE})))", "lag p95"),
                ),
                description="split-accumulate: encoder versions between the edge and the stored activations "
                "it receives gradients for (no data in the other modes).",
            ),
            Panel(
                "Dropped as stale, per s",
                (
                    Query(f"sum(rate(splitrl_stale_chunks_dropped_total{RATE}))", "chunks (policy lag)"),
                    Query(f"sum(rate(splitrl_stale_activations_dropped_total{RATE}))", "activations (encoder lag)"),
                ),
            ),
        ],
    ),
    Row(
        "Inference and replay",
        [
            Panel(
                "Inference batch size (mean, p95)",
                (
                    Query(
                        f"sum(rate(splitrl_inference_batch_size_sum{RATE}))"
                        f" / sum(rate(splitrl_inference_batch_size_count{RATE}))",
                        "mean",
                    ),
                    Query(
                        f"histogram_quantile(0.95, sum by (le) (rate(splitrl_inference_batch_size_bucket{RATE})))",
                        "p95",
                    ),
                ),
            ),
            Panel(
                "Hop latency p50 / p95",
                (
                    Query(
                        f"histogram_quantile(0.5, sum by (le, hop) (rate(splitrl_hop_latency_seconds_bucket{RATE})))",
                        "{{hop}} p50",
                    ),
                    Query(
                        f"histogram_quantile(0.95, sum by (le, hop) (rate(splitrl_hop_latency_seconds_bucket{RATE})))",
                        "{{hop}} p95",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Replay fill",
                q(
                    "sum by (table) (splitrl_replay_table_size) / sum by (table) (splitrl_replay_table_max_size)",
                    "{{table}}",
                ),
                unit="percentunit",
            ),
            Panel(
                "Replay rate limiter",
                (
                    Query("sum by (table) (splitrl_replay_rate_limiter_diff)", "{{table}} diff"),
                    Query(
                        f"sum by (table, op) (rate(splitrl_replay_rate_limiter_blocked_total{RATE}))",
                        "{{table}} {{op}} blocked/s",
                    ),
                ),
                description="diff = inserts x samples_per_insert - samples; calls that had to wait, per second.",
            ),
            Panel(
                "Replay inserts, samples and evictions / s",
                (
                    Query(f"sum by (table) (rate(splitrl_replay_inserts_total{RATE}))", "{{table}} inserts"),
                    Query(f"sum by (table) (rate(splitrl_replay_samples_total{RATE}))", "{{table}} samples"),
                    Query(f"sum by (table) (rate(splitrl_replay_evictions_total{RATE}))", "{{table}} evictions"),
                ),
            ),
            Panel(
                "Rejected requests / s",
                q(
                    f"sum by (method, code) (rate(splitrl_rejected_requests_total{RATE})) or vector(0)",
                    "{{method}} {{code}}",
                ),
                description="Bad input refused by a service (0 when nothing was refused).",
            ),
        ],
    ),
]


def panel_json(panel: Panel, panel_id: int, grid: dict[str, int]) -> dict:
    targets = [
        {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": query.expr, "legendFormat": query.legend}
        for i, query in enumerate(panel.queries)
    ]
    if panel.kind == "stat":
        options: dict = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
        }
    else:
        options = {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "mean"]},
            "tooltip": {"mode": "multi"},
        }
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": grid,
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": targets,
        "options": options,
    }


def dashboard() -> dict:
    panels: list[dict] = []
    y = 0
    for row in ROWS:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        x = 0
        for panel in row.panels:
            height = 6 if panel.kind == "stat" else 8
            if x + panel.width > 24:
                x, y = 0, y + height
            panels.append(panel_json(panel, len(panels) + 1, {"h": height, "w": panel.width, "x": x, "y": y}))
            x += panel.width
        y += 8
    return {
        "uid": "splitrl-network",
        "title": "splitrl: network usage",
        "description": "Bytes, messages and numbers on every splitrl link (docs/design.md §4); WAN links are "
        "encoder-inference and learner-encoder. Generated by deploy/grafana/make-dashboard.py.",
        "tags": ["splitrl"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs from this script's")
    args = parser.parse_args()
    if args.check:
        if OUT.read_text() != render():
            print(f"{OUT} is stale: run python3 {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(render())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
