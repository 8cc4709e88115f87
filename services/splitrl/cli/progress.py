"""Live progress of `splitrl up`: a rich table on a terminal, one plain line per update otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from splitrl.core import scrape
from splitrl.core.metrics import ENV_STEPS
from splitrl.run.summary import SUPERVISOR, human_bytes


def _restarts(restarts: dict[str, int] | None) -> str:
    """ ", restarted: replay 1, learner 2" (empty when nothing was restarted)."""
    if not restarts:
        return ""
    return ", restarted: " + ", ".join(f"{name} {count}" for name, count in restarts.items())


class Progress:
    """Shows env steps, steps/s and bytes sent per link from the services' live /metrics."""

    def __init__(self, target_steps: int, interactive: bool, done_steps: int = 0) -> None:
        """`done_steps`: agent steps earlier segments of a resumed run took (shown added to this one's)."""
        self.target_steps = target_steps
        self.done_steps = done_steps
        self.console = Console()
        self._live = Live(console=self.console, refresh_per_second=4) if interactive else None
        if self._live is not None:
            self._live.start()
        self._last_line = 0.0
        # Counters only grow; a service that has already exited must not make the display go backwards.
        self._steps = 0
        self._sent: dict[tuple[str, str], int] = {}

    def update(self, texts: list[str], elapsed_s: float, restarts: dict[str, int] | None = None) -> None:
        self._steps = max(self._steps, int(scrape.total(texts, f"{ENV_STEPS}_total")))
        rate = self._steps / elapsed_s if elapsed_s > 0 else 0.0
        steps = self.done_steps + self._steps
        for key, value in scrape.sent_bytes(scrape.link_counts(texts)).items():
            self._sent[key] = max(self._sent.get(key, 0), value)
        sent = self._sent
        if self._live is not None:
            title = f"splitrl: {steps}/{self.target_steps} env steps, {rate:.0f} steps/s{_restarts(restarts)}"
            table = Table(title=title)
            table.add_column("link")
            table.add_column("phase")
            table.add_column("bytes sent", justify="right")
            for (link, phase), total in sorted(sent.items()):
                table.add_row(link, phase, human_bytes(total))
            self._live.update(table)
        elif elapsed_s - self._last_line >= 5.0 or steps >= self.target_steps:
            self._last_line = elapsed_s
            links = ", ".join(f"{link}/{phase} {human_bytes(b)}" for (link, phase), b in sorted(sent.items()))
            print(
                f"[{elapsed_s:6.1f}s] {steps}/{self.target_steps} env steps, {rate:.0f} steps/s"
                f"{_restarts(restarts)} | {links}",
                flush=True,
            )

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()

    def print_summary(self, summary: dict[str, Any], path: Path) -> None:
        """The run's traffic per link, phase and payload; fits 80 columns (elements are in summary.json)."""
        table = Table(
            title=f"run summary ({summary['env_steps']} env steps, {summary['env_steps_per_second']} steps/s)"
        )
        for column in ("link", "phase", "payload"):
            table.add_column(column, no_wrap=True)
        for column in ("messages", "bytes", "B/step"):
            table.add_column(column, justify="right", no_wrap=True)
        steps = max(summary["env_steps"], 1)
        for link, phases in summary["links"].items():
            for phase, payloads in phases.items():
                for payload, directions in payloads.items():
                    sent = directions.get("sent", {"messages": 0, "bytes": 0, "elements": 0})
                    table.add_row(
                        link,
                        phase,
                        payload,
                        str(sent["messages"]),
                        human_bytes(sent["bytes"]),
                        f"{sent['bytes'] / steps:.0f}",
                    )
        self.console.print(table)
        self.console.print(_process_table(summary["processes"] | {SUPERVISOR: summary["supervisor"]}))
        self.console.print(f"summary written to {path}; plots in {path.with_name('learning.png')}")


def _process_table(processes: dict[str, dict[str, Any]]) -> Table:
    """Each process's CPU per env step and resident memory (at the end, and its peak): on the edge, what the
    device pays besides WAN bytes."""
    table = Table(title="processes")
    table.add_column("process", no_wrap=True)
    for column in ("CPU ms/env step", "MiB at end", "peak MiB"):
        table.add_column(column, justify="right", no_wrap=True)
    for name, cost in processes.items():
        cpu_ms = cost["cpu_ms_per_env_step"]
        table.add_row(
            name,
            "-" if cpu_ms is None else f"{cpu_ms:.2f}",
            *("-" if cost[key] is None else f"{cost[key]:.0f}" for key in ("resident_mib", "peak_resident_mib")),
        )
    return table
