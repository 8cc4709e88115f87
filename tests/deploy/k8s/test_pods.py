"""Every overlay's pods, as rendered: namespace, selectors, ports and probes, the settings each container
accepts, mTLS from the read-only Secret, hardening, persistent volumes, and placement on the edge pool."""

from __future__ import annotations

import argparse
import re

import pytest

from splitrl.core.args import settings_from_args
from tests.deploy import kube
from tests.deploy.conftest import REPO
from tests.deploy.k8s.conftest import K8S
from tests.deploy.kube import NAMESPACE, Manifest, PodTemplate

pytestmark = pytest.mark.deploy

EDGE_POOL = "splitrl.io/pool"
# Where docker/Dockerfile installs docker/grpc-health-check.py; the exec probes run it.
HEALTH_CHECK = "/opt/splitrl/bin/grpc-health-check"
TLS_SECRET = "splitrl-tls"
TLS_FILES = ("SPLITRL_TLS_CERT_FILE", "SPLITRL_TLS_KEY_FILE", "SPLITRL_TLS_CA_FILE")
IANA_SVC_NAME = re.compile(r"(?=.{1,15}$)(?=.*[a-z])(?!.*--)[a-z0-9]([a-z0-9-]*[a-z0-9])?")


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


# ---------------------------------------------------------------------------------------------
# Placement


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


def test_the_servers_edges_dial_read_the_deny_list_from_its_unhashed_config_map(manifest):
    """Revoking an edge is an edit of one ConfigMap: mounted (not subPath) in every pod edges dial, under a name
    without kustomize's hash, so the kubelet updates the file in place and the servers re-read it."""
    config_map = manifest.get("ConfigMap", "splitrl-deny-list")
    assert "deny-list.txt" in config_map["data"]
    for app in ("inference", "learner"):
        pod = manifest.pod(app)
        [container] = pod.splitrl_containers
        path = manifest.env(container)["SPLITRL_DENY_LIST_FILE"]
        mount, volume, name = _tls_volume(pod, container, path)
        assert volume.get("configMap", {}).get("name") == "splitrl-deny-list" and name == "deny-list.txt", app
        assert mount.get("readOnly") is True and "subPath" not in mount, app
