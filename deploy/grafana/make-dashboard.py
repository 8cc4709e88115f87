#!/usr/bin/env python3
"""Write deploy/grafana/dashboards/splitrl-network.json, the network-usage dashboard.

    python3 deploy/grafana/make-dashboard.py          # rewrite the JSON
    python3 deploy/grafana/make-dashboard.py --check  # exit 1 if the JSON is not what this writes

The panels are declared below as rows of (title, PromQL, unit) built with Grafana's own typed
builders (grafana-foundation-sdk, pinned to the Grafana release docker-compose.yml runs), which
also lay them out on the 24-column grid. Every query reads only series that splitrl exports
(services/splitrl/core/metrics.py) or that deploy/prometheus/rules/ records;
check-dashboards.py checks that, and runs every query against a real Prometheus.
Run it with the dev extra installed: the WAN links come from splitrl.core.metrics.WAN_LINKS.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import TypeVar

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    LegendDisplayMode,
    LegendPlacement,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from splitrl.core.metrics import WAN_LINKS

OUT = Path(__file__).resolve().parent / "dashboards" / "splitrl-network.json"
PROMETHEUS = DataSourceRef(type_val="prometheus", uid="prometheus")  # provisioning/datasources/prometheus.yml
WAN = f'link=~"{"|".join(sorted(WAN_LINKS))}"'
RATE = "[$__rate_interval]"
SPLITRL = 'tier!=""'  # splitrl's own targets (deploy/prometheus/prometheus.yml labels them edge or cloud)
GRAPH_HEIGHT, NUMBER_HEIGHT = 8, 6  # grid rows

Panel = timeseries.Panel | stat.Panel
P = TypeVar("P", timeseries.Panel, stat.Panel)


def query(expr: str, legend: str = "") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend)


def _common(
    panel: P, title: str, queries: tuple[prometheus.Dataquery, ...], unit: str, description: str, width: int
) -> P:
    """What every panel sets: title, description, the provisioned Prometheus, its queries (named A, B, C...,
    the names check-dashboards reports problems by), unit and width."""
    targets = [target.ref_id(chr(ord("A") + i)) for i, target in enumerate(queries)]
    return panel.title(title).description(description).datasource(PROMETHEUS).targets(targets).unit(unit).span(width)


def graph(
    title: str, *queries: prometheus.Dataquery, unit: str = "short", description: str = "", width: int = 12
) -> timeseries.Panel:
    """A time series of every query, with a table legend of last and mean values."""
    legend = (
        common.VizLegendOptions()
        .display_mode(LegendDisplayMode.TABLE)
        .placement(LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["lastNotNull", "mean"])
    )
    return (
        _common(timeseries.Panel(), title, queries, unit, description, width)
        .height(GRAPH_HEIGHT)
        .legend(legend)
        .tooltip(common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI))
    )


def number(
    title: str, *queries: prometheus.Dataquery, unit: str = "short", description: str = "", width: int = 6
) -> stat.Panel:
    """A single figure (the last value) over a sparkline."""
    return (
        _common(stat.Panel(), title, queries, unit, description, width)
        .height(NUMBER_HEIGHT)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .color_mode(BigValueColorMode.VALUE)
        .graph_mode(BigValueGraphMode.AREA)
    )


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "WAN (edge <-> cloud)",
        [
            number(
                "WAN bytes per env step",
                query(
                    f'sum(rate(splitrl_link_bytes_total{{{WAN}, direction="sent"}}{RATE}))'
                    f" / sum(rate(splitrl_env_steps_total{RATE}))",
                    "bytes/step",
                ),
                unit="decbytes",
                description="Both directions of every WAN link, counted once (direction=sent at each end), "
                "per agent step.",
                width=6,
            ),
            number(
                "WAN numbers per env step",
                query(
                    f'sum(rate(splitrl_link_elements_total{{{WAN}, direction="sent"}}{RATE}))'
                    f" / sum(rate(splitrl_env_steps_total{RATE}))",
                    "numbers/step",
                ),
                description="Tensor elements per agent step: the talk's unit (x2 for its bf16 bytes).",
                width=6,
            ),
            number(
                "Cumulative WAN bytes, by phase",
                query(f'sum by (phase) (splitrl_link_bytes_total{{{WAN}, direction="sent"}})', "{{phase}}"),
                unit="decbytes",
                description="Since the services started (a restarted service starts its counters again).",
                width=6,
            ),
            number(
                "Env steps / s",
                query(f"sum(rate(splitrl_env_steps_total{RATE}))", "steps/s"),
                width=6,
            ),
            graph(
                "WAN bytes/s by link, payload and phase",
                query(
                    f'sum by (link, payload, phase) (rate(splitrl_link_bytes_total{{{WAN}, direction="sent"}}{RATE}))',
                    "{{link}} {{payload}} ({{phase}})",
                ),
                unit="Bps",
            ),
            graph(
                "WAN bytes per env step, by mode and phase",
                query("splitrl:wan_bytes_per_env_step_by_mode_phase:rate1m", "{{mode}} {{phase}}"),
                unit="decbytes",
                description="Recording rule (deploy/prometheus/rules): the mode comes from splitrl_run_info.",
            ),
            graph(
                "Cumulative WAN bytes, by link and phase",
                query(
                    f'sum by (link, phase) (splitrl_link_bytes_total{{{WAN}, direction="sent"}})',
                    "{{link}} ({{phase}})",
                ),
                unit="decbytes",
                width=24,
            ),
        ],
    ),
    (
        "Every link",
        [
            graph(
                "Bytes/s sent, per link and phase",
                query(
                    f'sum by (link, phase) (rate(splitrl_link_bytes_total{{direction="sent"}}{RATE}))',
                    "{{link}} {{phase}}",
                ),
                unit="Bps",
            ),
            graph(
                "Messages/s sent, per link",
                query(f'sum by (link) (rate(splitrl_link_messages_total{{direction="sent"}}{RATE}))', "{{link}}"),
            ),
            graph(
                "Sent minus received bytes/s, per link (should be ~0)",
                query(
                    f'sum by (link) (rate(splitrl_link_bytes_total{{direction="sent"}}{RATE}))'
                    f' - sum by (link) (rate(splitrl_link_bytes_total{{direction="received"}}{RATE}))',
                    "{{link}}",
                ),
                unit="Bps",
                description="Each end of a link counts what it sends and receives; a gap is a lost or uncounted "
                "message (or a scrape taken mid-transfer).",
            ),
            graph(
                "Numbers/s sent, per link",
                query(f'sum by (link) (rate(splitrl_link_elements_total{{direction="sent"}}{RATE}))', "{{link}}"),
            ),
        ],
    ),
    (
        "Learning",
        [
            graph(
                "Mean episode return",
                query(
                    "sum(rate(splitrl_episode_return_sum[5m])) / sum(rate(splitrl_episode_return_count[5m]))",
                    "return (5m mean)",
                ),
            ),
            graph(
                "Learner updates / s and policy version",
                query(f"sum(rate(splitrl_learner_updates_total{RATE}))", "updates/s"),
                query("max by (job) (splitrl_policy_version)", "version ({{job}})"),
            ),
            graph(
                "Policy lag (versions), p50 / p95",
                query(f"histogram_quantile(0.5, sum by (le) (rate(splitrl_policy_lag_bucket{RATE})))", "p50"),
                query(f"histogram_quantile(0.95, sum by (le) (rate(splitrl_policy_lag_bucket{RATE})))", "p95"),
                description="Versions between the learner's policy and the oldest action of each sampled chunk.",
            ),
            graph(
                "Learner loss terms",
                query("max by (term) (splitrl_learner_loss)", "{{term}}"),
            ),
            graph(
                "Learning rate",
                query("max(splitrl_learning_rate)", "Adam learning rate"),
                description="The learner's rate in its last update: constant, or falling to 0 with --lr-anneal-steps.",
            ),
            graph(
                "Entropy bonus weight",
                query("max(splitrl_entropy_coef)", "entropy coefficient"),
                description="The learner's entropy weight in its last update: constant, or falling to 0 with "
                "--entropy-anneal-steps.",
            ),
            graph(
                "Encoder version and lag (split modes)",
                query("max(splitrl_encoder_version)", "edge encoder version"),
                query(f"histogram_quantile(0.95, sum by (le) (rate(splitrl_encoder_lag_bucket{RATE})))", "lag p95"),
                description="split-accumulate: encoder versions between the edge and the stored activations "
                "it receives gradients for (no data in the other modes).",
            ),
            graph(
                "Dropped as stale, per s",
                query(f"sum(rate(splitrl_stale_chunks_dropped_total{RATE}))", "chunks (policy lag)"),
                query(f"sum(rate(splitrl_stale_activations_dropped_total{RATE}))", "activations (encoder lag)"),
            ),
        ],
    ),
    (
        "Inference and replay",
        [
            graph(
                "Inference batch size (mean, p95)",
                query(
                    f"sum(rate(splitrl_inference_batch_size_sum{RATE}))"
                    f" / sum(rate(splitrl_inference_batch_size_count{RATE}))",
                    "mean",
                ),
                query(
                    f"histogram_quantile(0.95, sum by (le) (rate(splitrl_inference_batch_size_bucket{RATE})))",
                    "p95",
                ),
            ),
            graph(
                "Hop latency p50 / p95",
                query(
                    f"histogram_quantile(0.5, sum by (le, hop) (rate(splitrl_hop_latency_seconds_bucket{RATE})))",
                    "{{hop}} p50",
                ),
                query(
                    f"histogram_quantile(0.95, sum by (le, hop) (rate(splitrl_hop_latency_seconds_bucket{RATE})))",
                    "{{hop}} p95",
                ),
                unit="s",
            ),
            graph(
                "Replay fill",
                query(
                    "sum by (table) (splitrl_replay_table_size) / sum by (table) (splitrl_replay_table_max_size)",
                    "{{table}}",
                ),
                unit="percentunit",
            ),
            graph(
                "Replay rate limiter",
                query("sum by (table) (splitrl_replay_rate_limiter_diff)", "{{table}} diff"),
                query(
                    f"sum by (table, op) (rate(splitrl_replay_rate_limiter_blocked_total{RATE}))",
                    "{{table}} {{op}} blocked/s",
                ),
                description="diff = inserts x samples_per_insert - samples; calls that had to wait, per second.",
            ),
            graph(
                "Replay inserts, samples and evictions / s",
                query(f"sum by (table) (rate(splitrl_replay_inserts_total{RATE}))", "{{table}} inserts"),
                query(f"sum by (table) (rate(splitrl_replay_samples_total{RATE}))", "{{table}} samples"),
                query(f"sum by (table) (rate(splitrl_replay_evictions_total{RATE}))", "{{table}} evictions"),
            ),
            graph(
                "Rejected requests / s",
                query(
                    f"sum by (method, code) (rate(splitrl_rejected_requests_total{RATE})) or vector(0)",
                    "{{method}} {{code}}",
                ),
                description="Bad input refused by a service (0 when nothing was refused).",
            ),
        ],
    ),
    (
        "What each process costs (the edge's besides its WAN bytes)",
        [
            graph(
                "Resident memory per service, and its peak",
                query(
                    f"sum by (tier, service, instance) (process_resident_memory_bytes{{{SPLITRL}}})"
                    f" + sum by (tier, service, instance) (splitrl_worker_resident_memory_bytes{{{SPLITRL}}})",
                    "{{service}} ({{tier}}, {{instance}})",
                ),
                query(
                    f"sum by (tier, service, instance) (splitrl_process_peak_resident_memory_bytes{{{SPLITRL}}})"
                    f" + sum by (tier, service, instance) (splitrl_worker_peak_resident_memory_bytes{{{SPLITRL}}})",
                    "{{service}} peak ({{tier}}, {{instance}})",
                ),
                unit="bytes",
                description="The service's process and its env workers (environment --env-workers), now and at "
                "their peaks since they started (summed: an upper bound), what a device must have free for them.",
            ),
            graph(
                "CPU per env step, per service",
                query(
                    f"1000 * (sum by (tier, service, instance) (rate(process_cpu_seconds_total{{{SPLITRL}}}{RATE}))"
                    f" + sum by (tier, service, instance) (rate(splitrl_worker_cpu_seconds{{{SPLITRL}}}{RATE})))"
                    f" / scalar(sum(rate(splitrl_env_steps_total{RATE})))",
                    "{{service}} ({{tier}}, {{instance}})",
                ),
                unit="ms",
                description="CPU milliseconds (user + system, env workers included) per agent step of every "
                "env of every edge: with several edges, an edge process's share of all of their steps.",
            ),
        ],
    ),
]


def dashboard_model() -> dashboard.Dashboard:
    """Every row and its panels, numbered 1, 2, ... in reading order and laid out by the builder."""
    board = (
        dashboard.Dashboard("splitrl: network usage")
        .uid("splitrl-network")
        .description(
            "Bytes, messages and numbers on every splitrl link (docs/design.md §4); WAN links are "
            "encoder-inference and learner-encoder. Generated by deploy/grafana/make-dashboard.py."
        )
        .tags(["splitrl"])
        .timezone("browser")
        .readonly()
        .refresh("10s")
        .time("now-30m", "now")
    )
    panel_ids = itertools.count(1)
    for row_title, panels in ROWS:
        board = board.with_row(dashboard.Row(row_title).id(next(panel_ids)))
        for panel in panels:
            board = board.with_panel(panel.id(next(panel_ids)))
    return board.build()


def render() -> str:
    return json.dumps(dashboard_model(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


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
