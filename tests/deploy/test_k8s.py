"""k8s/ checked offline: every overlay renders, passes strict schema validation, and keeps the design.

No API server can run here (docs/design.md §7), so `kubectl kustomize` renders each overlay,
`kubernetes-validate --strict` checks the schemas, and the rest are checks over the
rendered objects: selectors, ports, probes, the addresses services dial, the settings the
services accept, hardening, volumes, placement, NetworkPolicy (a small evaluator) and
Prometheus scraping (a small relabelling simulator).

Without kubectl, kubernetes-validate or promtool these tests skip; with
SPLITRL_REQUIRE_DEPLOY_TOOLS=1 (as in CI) they fail instead (tests/deploy/conftest.py).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from splitrl.core.args import settings_from_args
from splitrl.core.config import split_addresses
from tests.deploy import kube
from tests.deploy.conftest import REPO, missing, promtool, tool
from tests.deploy.kube import APP, NAMESPACE, Manifest, PodTemplate

pytestmark = pytest.mark.deploy

K8S = REPO / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
COMPONENTS = sorted(p.name for p in (K8S / "components").iterdir() if (p / "kustomization.yaml").is_file())
TIER = "splitrl.io/tier"
EDGE_POOL = "splitrl.io/pool"
# kinds without a schema in kubernetes-validate (CRDs), allowed only in components
CRD_KINDS = {"PodMonitor"}
# The oldest Kubernetes the manifests are checked against (gRPC probes are GA since 1.27).
OLDEST_KUBERNETES = (1, 29)

# Pods under the NetworkPolicy, by app label.
SPLITRL_APPS = {"edge", "inference", "replay", "learner"}
# docs/design.md §2 by who opens the connection: (dialling app, dialled app, port).
DESIGNED_LINKS = {
    ("edge", "inference", 50052),  # encoder-inference (WAN)
    ("edge", "learner", 50054),  # learner-encoder (WAN)
    ("inference", "replay", 50053),  # inference-replay
    ("learner", "replay", 50053),  # replay-learner
    ("learner", "inference", 50052),  # learner-inference
}
# env-encoder runs inside the edge pod, over loopback.
LOOPBACK_LINKS = {("edge", "environment", "edge-encoder", 50051)}
LOOPBACK_HOSTS = {"127.0.0.1", "localhost"}
# Where docker/Dockerfile installs docker/grpc-health-check.py; the exec probes run it.
HEALTH_CHECK = "/opt/splitrl/bin/grpc-health-check"
TLS_SECRET = "splitrl-tls"
TLS_FILES = ("SPLITRL_TLS_CERT_FILE", "SPLITRL_TLS_KEY_FILE", "SPLITRL_TLS_CA_FILE")
IANA_SVC_NAME = re.compile(r"(?=.{1,15}$)(?=.*[a-z])(?!.*--)[a-z0-9]([a-z0-9-]*[a-z0-9])?")


# ---------------------------------------------------------------------------------------------
# Rendering and validation


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


@pytest.fixture(scope="module", params=OVERLAYS)
def manifest(request, render) -> Manifest:
    return Manifest(render(K8S / "overlays" / request.param))


# ---------------------------------------------------------------------------------------------
# Structure


def test_every_namespaced_object_is_in_the_splitrl_namespace(manifest):
    """An overlay's own resources do not inherit the base's namespace: one left out would land in `default`."""
    for obj in manifest.objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == NAMESPACE, kube.name(obj)


def test_selectors_match_their_pod_templates(manifest):
    for pod in manifest.pods:
        assert kube.selects(pod.workload["spec"]["selector"], pod.labels), kube.name(pod.workload)
    for service in manifest.of_kind("Service"):
        assert kube.service_pods(manifest, service), f"{kube.name(service)} selects no pod"
    for stateful in manifest.of_kind("StatefulSet"):
        governing = manifest.get("Service", stateful["spec"]["serviceName"])
        assert PodTemplate(stateful) in kube.service_pods(manifest, governing)


def test_service_target_ports_are_declared_by_the_selected_pods(manifest):
    for service in manifest.of_kind("Service"):
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod in kube.service_pods(manifest, service):
                declared = [p for c in pod.containers for p in c.get("ports", [])]
                key = "name" if isinstance(target, str) else "containerPort"
                assert any(p.get(key) == target for p in declared), f"{kube.name(service)} -> {pod.app}:{target}"


def test_container_ports_are_unique_named_and_probed(manifest):
    for pod in manifest.pods:
        ports = [p for c in pod.containers for p in c.get("ports", [])]
        names, numbers = [p["name"] for p in ports], [p["containerPort"] for p in ports]
        # containers of a pod share one network namespace, and Prometheus picks ports by name
        assert len(set(names)) == len(names) and len(set(numbers)) == len(numbers), (pod.app, ports)
        for name in names:
            assert IANA_SVC_NAME.fullmatch(name), f"{pod.app}: port name {name!r} is no IANA_SVC_NAME"
        for container in pod.containers:
            own = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = container.get(kind)
                if probe is None:
                    continue
                [handler] = [probe[h] for h in ("grpc", "httpGet", "tcpSocket", "exec") if h in probe]
                if "port" in handler:
                    port = handler["port"]
                    assert port in (own if isinstance(port, str) else own.values()), (pod.app, container["name"], kind)


def test_splitrl_containers_accept_their_settings_and_serve_on_declared_ports(manifest):
    for pod in manifest.pods:
        for container in pod.splitrl_containers:
            service = container["args"][1]
            where = f"{pod.app}/{container['name']}"
            # the container name becomes Prometheus's `job`, as the compose service name does
            assert container["name"] == service, where
            env = manifest.env(container)
            settings = settings_from_args(kube.settings_model(service), argparse.Namespace(), env)
            assert settings.host == "0.0.0.0", f"{where}: scrapes and peers come from outside the pod"
            own = {p["containerPort"]: p["name"] for p in container.get("ports", [])}
            assert re.fullmatch(r"(.+-)?grpc", own.get(settings.port, "")), f"{where}: gRPC port {settings.port}"
            assert re.fullmatch(r"(.+-)?metrics", own.get(settings.metrics_port, "")), f"{where}: metrics port"
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                # exec, not `grpc:` (kubelet's cannot speak TLS): the image's checker dials its own gRPC port
                command = container[kind]["exec"]["command"]
                assert command == [HEALTH_CHECK, f"127.0.0.1:{settings.port}"], f"{where}: {kind}"
            # Every dialled address is set here: a default (127.0.0.1) would dial the pod itself.
            for field in kube.settings_model(service).model_fields:
                if field.endswith("_address"):
                    assert f"SPLITRL_{field.upper()}" in env, f"{where}: SPLITRL_{field.upper()} unset"


def test_the_probes_health_checker_is_where_the_image_installs_it():
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert re.search(rf"^COPY docker/grpc-health-check\.py {re.escape(HEALTH_CHECK)}$", dockerfile, re.M)
    assert (REPO / "docker" / "grpc-health-check.py").is_file()


def _tls_volume(pod: PodTemplate, container: dict, path: str) -> tuple[dict, dict, str]:
    """(volumeMount, volume, file name inside it) for the mount holding `path`."""
    [(mount, name)] = [
        (m, path[len(m["mountPath"]) + 1 :])
        for m in container.get("volumeMounts", [])
        if path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    [volume] = [v for v in pod.spec.get("volumes", []) if v["name"] == mount["name"]]
    return mount, volume, name


def test_splitrl_containers_run_mtls_from_the_read_only_tls_secret(manifest):
    for pod in manifest.pods:
        for container in pod.splitrl_containers:
            where = f"{pod.app}/{container['name']}"
            env = manifest.env(container)
            settings = settings_from_args(kube.settings_model(container["args"][1]), argparse.Namespace(), env)
            assert settings.tls == "mtls" and env.get("SPLITRL_TLS") == "mtls", where
            assert "plaintext" not in {v.get("value") for v in container.get("env", [])}, where
            own = {
                "SPLITRL_TLS_CERT_FILE": f"{container['name']}.pem",
                "SPLITRL_TLS_KEY_FILE": f"{container['name']}-key.pem",
            }
            for variable in TLS_FILES:
                mount, volume, name = _tls_volume(pod, container, env[variable])
                assert mount.get("readOnly") is True, f"{where}: {mount['name']} is writable"
                secret = volume.get("secret", {})
                assert secret.get("secretName") == TLS_SECRET, f"{where}: {variable} not from {TLS_SECRET}"
                items = {item["path"]: item["key"] for item in secret["items"]}  # only what this container needs
                assert items.get(name) == own.get(variable, "ca.pem"), f"{where}: {variable} -> {name}"
                assert "ca-key.pem" not in items.values(), f"{where}: the CA key is mounted"
                mode = secret["defaultMode"]
                # group-readable for the non-root user through fsGroup; nobody writes, others read nothing
                assert mode & 0o040 and not mode & 0o222 and not mode & 0o007, f"{where}: mode {mode:o}"
                assert pod.spec["securityContext"].get("fsGroup") == pod.spec["securityContext"]["runAsGroup"], where


def _covers(names: set[str], host: str) -> bool:
    """A certificate with `names` verifies `host`: by name, or by a wildcard over its first label only."""
    return host in names or f"*.{host.partition('.')[2]}" in names


def _serving_container(manifest: Manifest, pod: PodTemplate, host: str, port: int) -> str:
    """The name of the container a dialled host:port reaches (loopback: in the same pod)."""
    if host in LOOPBACK_HOSTS:
        targets = [pod]
    else:
        [(_, _, service, _)] = kube.dialled(manifest, f"{host}:{port}")
        targets = kube.service_pods(manifest, service)
    [name] = {
        c["name"]
        for target in targets
        for c in target.splitrl_containers
        if int(manifest.env(c)["SPLITRL_PORT"]) == port
    }
    return name


def test_certificates_from_splitrl_certs_name_every_dialled_host(manifest, tmp_path):
    """The README's `splitrl certs` command makes certificates whose names match what each client dials."""
    from cryptography import x509

    from splitrl.cli.main import main as splitrl

    suffixes = f"{NAMESPACE}.svc,{NAMESPACE}.svc.cluster.local"
    assert splitrl(["certs", "--out", str(tmp_path), "--dns-suffixes", suffixes]) == 0

    def names(container: str) -> set[str]:
        cert = x509.load_pem_x509_certificate((tmp_path / f"{container}.pem").read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return {str(n) for n in sans.get_values_for_type(x509.DNSName)} | {
            str(ip) for ip in sans.get_values_for_type(x509.IPAddress)
        }

    checked = 0
    for pod in manifest.pods:
        for container in pod.splitrl_containers:
            env = manifest.env(container)
            # the exec probe dials 127.0.0.1 with the container's own settings
            dials = [("127.0.0.1", int(env["SPLITRL_PORT"]))] + [
                (entry.rsplit(":", 1)[0], int(entry.rsplit(":", 1)[1]))
                for key, address in env.items()
                if re.fullmatch(r"SPLITRL_\w+_ADDRESS", key)
                for entry in split_addresses(address)
            ]
            for host, port in dials:
                expected = env.get("SPLITRL_TLS_SERVER_NAME") or host
                server = _serving_container(manifest, pod, host, port)
                assert _covers(names(server), expected), f"{pod.app}/{container['name']} dials {host}:{port} ({server})"
                checked += 1
    assert checked >= 2 * 5


def test_service_specific_settings_are_known_to_the_service(manifest):
    """A misspelt SPLITRL_ variable would be ignored silently; only the run-wide ConfigMap may carry extras."""
    for pod in manifest.pods:
        for container in pod.splitrl_containers:
            model = kube.settings_model(container["args"][1])
            known = {f"SPLITRL_{field.upper()}" for field in model.model_fields}
            specific = {v["name"] for v in container.get("env", []) if v["name"].startswith("SPLITRL_")}
            for source in container.get("envFrom", []):
                name = source["configMapRef"]["name"]
                if not re.fullmatch(r"splitrl-run(-[a-z0-9]+)?", name):  # kustomize appends a hash
                    specific |= set(manifest.get("ConfigMap", name).get("data", {}))
            assert specific <= known, f"{container['name']}: {sorted(specific - known)}"


def test_dialled_addresses_resolve_and_are_the_designed_links(manifest):
    dialled, loopback = set(), set()
    for pod in manifest.pods:
        for container in pod.splitrl_containers:
            for key, address in manifest.env(container).items():
                if not re.fullmatch(r"SPLITRL_\w+_ADDRESS", key):
                    continue
                where = f"{pod.app}/{container['name']} {key}={address}"
                host, port = address.rsplit(":", 1)
                if host in LOOPBACK_HOSTS:
                    [peer] = [
                        c
                        for c in pod.splitrl_containers
                        if c is not container and int(manifest.env(c)["SPLITRL_PORT"]) == int(port)
                    ]
                    loopback.add((pod.app, container["name"], peer["name"], int(port)))
                    continue
                for _, port_number, service, suffix in kube.dialled(manifest, address):
                    assert suffix in ("", NAMESPACE, f"{NAMESPACE}.svc", f"{NAMESPACE}.svc.cluster.local"), where
                    [service_port] = [p for p in service["spec"]["ports"] if p["port"] == port_number]
                    target = service_port.get("targetPort", service_port["port"])
                    for target_pod in kube.service_pods(manifest, service):
                        # the port the Service forwards to is the gRPC port of the service behind it
                        serving = [
                            c
                            for c in target_pod.splitrl_containers
                            for p in c["ports"]
                            if target in (p["name"], p["containerPort"])
                            and p["containerPort"] == int(manifest.env(c)["SPLITRL_PORT"])
                        ]
                        assert serving, where
                        dialled.add((pod.app, target_pod.app, port_number))
    assert dialled == DESIGNED_LINKS
    assert loopback == LOOPBACK_LINKS


def test_every_inference_replica_is_dialled_by_the_learner_and_every_edge(manifest):
    """An address list and the replica count kept in step: a replica nobody lists would get no stream and no
    weights; a listed one that does not exist would be redialled forever."""
    replicas = manifest.get("StatefulSet", "inference")["spec"].get("replicas", 1)
    for app, container_name in (("learner", "learner"), ("edge", "edge-encoder")):
        [container] = [c for c in manifest.pod(app).splitrl_containers if c["name"] == container_name]
        entries = kube.dialled(manifest, manifest.env(container)["SPLITRL_INFERENCE_ADDRESS"])
        if replicas == 1:
            assert [host.partition(".")[0] for host, *_ in entries] == ["inference"], app
        else:
            assert [host.partition(".")[0] for host, *_ in entries] == [f"inference-{k}" for k in range(replicas)], app


def test_pods_are_hardened_and_bounded(manifest):
    for pod in manifest.pods:
        pod_security = pod.spec.get("securityContext", {})
        for container in pod.containers:
            where = f"{pod.app}/{container['name']}"
            security = {**pod_security, **container.get("securityContext", {})}
            assert security.get("runAsNonRoot") is True and security.get("runAsUser", 0) != 0, where
            assert security.get("readOnlyRootFilesystem") is True, where
            assert security.get("allowPrivilegeEscalation") is False, where
            assert "ALL" in security.get("capabilities", {}).get("drop", []), where
            assert security.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            resources = container.get("resources", {})
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(bound, {})), f"{where}: {bound}"
        if pod.splitrl_containers:  # splitrl never calls the Kubernetes API: no service-account token mounted
            assert pod.spec.get("automountServiceAccountToken") is False, f"{pod.app}: automountServiceAccountToken"
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for container in pod.splitrl_containers:
            # a read-only root needs somewhere to write: its own emptyDir /tmp
            [tmp] = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            assert "emptyDir" in volumes[tmp["name"]], f"{pod.app}/{container['name']}"


