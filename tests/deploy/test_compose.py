"""docker-compose.yml for real: the five services and Prometheus in containers, driven with the docker SDK.

The stack runs as its own compose project (never a user's `splitrl` stack), sized for two
cores: Catch at 36x36, width 256, small updates. Prometheus is the compose file's, scraping
for real; its port is published on 127.0.0.1 only, and every request here goes there or to
the Docker engine. Grafana is left out: no Grafana image can be had on the project's machines
(docs/design.md §7); instead every dashboard panel's query is run against this Prometheus.

Needs the images `splitrl:latest` and $PROMETHEUS_IMAGE (default prom/prometheus:v2.53.2)
already built or pulled; .ci/run builds both (docker/README.md says how).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest

from tests.deploy.compose_stack import DASHBOARDS, Stack, running_stack, wait_for
from tests.deploy.conftest import REPO

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(900)]

PROJECT = "splitrl-deploytest"
SERVICES = ["replay", "inference", "learner", "edge-encoder", "environment", "prometheus"]
LINKS = {
    "env-encoder",
    "encoder-inference",
    "inference-replay",
    "replay-learner",
    "learner-inference",
    "learner-encoder",
}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    settings = {
        # Mode, env, frame size and width come from compose's default recipe, configs/catch.yaml.
        "SPLITRL_MAX_STEPS": "0",  # until stopped, over the recipe's 30,000 steps
        "SPLITRL_NUM_ENVS": "4",
        "SPLITRL_UNROLL_LENGTH": "16",
        "SPLITRL_CHUNKS_PER_UPDATE": "4",
        "SPLITRL_EPOCHS": "2",
        "SPLITRL_CHECKPOINT_EVERY": "2",
    }
    with running_stack(PROJECT, SERVICES, settings) as running:
        yield running


def test_env_steps_and_learner_updates_advance(stack: Stack) -> None:
    wait_for("two learner updates", lambda: stack.value("sum(splitrl_learner_updates_total)") >= 2, stack)
    steps = stack.value("sum(splitrl_env_steps_total)")
    updates = stack.value("sum(splitrl_learner_updates_total)")
    wait_for(
        "env steps and learner updates to advance further",
        lambda: (
            stack.value("sum(splitrl_env_steps_total)") > steps
            and stack.value("sum(splitrl_learner_updates_total)") > updates
        ),
        stack,
    )


def test_prometheus_scraped_every_service_and_every_link(stack: Stack) -> None:
    jobs = {"environment", "edge-encoder", "inference", "replay", "learner"}
    wait_for(
        "every service's scrape target up",
        lambda: {s["metric"]["job"] for s in stack.query("up == 1")} >= jobs,
        stack,
    )
    wait_for(
        "splitrl_link_bytes_total > 0 for all six links",
        lambda: {s["metric"]["link"] for s in stack.query("sum by (link) (splitrl_link_bytes_total) > 0")} == LINKS,
        stack,
    )
    # The services that have a mode say which, so rules can label WAN bytes by mode.
    modes = {s["metric"]["job"]: s["metric"]["mode"] for s in stack.query('splitrl_run_info{mode!=""}')}
    assert modes == {"edge-encoder": "split", "inference": "split", "learner": "split"}


def test_every_service_took_its_share_of_the_recipe_and_the_shells_overrides(stack: Stack) -> None:
    """configs/catch.yaml's values (not the services' defaults: CarRacing-v3, 96, 4096) and the shell's."""
    logs = stack.compose("logs", "--no-color", *SERVICES).stdout
    told = {
        line.split("|")[0].strip().rsplit("-", 1)[0]: json.loads(line.split("defaults): ", 1)[1])
        for line in logs.splitlines()
        if "settings (those not at their defaults): " in line
    }
    assert set(told) >= set(SERVICES) - {"prometheus", "grafana"}, logs[-3000:]
    for name in ("inference", "learner", "edge-encoder", "environment"):
        assert (told[name]["env"], told[name]["frame_size"], told[name]["width"]) == ("splitrl/Catch-v0", 36, 256)
    assert (told["learner"]["learning_rate"], told["learner"]["chunks_per_update"]) == (5e-4, 4)  # recipe, shell
    assert "max_steps" not in told["environment"]  # the shell's 0 (until stopped) is the default
    assert told["replay"]["max_size"] == 2 * 8  # from the recipe's chunks_per_update (the shell's is the learner's)


