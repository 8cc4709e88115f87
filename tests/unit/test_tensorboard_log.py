"""What `splitrl up` charts from the services' /metrics: the learner's schedules, never a service's idle 0."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from splitrl.cli.tensorboard import TensorBoardLog
from splitrl.core.metrics import Metrics
from splitrl.run import files as run_dir_files


class RecordingWriter:
    def __init__(self) -> None:
        self.scalars: dict[str, list[tuple[int, float]]] = {}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.setdefault(tag, []).append((step, value))

    def close(self) -> None:
        pass


def exposition(updates: int = 0, learning_rate: float = 0.0, entropy_coef: float = 0.0) -> str:
    metrics = Metrics(CollectorRegistry())
    metrics.learner_updates.inc(updates)
    metrics.learning_rate.set(learning_rate)
    metrics.entropy_coef.set(entropy_coef)
    return generate_latest(metrics.registry).decode()


def test_the_schedules_are_the_learners_and_charted_only_once_the_live_learner_has_updated(tmp_path):
    log = TensorBoardLog(tmp_path)
    log.writer.close()
    log.writer = writer = RecordingWriter()
    offset = run_dir_files.zero_point() | {"updates": 5.0}  # a resumed run: 5 updates in earlier segments
    idle_service = exposition()  # a registry of every family exports the gauges, at 0
    restarted_learner = exposition(updates=0)
    point = offset | {"env_steps": 100.0, "seconds": 1.0}
    log.add(point, [idle_service, restarted_learner], [idle_service, restarted_learner], offset)
    assert "charts/learning_rate" not in writer.scalars and "charts/entropy_coef" not in writer.scalars

    learner = exposition(updates=1, learning_rate=2e-4, entropy_coef=0.004)
    later = point | {"env_steps": 200.0, "seconds": 2.0, "updates": 6.0}
    log.add(later, [idle_service, learner], [idle_service, learner], offset)
    assert writer.scalars["charts/learning_rate"] == [(200, 2e-4)]
    assert writer.scalars["charts/entropy_coef"] == [(200, 0.004)]

    # The learner restarts mid-segment: the run has updated in this segment, the new process not yet.
    after_restart = later | {"env_steps": 300.0, "seconds": 3.0, "updates": 7.0}
    log.add(after_restart, [idle_service, learner, restarted_learner], [idle_service, restarted_learner], offset)
    assert len(writer.scalars["charts/learning_rate"]) == len(writer.scalars["charts/entropy_coef"]) == 1
