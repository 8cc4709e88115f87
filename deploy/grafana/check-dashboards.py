#!/usr/bin/env python3
"""Check Grafana dashboards without a Grafana server (none can run on the project's machines).

    python deploy/grafana/check-dashboards.py [--prometheus URL [--require-data]] [DASHBOARD.json ...]

Structure: unique uid, unique panel ids, a gridPos for each panel, every datasource is the
provisioned one, every target has a PromQL expr, and every series it reads is one that
splitrl exports (read from splitrl.core.metrics, so run it with splitrl installed) or that a
recording rule in deploy/prometheus/rules/ records. With --prometheus, every query is run
against that (real) Prometheus, $__rate_interval taken as 1m: each must evaluate without
error and, with --require-data, return at least one series. Exit status 1 on any problem.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry

from splitrl.core.metrics import Metrics

HERE = Path(__file__).resolve().parent
RULES = HERE.parent / "prometheus" / "rules"
DATASOURCE_UID = "prometheus"  # provisioning/datasources/prometheus.yml
#: The sample names each metric type exposes (prometheus_client's text format).
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count", ""),
    "info": ("_info",),
}


def known_series() -> set[str]:
    """Every sample name a splitrl service can export, and every recorded rule name."""
    names = set()
    for family in Metrics(CollectorRegistry()).registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    for rules in RULES.glob("*.rules.yml"):
        names.update(re.findall(r"^\s*- record:\s*(\S+)", rules.read_text(), flags=re.MULTILINE))
    return names


GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "30m"}


def panels_of(dashboard: dict) -> list[dict]:
    found = []
    for panel in dashboard.get("panels", []):
        found.append(panel)
        found.extend(panel.get("panels", []))  # panels inside collapsed rows
    return found


def check_structure(path: Path, dashboard: dict) -> list[str]:
    problems = []
    known = known_series()
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
            for name in set(re.findall(r"\bsplitrl[_:][a-z_:0-9]+", expr)):
                if name not in known:
                    problems.append(f"{where}: reads {name}, which splitrl does not export")
    return [f"{path.name}: {p}" for p in problems]


def query(prometheus: str, expr: str) -> dict:
    """Prometheus's JSON reply to an instant query; an error reply is returned, not raised."""
    url = f"{prometheus.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return dict(json.load(response))
    except urllib.error.HTTPError as error:
        return dict(json.load(error))


def run_queries(path: Path, dashboard: dict, prometheus: str, *, require_data: bool = False) -> list[str]:
    problems = []
    for panel in panels_of(dashboard):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            reply = query(prometheus, expr)
            if reply.get("status") != "success":
                problems.append(f"{path.name}: {panel['title']!r}: {reply.get('error')} in {expr}")
                continue
            count = len(reply["data"]["result"])
            if require_data and not count:
                problems.append(f"{path.name}: {panel['title']!r} [{target['refId']}] returned no data: {expr}")
            print(f"  {'ok   ' if count else 'empty'} {count:3d} series  {panel['title']} [{target['refId']}]")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dashboards", nargs="*", type=Path)
    parser.add_argument("--prometheus", help="base URL of a Prometheus to run every query against")
    parser.add_argument("--require-data", action="store_true", help="with --prometheus: an empty result is a problem")
    args = parser.parse_args()
    paths = args.dashboards or sorted((HERE / "dashboards").glob("*.json"))
    problems = []
    for path in paths:
        dashboard = json.loads(path.read_text())
        print(f"{path}: {len(panels_of(dashboard))} panels")
        problems += check_structure(path, dashboard)
        if args.prometheus:
            problems += run_queries(path, dashboard, args.prometheus, require_data=args.require_data)
    for problem in problems:
        print("PROBLEM", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
