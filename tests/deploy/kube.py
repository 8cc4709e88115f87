"""A model of rendered Kubernetes manifests, for the tests in tests/deploy/k8s/.

`Manifest` holds the objects `kubectl kustomize` printed; `PodTemplate` is one workload's pod.
Beside them, two small evaluators that stand in for a cluster none of these machines can
run (docs/design.md §7): NetworkPolicy as the API defines it (no ipBlock), and Prometheus's
relabelling over what pod discovery would yield.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import yaml

NAMESPACE = "splitrl"
APP = "app.kubernetes.io/name"


@dataclass(frozen=True)
class PodTemplate:
    workload: dict

    @property
    def spec(self) -> dict:
        return self.workload["spec"]["template"]["spec"]

    @property
    def labels(self) -> dict[str, str]:
        return self.workload["spec"]["template"]["metadata"].get("labels", {})

    @property
    def annotations(self) -> dict[str, str]:
        return self.workload["spec"]["template"]["metadata"].get("annotations", {})

    @property
    def app(self) -> str:
        return self.labels[APP]

    @property
    def containers(self) -> list[dict]:
        return self.spec["containers"]

    @property
    def splitrl_containers(self) -> list[dict]:
        """Containers running `splitrl serve <service>` (the image name is the overlay's to choose)."""
        return [c for c in self.containers if c.get("args", [])[:1] == ["serve"]]


class Manifest:
    def __init__(self, text: str) -> None:
        self.objects: list[dict] = [o for o in yaml.safe_load_all(text) if o]

    def of_kind(self, *kinds: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] in kinds]

    def get(self, kind: str, name: str) -> dict:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
        return found[0]

    @cached_property
    def pods(self) -> list[PodTemplate]:
        return [PodTemplate(w) for w in self.of_kind("Deployment", "StatefulSet", "DaemonSet")]

    def pod(self, app: str) -> PodTemplate:
        [pod] = [p for p in self.pods if p.app == app]
        return pod

    def env(self, container: dict) -> dict[str, str]:
        """The container's literal environment as the kubelet builds it: envFrom in order, then env."""
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            assert "configMapRef" in source, f"{container['name']}: only ConfigMap envFrom is modelled"
            data = self.get("ConfigMap", source["configMapRef"]["name"]).get("data", {})
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
            else:
                env.pop(var["name"], None)
        return env


def name(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels + matchExpressions); {} selects everything."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if not {
            "In": key in labels and labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]:
            return False
    return True


def service_pods(manifest: Manifest, service: dict) -> list[PodTemplate]:
    return [p for p in manifest.pods if selects({"matchLabels": service["spec"]["selector"]}, p.labels)]


def dialled(manifest: Manifest, address_list: str) -> list[tuple[str, int, dict, str]]:
    """Each entry of a SPLITRL_*_ADDRESS list as (host, port, the Service it reaches, the DNS suffix after it).

    A host is SERVICE[.SUFFIX], or a StatefulSet pod's own name POD-K.SERVICE[.SUFFIX], where SERVICE governs
    the StatefulSet POD and K is below its replica count (pod names are not resolvable otherwise).
    """
    from splitrl.core.config import split_addresses

    entries = []
    for address in split_addresses(address_list):
        host, port = address.rsplit(":", 1)
        first, _, rest = host.partition(".")
        ordinal = re.fullmatch(r"(.+)-(\d+)", first)
        if ordinal and rest:
            governing, _, suffix = rest.partition(".")
            stateful = manifest.get("StatefulSet", ordinal[1])
            assert stateful["spec"]["serviceName"] == governing, f"{address}: {governing} does not govern {first}"
            replicas = stateful["spec"].get("replicas", 1)
            assert int(ordinal[2]) < replicas, f"{address}: {ordinal[1]} has {replicas} replicas"
            entries.append((host, int(port), manifest.get("Service", governing), suffix))
        else:
            entries.append((host, int(port), manifest.get("Service", first), rest))
    return entries


def settings_model(service: str) -> type:
    # splitrl.<service>.settings.<Service>Settings, as `splitrl serve <service>` uses it
    module = importlib.import_module(f"splitrl.{service.replace('-', '_')}.settings")
    return getattr(module, "".join(part.capitalize() for part in service.split("-")) + "Settings")


# ---------------------------------------------------------------------------------------------
# NetworkPolicy: a small evaluator of the rules as the API defines them (no ipBlock)


