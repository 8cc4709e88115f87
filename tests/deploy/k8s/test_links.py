"""Every overlay's links between pods: the addresses services dial resolve to the designed links, certificates
name every dialled host, NetworkPolicy allows exactly those links, learner ranks and replay shards are wired in
step with replica counts, and Prometheus scrapes every splitrl container once."""

from __future__ import annotations

import argparse
import re

import pytest
import yaml

from splitrl.core.args import settings_from_args
from splitrl.core.config import split_addresses
from tests.deploy import kube
from tests.deploy.conftest import REPO
from tests.deploy.k8s.conftest import SPLITRL_APPS
from tests.deploy.kube import NAMESPACE, Manifest, PodTemplate

pytestmark = pytest.mark.deploy

TIER = "splitrl.io/tier"
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