def _persistent_mounts(manifest: Manifest, pod: PodTemplate, container: dict) -> dict[str, dict]:
    """mountPath -> the PVC spec behind it, for PVC-backed mounts (claims or volumeClaimTemplates)."""
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod.spec.get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    templates = {t["metadata"]["name"]: t["spec"] for t in pod.workload["spec"].get("volumeClaimTemplates", [])}
    mounts = {}
    for mount in container.get("volumeMounts", []):
        if mount["name"] in claims:
            mounts[mount["mountPath"]] = manifest.get("PersistentVolumeClaim", claims[mount["name"]])["spec"]
        elif mount["name"] in templates:
            mounts[mount["mountPath"]] = templates[mount["name"]]
    return mounts


def test_replay_and_learner_keep_their_state_on_persistent_volumes(manifest):
    for app in ("replay", "learner"):
        pod = manifest.pod(app)
        [container] = pod.splitrl_containers
        assert _persistent_mounts(manifest, pod, container), f"{app} has no PVC-backed mount"
        assert pod.spec["securityContext"].get("fsGroup"), f"{app}: its volume must be writable by the non-root user"
    learner = manifest.pod("learner")
    [container] = learner.splitrl_containers
    checkpoints = manifest.env(container)["SPLITRL_CHECKPOINT_DIR"]
    assert checkpoints in _persistent_mounts(manifest, learner, container)
    for pod in manifest.pods:
        if pod.workload["kind"] != "Deployment":
            continue
        for container in pod.containers:
            if any("ReadWriteOnce" in s["accessModes"] for s in _persistent_mounts(manifest, pod, container).values()):
                # a rolling update would start a second pod that cannot mount the volume
                assert pod.workload["spec"].get("replicas", 1) == 1, pod.app
                assert pod.workload["spec"]["strategy"]["type"] == "Recreate", pod.app


