"""TensorBoard event files of a local run, as RL users expect from CleanRL and Stable-Baselines3.

`splitrl up` writes RUN_DIR/tensorboard/ from the same scrapes that draw its
progress and curve, so no service needs TensorBoard. The x axis is agent steps,
cumulative over a resumed run's segments. Scalars (CleanRL's names where one fits):

- charts/episodic_return: mean return of the episodes finished since the last point;
- charts/steps_per_second, charts/learner_updates;
- losses/<term>: the learner's last update (policy_loss, value_loss, entropy, approx_kl, clip_fraction);
- charts/policy_lag: mean versions between the learner and a sampled chunk's oldest action;
- charts/learning_rate and charts/entropy_coef: the learner's last update's (CleanRL logs the first);
- network/wan_bytes/<phase>: WAN bytes sent per phase (rollout, training, weights) in this segment, and
  network/wan_bytes_per_step: all of them per agent step so far.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from splitrl.core import scrape
from splitrl.core.metrics import ENTROPY_COEF, LEARNER_LOSS, LEARNER_UPDATES, LEARNING_RATE, POLICY_LAG

#: Gauges logged as they are, under charts/.
CHARTED_GAUGES = {LEARNING_RATE: "charts/learning_rate", ENTROPY_COEF: "charts/entropy_coef"}


class TensorBoardLog:
    """One SummaryWriter under RUN_DIR/tensorboard; `add` is called with each new curve point."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (a dependency)

        self.writer: Any = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self._previous: dict[str, float] | None = None

    def add(self, point: dict[str, float], texts: list[str], live_texts: list[str], offset: dict[str, float]) -> None:
        """Log `point` (cumulative, as the curve holds it) with this segment's /metrics: `texts` for counters
        (restarted services' dead incarnations included), `live_texts` for gauges (the losses)."""
        step = int(point["env_steps"])
        previous = self._previous or offset
        finished = point["episodes"] - previous["episodes"]
        if finished > 0:
            mean = (point["return_sum"] - previous["return_sum"]) / finished
            self.writer.add_scalar("charts/episodic_return", mean, step)
        seconds = point["seconds"] - previous["seconds"]
        if seconds > 0:
            self.writer.add_scalar("charts/steps_per_second", (step - previous["env_steps"]) / seconds, step)
        self.writer.add_scalar("charts/learner_updates", point["updates"], step)
        charted: dict[str, float] = {}
        live_updates = 0.0
        for name, labels, value in (sample for text in live_texts for sample in scrape.samples(text)):
            if name == LEARNER_LOSS:
                self.writer.add_scalar(f"losses/{labels.get('term', 'total')}", value, step)
            elif name in CHARTED_GAUGES:  # only the learner sets them (>= 0); a registry of every family has 0
                charted[name] = max(value, charted.get(name, 0.0))
            elif name == f"{LEARNER_UPDATES}_total":
                live_updates += value
        # Only once the live learner has updated: before, it exports 0 (a fresh or restarted process).
        if live_updates > 0:
            for name, value in charted.items():
                self.writer.add_scalar(CHARTED_GAUGES[name], value, step)
        _, lag_sum, lag_count = scrape.histogram(texts, POLICY_LAG)
        if lag_count:
            self.writer.add_scalar("charts/policy_lag", lag_sum / lag_count, step)
        for phase, phase_bytes in scrape.wan_by_phase(scrape.link_counts(texts)).items():
            self.writer.add_scalar(f"network/wan_bytes/{phase}", phase_bytes, step)
        if step:
            self.writer.add_scalar("network/wan_bytes_per_step", point["wan_bytes"] / step, step)
        self._previous = point

    def close(self) -> None:
        self.writer.close()
