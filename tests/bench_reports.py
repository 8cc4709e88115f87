"""A throughput bench report with nothing measured yet, for tests of its tables."""

from __future__ import annotations

from splitrl.bench.throughput_report import ThroughputReport

#: The settings a report's tables read: env E, 8 envs, one PPO update per 32 x 16 agent steps, 4 x 4 minibatches.
SHAPE = {"env": "E", "num_envs": 8, "steps": 4096, "torch_threads": 1, "action_repeat": 1, "unroll_length": 32,
         "chunks_per_update": 16, "epochs": 4, "minibatches": 4}  # fmt: skip


def empty_report(**settings: object) -> ThroughputReport:
    """A report of SHAPE's settings, overridden by `settings`, with no run in it."""
    return ThroughputReport(settings=SHAPE | settings)
