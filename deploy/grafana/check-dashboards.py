#!/usr/bin/env python3
"""Check Grafana dashboards without a Grafana server (none can run on the project's machines).

    python3 deploy/grafana/check-dashboards.py [--prometheus http://127.0.0.1:9090] [DASHBOARD.json ...]

Structure: unique uid, unique panel ids, a gridPos for each panel, every datasource is the
provisioned one, every target has a PromQL expr, and every splitrl_* series it reads is one
that splitrl exports (services/splitrl/core/metrics.py). With --prometheus, every query is run
against that (real) Prometheus, $__rate_interval taken as 1m: each must evaluate without error.
Exit status 1 on any problem. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATASOURCE_UID = "prometheus"  # provisioning/datasources/prometheus.yml
KNOWN_SERIES = {
    "splitrl_link_bytes_total",
    "splitrl_link_messages_total",
    "splitrl_link_elements_total",
    "splitrl_env_steps_total",
    "splitrl_episode_return_sum",
    "splitrl_episode_return_count",
    "splitrl_inference_batch_size_bucket",
    "splitrl_inference_batch_size_sum",
    "splitrl_inference_batch_size_count",
    "splitrl_hop_latency_seconds_bucket",
    "splitrl_hop_latency_seconds_sum",
    "splitrl_hop_latency_seconds_count",
    "splitrl_replay_table_size",
    "splitrl_policy_version",
    "splitrl_rejected_requests_total",
}
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "30m"}


def panels_of(dashboard: dict) -> list[dict]:
    found = []
    for panel in dashboard.get("panels", []):
        found.append(panel)
        found.extend(panel.get("panels", []))  # panels inside collapsed rows
    return found


def check_structure(path: Path, dashboard: dict) -> list[str]:
    problems = []
    if not dashboard.get("uid") or not dashboard.get("title"):
        problems.append("dashboard needs a uid and a title")
    ids = [p.get("id") for p in panels_of(dashboard)]
    if len(ids) != len(set(ids)) or None in ids:
        problems.append(f"panel ids must be present and unique: {ids}")
    for panel in panels_of(dashboard):
        where = f"panel {panel.get('id')} {panel.get('title')!r}"
        if not {"h", "w", "x", "y"} <= set(panel.get("gridPos", {})):
            problems.append(f"{where}: gridPos needs h, w, x, y")
        if panel.get("type") == "row":
            continue
        if panel.get("datasource", {}).get("uid") != DATASOURCE_UID:
            problems.append(f"{where}: datasource is not uid {DATASOURCE_UID!r}")
        if not panel.get("targets"):
            problems.append(f"{where}: no targets")
        for target in panel.get("targets", []):
            expr = target.get("expr", "")
            if not expr.strip():
                problems.append(f"{where} {target.get('refId')}: empty expr")
            for name in set(re.findall(r"\bsplitrl_[a-z_]+\b", expr)):
                if name not in KNOWN_SERIES:
                    problems.append(f"{where}: reads {name}, which splitrl does not export")
    return [f"{path.name}: {p}" for p in problems]


def run_queries(path: Path, dashboard: dict, prometheus: str) -> list[str]:
    problems = []
    for panel in panels_of(dashboard):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            url = f"{prometheus.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    reply = json.load(response)
            except urllib.error.HTTPError as error:
                reply = json.load(error)
            if reply.get("status") != "success":
                problems.append(f"{path.name}: {panel['title']!r}: {reply.get('error')} in {expr}")
                continue
            count = len(reply["data"]["result"])
            print(f"  {'ok   ' if count else 'empty'} {count:3d} series  {panel['title']} [{target['refId']}]")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dashboards", nargs="*", type=Path)
    parser.add_argument("--prometheus", help="base URL of a Prometheus to run every query against")
    args = parser.parse_args()
    paths = args.dashboards or sorted((HERE / "dashboards").glob("*.json"))
    problems = []
    for path in paths:
        dashboard = json.loads(path.read_text())
        print(f"{path}: {len(panels_of(dashboard))} panels")
        problems += check_structure(path, dashboard)
        if args.prometheus:
            problems += run_queries(path, dashboard, args.prometheus)
    for problem in problems:
        print("PROBLEM", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
