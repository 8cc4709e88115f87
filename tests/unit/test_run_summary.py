"""splitrl.run.summary: each service's CPU and memory in a run's summary.json (process_costs), and the curve's
points (curve_point)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest

from splitrl.core.metrics import Metrics
from splitrl.run.summary import curve_point, process_costs


def exposition(cpu_s: float, resident: float, peak: float | None, *, workers: tuple[float, float, float] = (0, 0, 0)):
    """A service's /metrics as far as process_costs reads it (peak None: the system did not say)."""
    lines = [
        f"process_cpu_seconds_total {cpu_s}",
        f"process_resident_memory_bytes {resident}",
        f"splitrl_worker_cpu_seconds {workers[0]}",
        f"splitrl_worker_resident_memory_bytes {workers[1]}",
        f"splitrl_worker_peak_resident_memory_bytes {workers[2]}",
    ]
    if peak is not None:
        lines.append(f"splitrl_process_peak_resident_memory_bytes {peak}")
    return "\n".join(lines) + "\n"


MIB = 2**20
KEYS = ("cpu_seconds", "cpu_ms_per_env_step", "resident_mib", "peak_resident_mib")


def cost(*values: float | None) -> dict[str, float | None]:
    return dict(zip(KEYS, values, strict=True))


def test_a_services_costs_are_its_own_and_its_workers_in_mib_and_ms_per_env_step():
    texts = {"environment": exposition(1.0, 60 * MIB, 70 * MIB, workers=(3.0, 100 * MIB, 120 * MIB))}
    assert process_costs(texts, {}, env_steps=2000) == {"environment": cost(4.0, 2.0, 160.0, 190.0)}


def test_a_restarted_service_counts_every_life_and_keeps_its_highest_peak():
    texts = {"learner": exposition(5.0, 300 * MIB, 310 * MIB)}
    earlier = [exposition(2.0, 390 * MIB, 400 * MIB), exposition(1.0, 280 * MIB, None)]
    assert process_costs(texts, {"learner": earlier}, env_steps=1000)["learner"] == cost(8.0, 8.0, 300.0, 400.0)


def test_what_was_not_measured_is_none_not_zero():
    texts = {"replay": exposition(0.5, 50 * MIB, None), "inference": "splitrl_env_steps_total 0\n"}
    costs = process_costs(texts, {}, env_steps=0)
    assert costs["replay"] == cost(0.5, None, 50.0, None)
    assert costs["inference"] == dict.fromkeys(KEYS)


def test_a_curve_point_says_when_the_learner_completed_its_last_update_by_the_learners_clock():
    learner, inference = Metrics(CollectorRegistry(), "learner"), Metrics(CollectorRegistry(), "inference")
    texts = [generate_latest(metrics.registry).decode() for metrics in (learner, inference)]
    assert curve_point(texts)["last_update_at"] == 0.0  # before the first update: the learner exports 0
    before = time.time()
    learner.learner_last_update.set_to_current_time()
    learner.learner_updates.inc()
    texts = [generate_latest(metrics.registry).decode() for metrics in (inference, learner)]
    point = curve_point(texts)
    assert point["updates"] == 1 and before <= point["last_update_at"] <= time.time()
