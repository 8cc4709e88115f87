"""Prometheus config and rules pass promtool; the Grafana dashboard is fresh and reads real series."""

from __future__ import annotations

import copy
import importlib.metadata
import json
from pathlib import Path

import yaml

from tests.deploy.conftest import REPO, load_script, promtool

PROMETHEUS = REPO / "deploy" / "prometheus"


def test_promtool_accepts_the_compose_config_and_rules() -> None:
    for args in (
        ("check", "config", str(PROMETHEUS / "prometheus.yml")),
        ("check", "rules", str(PROMETHEUS / "rules" / "splitrl.rules.yml")),
    ):
        result = promtool(*args)
        assert result.returncode == 0, result.stdout + result.stderr


def test_recording_rules_compute_wan_bytes_per_step_by_mode_and_phase() -> None:
    result = promtool("test", "rules", str(PROMETHEUS / "rules" / "splitrl.rules.test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_every_service() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"environment", "edge-encoder", "inference", "replay", "learner"} <= jobs


def test_dashboard_json_is_what_the_generator_writes() -> None:
    make = load_script("deploy/grafana/make-dashboard.py")
    assert make.OUT.read_text() == make.render(), "run: python deploy/grafana/make-dashboard.py"


def test_dashboard_structure_and_series_are_valid() -> None:
    check = load_script("deploy/grafana/check-dashboards.py")
    path = REPO / "deploy" / "grafana" / "dashboards" / "splitrl-network.json"
    dashboard = json.loads(path.read_text())
    assert check.check_structure(path, dashboard) == []
    titles = {panel["title"] for panel in check.panels_of(dashboard)}
    for wanted in ("Env steps / s", "Mean episode return", "Replay fill", "Replay rate limiter"):
        assert wanted in titles


def test_dashboard_check_catches_a_series_nobody_exports(tmp_path: Path) -> None:
    check = load_script("deploy/grafana/check-dashboards.py")
    dashboard = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "splitrl-network.json").read_text())
    broken = copy.deepcopy(dashboard)
    panel = next(p for p in check.panels_of(broken) if p["type"] != "row")
    panel["targets"][0]["expr"] = "rate(splitrl_made_up_bytes_total[1m])"
    problems = check.check_structure(tmp_path / "broken.json", broken)
    assert any("splitrl_made_up_bytes_total" in problem for problem in problems)


def test_every_exported_series_is_known_to_the_dashboard_check() -> None:
    check = load_script("deploy/grafana/check-dashboards.py")
    known = check.known_series()
    assert {"splitrl_link_bytes_total", "splitrl_run_info", "splitrl_policy_lag_bucket"} <= known
    assert "splitrl:wan_bytes_per_env_step_by_mode_phase:rate1m" in known


def test_dashboard_builders_target_the_grafana_that_compose_runs() -> None:
    """The SDK's schema must be the one the provisioned Grafana reads (docker-compose.yml's default image)."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    image = compose["services"]["grafana"]["image"]  # ${GRAFANA_IMAGE:-grafana/grafana:X.Y.Z}
    grafana_release = image.rstrip("}").rsplit(":", 1)[1]
    sdk_release = importlib.metadata.version("grafana-foundation-sdk").split("!")[-1]
    assert grafana_release.split(".")[:2] == sdk_release.split(".")[:2], (image, sdk_release)