def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    path = REPO / "deploy" / "grafana" / "dashboards" / "splitrl-network.json"
    dashboard = json.loads(path.read_text())
    # Recording rules and rate windows need a minute of samples; the per-mode rule is the last to fill.
    wait_for(
        "the WAN-bytes-per-step recording rules",
        lambda: bool(stack.query("splitrl:wan_bytes_per_env_step_by_mode_phase:rate1m")),
        stack,
        timeout_s=180,
    )
    # run_queries prints each query's series count: the captured output names an empty panel.
    wait_for(
        "every dashboard query to return data",
        lambda: DASHBOARDS.run_queries(path, dashboard, stack.prometheus, require_data=True) == [],
        stack,
        timeout_s=120,
    )

    def both_phases_measured() -> bool:
        per_phase = {
            s["metric"]["phase"]: float(s["value"][1])
            for s in stack.query('splitrl:wan_bytes_per_env_step_by_mode_phase:rate1m{mode="split"}')
        }
        return all(0 < per_phase.get(phase, 0) < math.inf for phase in ("rollout", "training"))

    wait_for("WAN bytes per env step > 0 in both phases of split mode", both_phases_measured, stack, timeout_s=60)


def test_networks_let_only_the_edge_encoder_cross(stack: Stack) -> None:
    networks = {
        service: set(stack.container(service).attrs["NetworkSettings"]["Networks"])
        for service in ("environment", "edge-encoder", "inference", "replay", "learner")
    }
    edge, cloud = f"{PROJECT}_edge", f"{PROJECT}_cloud"
    assert networks == {
        "environment": {edge},
        "edge-encoder": {edge, cloud},
        "inference": {cloud},
        "replay": {cloud},
        "learner": {cloud},
    }
    # The image's health probe is a real gRPC call: it works over the designed links only.
    encoder, environment = stack.container("edge-encoder"), stack.container("environment")
    for address in ("inference:50052", "learner:50054"):
        assert encoder.exec_run(["grpc-health-check", address]).exit_code == 0
        assert environment.exec_run(["grpc-health-check", address]).exit_code != 0
    assert environment.exec_run(["grpc-health-check", "edge-encoder:50051"]).exit_code == 0


def test_no_service_restarted_by_itself(stack: Stack) -> None:
    restarts = {service: stack.container(service).attrs["RestartCount"] for service in SERVICES}
    assert restarts == dict.fromkeys(SERVICES, 0), f"{restarts}\n{stack.logs()}"


def test_restarting_the_edge_encoder_and_the_learner_resumes_training(stack: Stack) -> None:
    encoder = stack.container("edge-encoder")
    encoder.restart(timeout=20)
    encoder.reload()
    assert encoder.status == "running"
    # The environment's stream broke with the encoder; Docker restarts it (restart: on-failure),
    # it redials, and env steps flow again (rate() spans counter resets).
    wait_for(
        "env steps after the edge-encoder restart",
        lambda: (
            stack.value("sum(rate(splitrl_env_steps_total[20s]))") > 0
            and stack.container("environment").status == "running"
        ),
        stack,
    )

    learner = stack.container("learner")
    version_before = stack.value('max(splitrl_policy_version{job="learner"})')
    assert version_before >= 2
    learner.stop(timeout=30)  # SIGTERM: the learner checkpoints on the way out
    learner.start()
    # version - updates is the version a learner process started from: 0 for a fresh one, the
    # checkpointed version for one that resumed from its volume.
    wait_for(
        "the restarted learner to train on from its checkpoint",
        lambda: (
            stack.value('sum(splitrl_learner_updates_total{job="learner"})') >= 1
            and stack.value('max(splitrl_policy_version{job="learner"} - splitrl_learner_updates_total{job="learner"})')
            >= version_before
        ),
        stack,
    )
