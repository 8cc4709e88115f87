"""Shared set-up for the k8s/ tests: every overlay rendered once per module, offline.

No API server can run here (docs/design.md §7), so `kubectl kustomize` renders each overlay,
`kubernetes-validate --strict` checks the schemas (test_render.py), and the rest are checks over
the rendered objects: pods' structure, settings, hardening, volumes and placement (test_pods.py);
the addresses services dial, certificates, NetworkPolicy (a small evaluator) and Prometheus
scraping (a small relabelling simulator) (test_links.py).

Without kubectl, kubernetes-validate or promtool these tests skip; with
SPLITRL_REQUIRE_DEPLOY_TOOLS=1 (as in CI) they fail instead (tests/deploy/conftest.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import REPO, tool
from tests.deploy.kube import Manifest

K8S = REPO / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
# Pods under the NetworkPolicy, by app label.
SPLITRL_APPS = {"edge", "inference", "replay", "learner"}


@pytest.fixture(scope="module")
def render():
    """Render a kustomization directory with `kubectl kustomize`, once per directory."""
    kubectl = tool("kubectl")
    rendered: dict[Path, str] = {}

    def _render(directory: Path) -> str:
        if directory not in rendered:
            result = subprocess.run(
                [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
            )
            assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
            rendered[directory] = result.stdout
        return rendered[directory]

    return _render


@pytest.fixture(scope="module", params=OVERLAYS)
def manifest(request, render) -> Manifest:
    return Manifest(render(K8S / "overlays" / request.param))
