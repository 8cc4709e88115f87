"""A docker-compose project run for real, for tests/deploy: start it, query its Prometheus, stop it.

Each test module runs its own compose project (never a user's `splitrl` stack), from the base file and any
files layered over it, with certificates made for the run (readable by the containers' uid 10001) and
Prometheus published on a free loopback port.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from splitrl.core import certs
from tests.deploy.conftest import REPO, load_script, missing, tool
from tests.ports import free_port

DASHBOARDS = load_script("deploy/grafana/check-dashboards.py")
#: Services that hold a certificate of their own (replicas serve under their service's).
SERVICES_WITH_CERTS = ["replay", "inference", "learner", "edge-encoder", "environment"]


class Stack:
    """One compose project: `compose(...)` runs the CLI, `container(name)` gives the SDK's object."""

    def __init__(self, client: Any, environ: dict[str, str], project: str, files: Sequence[str]) -> None:
        self.client = client
        self.environ = environ
        self.project = project
        self.files = ["docker-compose.yml", *files]
        self.prometheus = f"http://127.0.0.1:{environ['PROMETHEUS_PORT']}"

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        layers = [arg for file in self.files for arg in ("--file", str(REPO / file))]
        command = ["docker", "compose", "--project-name", self.project, *layers, *args]
        return subprocess.run(command, env=self.environ, capture_output=True, text=True, timeout=timeout, check=False)

    def container(self, service: str) -> Any:
        labels = [f"com.docker.compose.project={self.project}", f"com.docker.compose.service={service}"]
        found = self.client.containers.list(all=True, filters={"label": labels})
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


@contextlib.contextmanager
def running_stack(
    project: str,
    services: Sequence[str],
    settings: dict[str, str],
    files: Sequence[str] = (),
    names: str = "",
    before_up: Sequence[Sequence[str]] = (),
) -> Iterator[Stack]:
    """`docker compose up --wait` of `services` (base file plus `files`) with SPLITRL_* `settings`; down, with
    volumes, at exit. `names`: extra certificate names (`splitrl certs --names`) for replicas. `before_up`:
    compose commands (e.g. a `run` of a one-off job into a volume) that must succeed, in order, before `up`.
    Skips (fails in CI) when the engine, the Compose plugin or an image is missing."""
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
    # mTLS as deployed: certificates made for this run, readable by the containers' uid 10001 (docs/security.md).
    tls_dir = Path(tempfile.mkdtemp(prefix="splitrl-compose-tls-"))
    extra_names = [name for name in names.split(",") if name]
    for _, key in certs.generate(tls_dir, SERVICES_WITH_CERTS, extra_names=extra_names).pairs.values():
        key.chmod(0o644)
    environ = os.environ | settings
    environ |= {
        "SPLITRL_TLS_DIR": str(tls_dir),
        "PROMETHEUS_IMAGE": prometheus_image,
        "PROMETHEUS_PORT": str(free_port()),
        "GRAFANA_PORT": str(free_port()),
    }
    stack = Stack(client, environ, project, files)
    stack.compose("down", "--volumes", "--timeout", "10")  # leftovers of an interrupted run
    try:
        for command in before_up:
            done = stack.compose(*command, timeout=400)
            assert done.returncode == 0, f"compose {' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr}"
        started = stack.compose("up", "--detach", "--wait", "--no-build", *services, timeout=400)
        assert started.returncode == 0, f"compose up failed:\n{started.stderr}\n{stack.logs()}"
        yield stack
    finally:
        stopped = stack.compose("down", "--volumes", "--timeout", "20", timeout=180)
        client.close()
        assert stopped.returncode == 0, stopped.stderr
