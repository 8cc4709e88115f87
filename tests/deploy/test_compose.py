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
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from splitrl.core import certs
from tests.deploy.conftest import REPO, load_script, missing, tool

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(900)]

PROJECT = "splitrl-deploytest"
SERVICES = ["replay", "inference", "learner", "edge-encoder", "environment", "prometheus"]
SERVICES_WITH_CERTS = SERVICES[:-1]
DASHBOARDS = load_script("deploy/grafana/check-dashboards.py")
LINKS = {
    "env-encoder",
    "encoder-inference",
    "inference-replay",
    "replay-learner",
    "learner-inference",
    "learner-encoder",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Stack:
    """One compose project: `compose(...)` runs the CLI, `container(name)` gives the SDK's object."""

    def __init__(self, client: Any, environ: dict[str, str]) -> None:
        self.client = client
        self.environ = environ
        self.prometheus = f"http://127.0.0.1:{environ['PROMETHEUS_PORT']}"

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        command = ["docker", "compose", "--project-name", PROJECT, "--file", str(REPO / "docker-compose.yml"), *args]
        return subprocess.run(command, env=self.environ, capture_output=True, text=True, timeout=timeout, check=False)

    def container(self, service: str) -> Any:
        found = self.client.containers.list(
            all=True,
            filters={"label": [f"com.docker.compose.project={PROJECT}", f"com.docker.compose.service={service}"]},
        )
        assert len(found) == 1, f"expected one {service} container, found {len(found)}"
        return found[0]

    def query(self, promql: str) -> list[dict[str, Any]]:
        reply = DASHBOARDS.query(self.prometheus, promql)
        assert reply["status"] == "success", reply
        return list(reply["data"]["result"])

    def value(self, promql: str) -> float:
        """The single value of a query that returns one series (0.0 when it returns none yet)."""
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else 0.0

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "40", timeout=60).stdout


def wait_for(what: str, condition: Callable[[], bool], stack: Stack, timeout_s: float = 240) -> None:
    """Poll `condition` every 2 s until true; fail with the services' logs after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(2)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}\n{stack.logs()}")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    tool("docker")
    import docker  # the SDK; imported here so that collection works without it

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as error:
        missing(f"no Docker engine answers: {error}")
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode != 0:
        missing("the Docker Compose v2 plugin is not installed (`docker compose version` fails)")
    prometheus_image = os.environ.get("PROMETHEUS_IMAGE", "prom/prometheus:v2.53.2")
    for image in (os.environ.get("SPLITRL_IMAGE", "splitrl:latest"), prometheus_image):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            missing(f"image {image} is not built (see docker/README.md)")
    # mTLS as deployed: certificates made for this run, readable by the containers' uid 10001 (README "Security").
    tls_dir = Path(tempfile.mkdtemp(prefix="splitrl-compose-tls-"))
    for _, key in certs.generate(tls_dir, SERVICES_WITH_CERTS).pairs.values():
        key.chmod(0o644)
    environ = os.environ | {
        "SPLITRL_TLS_DIR": str(tls_dir),
        "PROMETHEUS_IMAGE": prometheus_image,
        "PROMETHEUS_PORT": str(free_port()),
        "GRAFANA_PORT": str(free_port()),
        # Mode, env, frame size and width come from compose's default recipe, configs/catch.yaml.
        "SPLITRL_MAX_STEPS": "0",  # until stopped, over the recipe's 30,000 steps
        "SPLITRL_NUM_ENVS": "4",
        "SPLITRL_UNROLL_LENGTH": "16",
        "SPLITRL_CHUNKS_PER_UPDATE": "4",
        "SPLITRL_EPOCHS": "2",
        "SPLITRL_CHECKPOINT_EVERY": "2",
    }
    stack = Stack(client, environ)
    stack.compose("down", "--volumes", "--timeout", "10")  # leftovers of an interrupted run
    started = stack.compose("up", "--detach", "--wait", "--no-build", *SERVICES, timeout=400)
    try:
        assert started.returncode == 0, f"compose up failed:\n{started.stderr}\n{stack.logs()}"
        yield stack
    finally:
        stopped = stack.compose("down", "--volumes", "--timeout", "20", timeout=180)
        client.close()
        assert stopped.returncode == 0, stopped.stderr


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