@dataclass(frozen=True)
class Peer:
    namespace: str
    labels: Mapping[str, str]
    ports: tuple[tuple[str, int, str], ...]  # (name, number, protocol) of its containers

    @classmethod
    def of(cls, pod: PodTemplate) -> Peer:
        ports = tuple(
            (p["name"], p["containerPort"], p.get("protocol", "TCP"))
            for c in pod.containers
            for p in c.get("ports", [])
        )
        return cls(NAMESPACE, pod.labels, ports)


def policy_types(spec: dict) -> list[str]:
    return spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])


def rule_ports_match(ports: list[dict] | None, destination: Peer, number: int, protocol: str) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        port = p.get("port")
        if port is None:
            return True
        if isinstance(port, int) and port <= number <= p.get("endPort", port):
            return True
        if isinstance(port, str) and (port, number, protocol) in destination.ports:
            return True
    return False


def rule_peers_match(peers: list[dict] | None, policy_namespace: str, other: Peer) -> bool:
    if not peers:
        return True
    for peer in peers:
        assert "ipBlock" not in peer, "the evaluator does not model ipBlock"
        if "namespaceSelector" in peer:
            in_namespace = selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": other.namespace})
        else:
            in_namespace = other.namespace == policy_namespace
        if in_namespace and selects(peer.get("podSelector", {}), other.labels):
            return True
    return False


def one_end_allows(policies: list[dict], direction: str, subject: Peer, other: Peer, destination: Peer, port, proto):
    selecting = [
        p
        for p in policies
        if p["metadata"].get("namespace", NAMESPACE) == subject.namespace
        and selects(p["spec"]["podSelector"], subject.labels)
        and direction in policy_types(p["spec"])
    ]
    if not selecting:
        return True  # not isolated in this direction
    rules, peers = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    return any(
        rule_ports_match(rule.get("ports"), destination, port, proto)
        and rule_peers_match(rule.get(peers), policy["metadata"].get("namespace", NAMESPACE), other)
        for policy in selecting
        for rule in policy["spec"].get(rules, [])
    )


def allowed(manifest: Manifest, source: Peer, destination: Peer, port: int, protocol: str = "TCP") -> bool:
    """Whether a connection from `source` to `destination`:port is let out of one and into the other."""
    policies = manifest.of_kind("NetworkPolicy")
    return one_end_allows(policies, "Egress", source, destination, destination, port, protocol) and one_end_allows(
        policies, "Ingress", destination, source, destination, port, protocol
    )


# ---------------------------------------------------------------------------------------------
# Prometheus: the scrape config run over the rendered pods, as pod discovery would feed it


def relabel(labels: dict[str, str], configs: list[dict]) -> dict[str, str] | None:
    """Prometheus relabelling for the actions k8s/ uses; None when the target is dropped."""
    labels = dict(labels)
    for config in configs:
        action = config.get("action", "replace")
        value = config.get("separator", ";").join(labels.get(s, "") for s in config.get("source_labels", []))
        match = re.fullmatch(config.get("regex", "(.*)"), value)
        if action not in ("keep", "drop", "replace"):
            raise AssertionError(f"relabel action {action!r} is not modelled here")
        if (action == "keep" and not match) or (action == "drop" and match):
            return None
        if action == "replace" and match:
            # Go's $1 / ${1} in Python's \g<1>
            template = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", str(config.get("replacement", "$1")))
            labels[config["target_label"]] = match.expand(template)
    return {k: v for k, v in labels.items() if v}


def pod_sd_targets(pod: PodTemplate, job: str) -> Iterator[dict[str, str]]:
    """What kubernetes_sd role=pod yields for a running pod: one target per container port."""

    def clean(name: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", name)

    common = {
        "job": job,
        "__metrics_path__": "/metrics",
        "__meta_kubernetes_namespace": NAMESPACE,
        "__meta_kubernetes_pod_name": f"{pod.workload['metadata']['name']}-0",
        "__meta_kubernetes_pod_phase": "Running",
        **{f"__meta_kubernetes_pod_label_{clean(k)}": v for k, v in pod.labels.items()},
        **{f"__meta_kubernetes_pod_annotation_{clean(k)}": v for k, v in pod.annotations.items()},
    }
    for container in pod.containers:
        for port in container.get("ports", []):
            yield {
                **common,
                "__address__": f"10.0.0.1:{port['containerPort']}",
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
            }