def _tolerates_edge(pod: PodTemplate) -> bool:
    return any(
        t.get("key") == EDGE_POOL and t.get("effect") in ("NoSchedule", None) and t.get("value") in ("edge", None)
        for t in pod.spec.get("tolerations", [])
    )


def _kept_off_edge(pod: PodTemplate) -> bool:
    terms = (
        pod.spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    # terms are ORed: every one of them must exclude the edge pool
    return bool(terms) and all(
        any(
            e["key"] == EDGE_POOL and e["operator"] == "NotIn" and "edge" in e["values"]
            for e in t.get("matchExpressions", [])
        )
        for t in terms
    )


def test_edge_cloud_places_edges_on_the_edge_pool_and_the_rest_off_it(render):
    manifest = Manifest(render(K8S / "overlays" / "edge-cloud"))
    edge = manifest.pod("edge")
    assert edge.spec.get("nodeSelector") == {EDGE_POOL: "edge"}
    assert _tolerates_edge(edge)
    assert edge.workload["spec"]["replicas"] > 1
    others = [pod for pod in manifest.pods if pod.app != "edge"]
    assert {pod.app for pod in others} >= {"inference", "replay", "learner", "prometheus"}
    for pod in others:
        assert _kept_off_edge(pod), f"{pod.app} may land on an edge node"
        assert not _tolerates_edge(pod), pod.app


def test_single_cluster_runs_one_edge_anywhere(render):
    manifest = Manifest(render(K8S / "overlays" / "single-cluster"))
    assert manifest.pod("edge").workload["spec"]["replicas"] == 1
    for pod in manifest.pods:
        assert not pod.spec.get("nodeSelector") and not pod.spec.get("affinity"), pod.app


# ---------------------------------------------------------------------------------------------
# NetworkPolicy (tests/deploy/kube.py evaluates it)


def test_network_policies_allow_exactly_the_designed_links(manifest):
    pods = {pod.app: kube.Peer.of(pod) for pod in manifest.pods}
    assert set(pods) >= SPLITRL_APPS | {"prometheus"}
    outsider = kube.Peer("default", {}, ())
    allowed, expected = set(), set()
    designed = DESIGNED_LINKS | _learner_rank_links(manifest, pods["learner"])
    for source_app, source in [*pods.items(), ("outsider", outsider)]:
        for app in SPLITRL_APPS:
            for name, number, protocol in pods[app].ports:
                if kube.allowed(manifest, source, pods[app], number, protocol):
                    allowed.add((source_app, app, number))
                if (source_app, app, number) in designed or (source_app == "prometheus" and name.endswith("metrics")):
                    expected.add((source_app, app, number))
    assert allowed == expected, (
        f"allowed but not designed: {allowed - expected}; designed but denied: {expected - allowed}"
    )
    # spelled out: no edge reaches replay, nothing dials the learner but edges, edges not each other
    assert not kube.allowed(manifest, pods["edge"], pods["replay"], 50053)
    assert not kube.allowed(manifest, pods["inference"], pods["learner"], 50054)
    assert not kube.allowed(manifest, pods["edge"], pods["edge"], 50051)
    kube_dns = kube.Peer("kube-system", {"k8s-app": "kube-dns"}, (("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")))
    internet = kube.Peer("elsewhere", {}, (("https", 443, "TCP"),))
    for app in SPLITRL_APPS:
        assert kube.allowed(manifest, pods[app], kube_dns, 53, "UDP") and kube.allowed(
            manifest, pods[app], kube_dns, 53
        ), app
        assert not kube.allowed(manifest, pods[app], internet, 443), app


def _learner_rank_links(manifest: Manifest, learner: kube.Peer) -> set[tuple[str, str, int]]:
    """Data-parallel ranks (more than one learner pod) reach each other on any port: rank 0's TCP store, then
    gloo's connections on ports it picks. One learner has no such link."""
    if manifest.get("StatefulSet", "learner")["spec"].get("replicas", 1) == 1:
        return set()
    return {("learner", "learner", number) for _, number, _ in learner.ports}


def test_learner_ranks_are_the_statefulset_pods_and_meet_at_pod_0(manifest):
    learners = manifest.get("StatefulSet", "learner")
    replicas = learners["spec"].get("replicas", 1)
    pod = manifest.pod("learner")
    [container] = pod.splitrl_containers
    env = manifest.env(container)
    settings = settings_from_args(kube.settings_model("learner"), argparse.Namespace(), env)
    assert settings.world_size == replicas
    # The rank is the pod's index, from the label Kubernetes sets on StatefulSet pods.
    [rank] = [v for v in container["env"] if v["name"] == "SPLITRL_RANK"]
    assert rank["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert learners["spec"]["podManagementPolicy"] == "Parallel"  # ranks wait for each other: start together
    # Ranks must resolve learner-0 to meet there whether or not its readiness probe passes yet.
    assert manifest.get("Service", "learner")["spec"]["publishNotReadyAddresses"] is True
    [edge] = [c for c in manifest.pod("edge").splitrl_containers if c["name"] == "edge-encoder"]
    edge_dials = [host for host, *_ in kube.dialled(manifest, manifest.env(edge)["SPLITRL_LEARNER_ADDRESS"])]
    if replicas == 1:
        assert [host.partition(".")[0] for host in edge_dials] == ["learner"]
        return
    # Edges dial rank 0 only (learner.edge_relay); the ranks meet at its declared rendezvous port.
    assert [host.partition(".")[0] for host in edge_dials] == ["learner-0"]
    [(host, port, service, _)] = kube.dialled(manifest, settings.rendezvous_endpoint)  # a pod name that resolves
    assert host.partition(".")[0] == "learner-0" and service["metadata"]["name"] == "learner"
    assert port in [p["containerPort"] for p in container["ports"] if p["name"] == "rendezvous"]
    peer = kube.Peer.of(pod)
    for gloo_port in (port, 41234):  # the store, and a port gloo may pick
        assert kube.allowed(manifest, peer, kube.Peer(NAMESPACE, pod.labels, (("gloo", gloo_port, "TCP"),)), gloo_port)


def test_every_replay_shard_is_sampled_by_the_learner_and_written_by_an_inference(manifest):
    """Inference replica K writes to entry K mod (shards) of its list (its pod index picks it), so with as many
    shards listed as replay pods and no more than inference replicas, every shard is written and sampled."""
    shards = manifest.get("StatefulSet", "replay")["spec"].get("replicas", 1)
    replicas = manifest.get("StatefulSet", "inference")["spec"].get("replicas", 1)
    assert shards <= replicas
    expected = ["replay"] if shards == 1 else [f"replay-{k}" for k in range(shards)]
    for app in ("learner", "inference"):
        [container] = manifest.pod(app).splitrl_containers
        entries = kube.dialled(manifest, manifest.env(container)["SPLITRL_REPLAY_ADDRESS"])
        assert [host.partition(".")[0] for host, *_ in entries] == expected, app
    [inference] = manifest.pod("inference").splitrl_containers
    [index] = [v for v in inference["env"] if v["name"] == "SPLITRL_REPLICA_INDEX"]
    assert index["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"


# ---------------------------------------------------------------------------------------------
# Prometheus (tests/deploy/kube.py simulates pod discovery and relabelling)


def test_prometheus_scrapes_every_splitrl_container_once_with_compose_labels(manifest):
    prometheus = manifest.pod("prometheus")
    [config_volume] = [v for v in prometheus.spec["volumes"] if v["name"] == "config"]
    files = manifest.get("ConfigMap", config_volume["configMap"]["name"])["data"]
    config = yaml.safe_load(files["prometheus.yml"])
    [scrape] = [s for s in config["scrape_configs"] if "kubernetes_sd_configs" in s]
    assert [sd["role"] for sd in scrape["kubernetes_sd_configs"]] == ["pod"]
    targets = set()
    for pod in manifest.pods:
        for meta in kube.pod_sd_targets(pod, scrape["job_name"]):
            kept = kube.relabel(meta, scrape.get("relabel_configs", []))
            if kept is not None:
                port = int(kept["__address__"].rsplit(":", 1)[1])
                targets.add((kept["job"], kept["service"], kept["tier"], pod.app, port))
    expected = {
        (c["name"], c["name"], pod.labels[TIER], pod.app, int(manifest.env(c)["SPLITRL_METRICS_PORT"]))
        for pod in manifest.pods
        for c in pod.splitrl_containers
    }
    assert targets == expected
    # the jobs are the compose deployment's, so dashboards and rules work on both
    compose = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    # (`replicas` names no job of its own: each of its targets carries its service's.)
    compose_jobs = {s["job_name"] for s in compose["scrape_configs"]} - {"prometheus", "replicas"}
    assert {job for job, *_ in targets} == compose_jobs


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
