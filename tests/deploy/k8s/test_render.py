"""Every overlay and component renders and passes strict schema validation; the Prometheus config passes promtool.

Also: the PodMonitor component scrapes what the bundled Prometheus scrapes, and k8s/ keeps the compose rules.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy import kube
from tests.deploy.conftest import REPO, missing, promtool
from tests.deploy.k8s.conftest import K8S, OVERLAYS, SPLITRL_APPS
from tests.deploy.kube import APP, NAMESPACE, Manifest

pytestmark = pytest.mark.deploy

COMPONENTS = sorted(p.name for p in (K8S / "components").iterdir() if (p / "kustomization.yaml").is_file())
# kinds without a schema in kubernetes-validate (CRDs), allowed only in components
CRD_KINDS = {"PodMonitor", "Issuer"}
# The oldest Kubernetes the manifests are checked against (gRPC probes are GA since 1.27).
OLDEST_KUBERNETES = (1, 29)


@pytest.fixture(scope="module")
def validate_command() -> list[str]:
    """kubernetes-validate, strict, against the oldest supported and the newest known Kubernetes."""
    if importlib.util.find_spec("kubernetes_validate") is None:
        missing("kubernetes-validate is not installed (a dev dependency)")
    from kubernetes_validate import utils

    known = sorted({tuple(int(part) for part in v.split(".")[:2]) for v in utils.all_versions()})
    oldest = next((v for v in known if v >= OLDEST_KUBERNETES), known[-1])
    command = [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet"]
    for major, minor in sorted({oldest, known[-1]}):
        command += ["--kubernetes-version", f"{major}.{minor}"]
    return command


def _validate(command: list[str], text: str, path: Path) -> str:
    # A file, not stdin: kubernetes-validate reads its input once per version.
    path.write_text(text)
    result = subprocess.run([*command, str(path)], capture_output=True, text=True, timeout=60, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def _overlay_with_components(directory: Path, components: list[str]) -> Path:
    """A throwaway overlay: the base plus the given components, by relative path (as a user's overlay would)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        f"  - {os.path.relpath(K8S / 'base', directory)}",
        "components:",
        *(f"  - {os.path.relpath(K8S / 'components' / name, directory)}" for name in components),
    ]
    (directory / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    return directory


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_passes_strict_schema_validation(overlay, render, validate_command, tmp_path):
    output = _validate(validate_command, render(K8S / "overlays" / overlay), tmp_path / f"{overlay}.yaml")
    # An unknown kind or apiVersion is only a WARN (exit 0) to kubernetes-validate.
    assert "WARN" not in output, output


@pytest.mark.parametrize("component", COMPONENTS)
def test_component_renders_with_the_base_and_validates(component, render, validate_command, tmp_path):
    manifest = Manifest(render(_overlay_with_components(tmp_path / "overlay", [component])))
    base = Manifest(render(K8S / "base"))
    known = [o for o in manifest.objects if o["kind"] not in CRD_KINDS]
    assert len(manifest.objects) > len(base.objects), f"component {component} added nothing"
    output = _validate(validate_command, yaml.safe_dump_all(known), tmp_path / "known.yaml")
    assert "WARN" not in output, output
    for obj in manifest.objects:
        assert obj["metadata"].get("namespace", NAMESPACE) == NAMESPACE, f"{kube.name(obj)} outside the namespace"


def test_podmonitor_component_scrapes_what_the_bundled_prometheus_scrapes(render, tmp_path):
    manifest = Manifest(render(_overlay_with_components(tmp_path / "overlay", ["podmonitor"])))
    [monitor] = manifest.of_kind("PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    selected = [pod for pod in manifest.pods if kube.selects(monitor["spec"]["selector"], pod.labels)]
    assert {pod.app for pod in selected} == SPLITRL_APPS
    metrics_ports = {
        port["name"]
        for pod in selected
        for container in pod.splitrl_containers
        for port in container.get("ports", [])
        if port["containerPort"] == int(manifest.env(container)["SPLITRL_METRICS_PORT"])
    }
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert {e["port"] for e in endpoints} == metrics_ports
    for endpoint in endpoints:
        relabelled = {
            r["targetLabel"]: r["sourceLabels"] for r in endpoint.get("relabelings", []) if "targetLabel" in r
        }
        assert relabelled.get("job") == relabelled.get("service") == ["__meta_kubernetes_pod_container_name"]
    # An operator-managed Prometheus lives in another namespace: the component lets it in,
    # to the metrics ports only.
    operator = kube.Peer("monitoring", {APP: "prometheus"}, ())
    for pod in selected:
        peer = kube.Peer.of(pod)
        for name, number, _ in peer.ports:
            assert kube.allowed(manifest, operator, peer, number) == (name in metrics_ports), (pod.app, name)


def test_edge_identity_component_gives_each_edge_pod_its_own_certificate(render, tmp_path):
    """Each edge container's TLS files come from cert-manager's csi-driver, naming the pod (a stable StatefulSet
    name) in the container's role, under the file names the container reads, signed by an Issuer over the run's
    CA; nothing is left of the shared Secret's pair."""
    from splitrl.core.authz import Identity

    manifest = Manifest(render(_overlay_with_components(tmp_path / "overlay", ["edge-identity"])))
    edge = manifest.pod("edge")
    assert edge.workload["kind"] == "StatefulSet"
    [issuer] = manifest.of_kind("Issuer")
    assert issuer["apiVersion"] == "cert-manager.io/v1" and issuer["spec"]["ca"]["secretName"]
    volumes = {volume["name"]: volume for volume in edge.spec["volumes"]}
    for container in edge.splitrl_containers:
        role, env = container["name"], manifest.env(container)
        [mount] = [m for m in container["volumeMounts"] if env["SPLITRL_TLS_CERT_FILE"].startswith(m["mountPath"])]
        volume = volumes[mount["name"]]
        assert "secret" not in volume and volume["csi"]["driver"] == "csi.cert-manager.io", role
        attributes = volume["csi"]["volumeAttributes"]
        assert attributes["csi.cert-manager.io/issuer-name"] == issuer["metadata"]["name"]
        uri = attributes["csi.cert-manager.io/uri-sans"]
        assert Identity.parse(uri.replace("${POD_NAME}", "edge-3")) == Identity(role, "edge-3"), uri
        for variable, attribute in (
            ("SPLITRL_TLS_CERT_FILE", "certificate-file"),
            ("SPLITRL_TLS_KEY_FILE", "privatekey-file"),
            ("SPLITRL_TLS_CA_FILE", "ca-file"),
        ):
            assert env[variable] == f"{mount['mountPath']}/{attributes[f'csi.cert-manager.io/{attribute}']}", variable
        assert "client auth" in attributes["csi.cert-manager.io/key-usages"]


# ---------------------------------------------------------------------------------------------
# Prometheus configuration


def test_rules_are_a_copy_of_the_compose_rules():
    """kustomize loads no file outside k8s/, so k8s/ keeps a copy: change one, copy it to the other."""
    copy = yaml.safe_load((K8S / "base" / "prometheus" / "splitrl.rules.yml").read_text())
    original = yaml.safe_load((REPO / "deploy" / "prometheus" / "rules" / "splitrl.rules.yml").read_text())
    assert copy == original, "k8s/base/prometheus/splitrl.rules.yml differs from deploy/prometheus/rules/"


def test_prometheus_config_passes_promtool(tmp_path):
    source = K8S / "base" / "prometheus"
    shutil.copy(source / "splitrl.rules.yml", tmp_path / "splitrl.rules.yml")
    config = yaml.safe_load((source / "prometheus.yml").read_text())
    # the file names the rules where the pod mounts them; point it here instead
    assert config["rule_files"] == ["/etc/prometheus/splitrl.rules.yml"]
    config["rule_files"] = [str(tmp_path / "splitrl.rules.yml")]
    # Debian's promtool is built without Kubernetes discovery: a static target stands in,
    # which still has the relabelling (Go regexps) and the rules checked.
    for scrape in config["scrape_configs"]:
        if scrape.pop("kubernetes_sd_configs", None) is not None:
            scrape["static_configs"] = [{"targets": ["127.0.0.1:9400"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
