"""splitrl.core.metrics (the catalogue, each service's families) and splitrl.core.link_meter (tensor element
counting and LinkMeter's byte/message/element counters)."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from google.protobuf import struct_pb2
from prometheus_client import CollectorRegistry, generate_latest

from splitrl.core import scrape, wire
from splitrl.core.link_meter import LinkMeter, tensor_elements
from splitrl.core.metrics import SERVICE_FAMILIES, SHARED_FAMILIES, Metrics
from splitrl.run.registry import SERVICES
from splitrl.v1 import replay_pb2, rollout_pb2


def trajectory(steps: int) -> replay_pb2.Trajectory:
    """A Trajectory of `steps` steps with 2x3x3 observations: 18(T+1) + 6T + 3(T+1) elements."""
    return replay_pb2.Trajectory(
        observations=wire.encode(torch.zeros(steps + 1, 2, 3, 3, dtype=torch.uint8)),
        actions=wire.encode(torch.zeros(steps, dtype=torch.int64)),
        behaviour_log_probs=wire.encode(torch.zeros(steps)),
        values=wire.encode(torch.zeros(steps + 1)),
        rewards=wire.encode(torch.zeros(steps)),
        terminated=wire.encode(torch.zeros(steps, dtype=torch.bool)),
        truncated=wire.encode(torch.zeros(steps, dtype=torch.bool)),
        policy_versions=wire.encode(torch.zeros(steps, dtype=torch.int64)),
        step_ids=wire.encode(torch.zeros(steps + 1, dtype=torch.int64)),
        encoder_versions=wire.encode(torch.zeros(steps + 1, dtype=torch.int64)),
    )


def trajectory_elements(steps: int) -> int:
    return 18 * (steps + 1) + 6 * steps + 3 * (steps + 1)


def test_tensor_elements_of_a_tensor_is_its_shape_product():
    assert tensor_elements(wire.encode(torch.zeros(2, 3, 4))) == 24
    assert tensor_elements(wire.encode(torch.zeros(0, 3))) == 0


def test_tensor_elements_counts_the_data_a_forged_shape_does_not_carry():
    forged = wire.Tensor(dtype=wire.DTYPE_FLOAT32, shape=[10**9, 10**9], data=bytes(8))
    assert tensor_elements(forged) == 2
    negative = wire.Tensor(dtype=wire.DTYPE_UINT8, shape=[-1, 3], data=b"")
    assert tensor_elements(negative) == 0
    assert tensor_elements(wire.Tensor(dtype=99, shape=[4], data=bytes(4))) == 0
    # A negative int4 count needs (-4 + 7) // 8 = 0 bytes: it once "fit" empty data and counted -1, which
    # prometheus_client refuses to add to a counter.
    assert tensor_elements(wire.Tensor(dtype=wire.DTYPE_INT4, shape=[-1], data=b"")) == 0


def test_tensor_elements_of_a_trajectory_sums_every_field():
    assert tensor_elements(trajectory(3)) == trajectory_elements(3) == 18 * 4 + 18 + 12


def test_tensor_elements_finds_tensors_nested_in_an_insert_request():
    request = replay_pb2.InsertRequest(table="queue", sequence=7, trajectory=trajectory(2), priority=1.0)
    assert tensor_elements(request) == trajectory_elements(2)


def test_tensor_elements_sums_repeated_messages():
    response = replay_pb2.SampleResponse(
        items=[
            replay_pb2.SampledItem(key=1, trajectory=trajectory(1)),
            replay_pb2.SampledItem(key=2, trajectory=trajectory(4)),
            replay_pb2.SampledItem(key=3),
        ]
    )
    assert tensor_elements(response) == trajectory_elements(1) + trajectory_elements(4)


def test_tensor_elements_ignores_unset_tensors_and_scalar_fields():
    assert tensor_elements(replay_pb2.InsertRequest(table="queue", sequence=1)) == 0
    request = rollout_pb2.ActRequest(
        observations=wire.encode(torch.zeros(4, 8)), rewards=[1.0] * 4, terminated=[False] * 4, first_step_id=1
    )
    assert tensor_elements(request) == 32


def test_tensor_elements_walks_a_recursive_message_type_without_tensors():
    value = struct_pb2.Value(struct_value=struct_pb2.Struct(fields={"a": struct_pb2.Value(number_value=1.0)}))
    assert tensor_elements(value) == 0


LABELS = {"link": "inference-replay", "direction": "sent", "phase": "rollout", "payload": "trajectory"}


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def sample(registry: CollectorRegistry, series: str, labels: dict[str, str]) -> float | None:
    return registry.get_sample_value(f"splitrl_link_{series}_total", labels)


def test_link_meter_counts_bytes_messages_and_elements(registry):
    meter = LinkMeter(Metrics(registry), "inference-replay")
    first = replay_pb2.InsertRequest(table="queue", sequence=1, trajectory=trajectory(2))
    second = replay_pb2.InsertRequest(table="queue", sequence=2, trajectory=trajectory(5))

    sizes = [meter.sent(message, phase="rollout", payload="trajectory") for message in (first, second)]

    assert sizes == [first.ByteSize(), second.ByteSize()]
    assert sample(registry, "bytes", LABELS) == first.ByteSize() + second.ByteSize()
    assert sample(registry, "messages", LABELS) == 2
    assert sample(registry, "elements", LABELS) == trajectory_elements(2) + trajectory_elements(5)


def test_link_meter_bytes_equal_the_serialized_size(registry):
    meter = LinkMeter(Metrics(registry), "inference-replay")
    message = replay_pb2.InsertRequest(table="queue", sequence=300, trajectory=trajectory(3), priority=0.5)
    meter.sent(message, phase="rollout", payload="trajectory")
    assert sample(registry, "bytes", LABELS) == len(message.SerializeToString())


def test_link_meter_keeps_directions_and_payloads_apart(registry):
    meter = LinkMeter(Metrics(registry), "replay-learner")
    request = replay_pb2.SampleRequest(table="queue", num_items=4)
    response = replay_pb2.SampleResponse(items=[replay_pb2.SampledItem(key=1, trajectory=trajectory(1))])

    meter.received(request, phase="training", payload="request")
    meter.sent(response, phase="training", payload="batch")
    meter.sent(response, phase="training", payload="batch")

    received = {"link": "replay-learner", "direction": "received", "phase": "training", "payload": "request"}
    sent = {**received, "direction": "sent", "payload": "batch"}
    assert sample(registry, "messages", received) == 1
    assert sample(registry, "bytes", received) == request.ByteSize()
    assert sample(registry, "elements", received) == 0
    assert sample(registry, "messages", sent) == 2
    assert sample(registry, "bytes", sent) == 2 * response.ByteSize()
    assert sample(registry, "elements", sent) == 2 * trajectory_elements(1)
    assert sample(registry, "messages", {**sent, "direction": "received"}) is None


def test_registries_do_not_share_counters():
    first, second = CollectorRegistry(), CollectorRegistry()
    LinkMeter(Metrics(first), "inference-replay").sent(trajectory(1), phase="rollout", payload="trajectory")
    Metrics(second)
    assert sample(first, "messages", LABELS) == 1
    assert sample(second, "messages", LABELS) is None


def families(registry: CollectorRegistry) -> set[str]:
    return {family.name for family in registry.collect()}


def splitrl_families(registry: CollectorRegistry) -> set[str]:
    return {name for name in families(registry) if not name.startswith("process_")}  # process_*: Linux only


def test_a_service_exports_its_own_families_and_the_shared_ones_only():
    replay, learner, every = CollectorRegistry(), CollectorRegistry(), CollectorRegistry()
    Metrics(replay, "replay"), Metrics(learner, "learner"), Metrics(every)
    assert splitrl_families(replay) == SHARED_FAMILIES | SERVICE_FAMILIES["replay"]
    assert splitrl_families(learner) == SHARED_FAMILIES | SERVICE_FAMILIES["learner"]
    assert "splitrl_replay_inserts" in families(replay) and "splitrl_learner_updates" not in families(replay)
    assert len(generate_latest(replay)) < len(generate_latest(every)) / 2


def test_every_name_in_the_export_lists_is_a_family():
    # A misspelt name would drop that family from the service's /metrics without an error.
    every = CollectorRegistry()
    Metrics(every)
    assert SHARED_FAMILIES.union(*SERVICE_FAMILIES.values()) <= families(every)


def service_registries() -> list[CollectorRegistry]:
    registries = [CollectorRegistry() for _ in SERVICE_FAMILIES]
    for registry, service in zip(registries, SERVICE_FAMILIES, strict=True):
        Metrics(registry, service)
    return registries


def test_every_family_is_exported_by_some_service():
    # Without a service a registry gets every family (tools and tests reading one registry for several roles).
    exported = set().union(*(families(registry) for registry in service_registries()))
    every = CollectorRegistry()
    Metrics(every)
    assert exported == families(every)


def test_every_service_splitrl_serves_has_an_export_list():
    assert set(SERVICE_FAMILIES) == set(SERVICES)  # `splitrl serve NAME` builds Metrics(registry, NAME)


def test_an_unknown_service_is_refused_naming_it():
    with pytest.raises(ValueError, match="'replay-1'"):
        Metrics(CollectorRegistry(), "replay-1")


def test_a_family_updated_but_not_exported_is_reported_and_not_served():
    registry = CollectorRegistry()
    metrics = Metrics(registry, "replay")
    assert metrics.unexported_in_use() == []
    metrics.learner_updates.inc(0)  # touched at 0: still nothing a reader could miss
    metrics.policy_lag.observe(0)  # an observation is a count of 1, whatever its value
    metrics.reconnects.labels(peer="learner").inc()  # shared: exported
    metrics.unknown_step_ids.labels(request="gradient")  # a labelled series exists
    assert metrics.unexported_in_use() == ["splitrl_policy_lag", "splitrl_unknown_step_ids"]
    assert "splitrl_policy_lag" not in generate_latest(registry).decode()
    assert Metrics(CollectorRegistry()).unexported_in_use() == []  # every family exported: nothing to miss


@pytest.mark.skipif(sys.platform != "linux", reason="the process_* series and the peak read Linux's /proc")
def test_a_service_exports_its_cpu_resident_memory_and_a_peak_no_lower(registry):
    Metrics(registry)
    cost = scrape.process_cost(generate_latest(registry).decode())  # process_* are read before the peak
    assert cost.cpu_seconds > 0
    assert 0 < cost.resident_bytes <= cost.peak_resident_bytes


def test_process_cost_adds_worker_processes_and_leaves_what_is_not_exported_unknown():
    text = (
        "process_cpu_seconds_total 2.5\n"
        "process_resident_memory_bytes 100\n"
        "splitrl_worker_cpu_seconds 1.5\n"
        "splitrl_worker_resident_memory_bytes 20\n"
        "splitrl_worker_peak_resident_memory_bytes 40\n"
        "splitrl_process_peak_resident_memory_bytes 150\n"
    )
    assert scrape.process_cost(text) == scrape.ProcessCost(cpu_seconds=4.0, resident_bytes=120, peak_resident_bytes=190)
    unknown = scrape.process_cost("splitrl_worker_cpu_seconds 0\n")  # no process_* series: not Linux
    assert math.isnan(unknown.cpu_seconds) and math.isnan(unknown.resident_bytes)
    assert math.isnan(unknown.peak_resident_bytes)


def test_an_exposition_read_many_times_is_parsed_once(registry, monkeypatch):
    # splitrl up reads each service's newest /metrics ~10 times per progress tick: progress, curve, TensorBoard.
    meter = LinkMeter(Metrics(registry), "env-encoder")
    meter.sent(rollout_pb2.EnvStep(sequence=1, rewards=[1.0, 2.0]), phase="rollout", payload="observation")
    text = generate_latest(registry).decode()
    parses = []
    scrape._parsed.cache_clear()  # this exact text cannot have been read before
    parse = scrape.text_string_to_metric_families
    monkeypatch.setattr(scrape, "text_string_to_metric_families", lambda t: parses.append(t) or parse(t))
    links = scrape.link_counts([text])
    for _ in range(9):
        assert scrape.link_counts([text]) == links
    assert links["env-encoder"]["rollout"]["observation"]["sent"]["messages"] == 1
    assert len(parses) == 1
    # Another exposition (the next scrape) is parsed on its own, and the first one's reading is unchanged.
    meter.sent(rollout_pb2.EnvStep(sequence=2), phase="rollout", payload="observation")
    later = generate_latest(registry).decode()
    assert scrape.link_counts([later])["env-encoder"]["rollout"]["observation"]["sent"]["messages"] == 2
    assert scrape.link_counts([text]) == links and len(parses) == 2
