"""Live progress of `splitrl up`: one status line (env steps, steps/s, ETA, the recent mean return, WAN bytes
per env step), live on a terminal and every few seconds otherwise; `--verbose` adds each link's bytes sent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from splitrl.core import scrape
from splitrl.core.metrics import ENV_STEPS, EPISODE_RETURN, LEARNER_UPDATES
from splitrl.run.summary import SUPERVISOR, human_bytes, recent_return

#: Seconds between progress lines where the output is not a terminal (a log, a pipe).
PLAIN_LINE_INTERVAL_S = 5.0


def _restarts(restarts: dict[str, int] | None) -> str:
    """ ", restarted: replay 1, learner 2" (empty when nothing was restarted)."""
    if not restarts:
        return ""
    return ", restarted: " + ", ".join(f"{name} {count}" for name, count in restarts.items())


def duration(seconds: float) -> str:
    """95 -> '1m 35s', 7384 -> '2h 03m', 12 -> '12s'."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def status_line(
    steps: int,
    target: int,
    rate: float,
    mean_return: tuple[float | None, int],
    wan_bytes: float,
    segment_steps: int,
    updates: int,
) -> str:
    """'1,200/5,000 env steps (24%) | 410 steps/s | ETA 9s | return -0.21 (last 104 episodes) | WAN 130 B/step |
    3 updates'. `steps` counts the whole run (earlier segments of a resumed run too); `rate`, `wan_bytes` and
    `updates` are this segment's, over its `segment_steps` env steps."""
    eta = duration((target - steps) / rate) if rate > 0 and steps < target else "-"
    mean, episodes = mean_return
    returns = "return - (no episode ended yet)" if mean is None else f"return {mean:.3g} (last {episodes} episodes)"
    per_step = f"{wan_bytes / segment_steps:.0f}" if segment_steps else "-"
    share = f" ({100 * steps / target:.0f}%)" if target else ""
    return (
        f"{steps:,}/{target:,} env steps{share} | {rate:.0f} steps/s | ETA {eta} | {returns} | "
        f"WAN {per_step} B/step | {updates:,} updates"
    )


class Progress:
    """Shows the run's progress from the services' live /metrics (see the module docstring)."""

    def __init__(self, target_steps: int, interactive: bool, done_steps: int = 0, verbose: bool = False) -> None:
        """`done_steps`: agent steps earlier segments of a resumed run took (shown added to this one's).
        `verbose`: each link's bytes sent too, per phase."""
        self.target_steps = target_steps
        self.done_steps = done_steps
        self.verbose = verbose
        self.console = Console()
        self._live = Live(console=self.console, refresh_per_second=4) if interactive else None
        if self._live is not None:
            self._live.start()
        self._last_line = -PLAIN_LINE_INTERVAL_S
        # Counters only grow; a service that has already exited must not make the display go backwards.
        self._steps = self._updates = self._wan = 0
        self._returns: list[dict[str, float]] = []  # cumulative episodes and return_sum, as read
        self._sent: dict[tuple[str, str], int] = {}

    def starting(self, names: Sequence[str], logs: Path) -> None:
        """Shown until the first update: which services start (each once the one it dials serves), and where their
        logs go."""
        line = f"starting {len(names)} services ({', '.join(names)}); their logs: {logs}/"
        if self._live is not None:
            self._live.update(Text(f"splitrl: {line}"))
        else:
            print(line, flush=True)

    def update(self, texts: list[str], elapsed_s: float, restarts: dict[str, int] | None = None) -> None:
        self._read(texts)
        rate = self._steps / elapsed_s if elapsed_s > 0 else 0.0
        line = status_line(
            self.done_steps + self._steps,
            self.target_steps,
            rate,
            recent_return(self._returns),
            self._wan,
            self._steps,
            self._updates,
        ) + _restarts(restarts)
        if self._live is not None:
            shown: Any = Text(f"splitrl: {line}")
            if self.verbose:
                shown = Group(shown, self._links_table())
            self._live.update(shown)
        elif elapsed_s - self._last_line >= PLAIN_LINE_INTERVAL_S or self.done_steps + self._steps >= self.target_steps:
            self._last_line = elapsed_s
            links = ", ".join(f"{link}/{phase} {human_bytes(b)}" for (link, phase), b in sorted(self._sent.items()))
            print(f"[{elapsed_s:6.1f}s] {line}" + (f" | {links}" if self.verbose else ""), flush=True)

    def _read(self, texts: list[str]) -> None:
        self._steps = max(self._steps, int(scrape.total(texts, f"{ENV_STEPS}_total")))
        self._updates = max(self._updates, int(scrape.total(texts, f"{LEARNER_UPDATES}_total")))
        links = scrape.link_counts(texts)
        self._wan = max(self._wan, sum(scrape.wan_by_phase(links).values()))
        for key, value in scrape.sent_bytes(links).items():
            self._sent[key] = max(self._sent.get(key, 0), value)
        episodes = scrape.total(texts, f"{EPISODE_RETURN}_count")
        if episodes > (self._returns[-1]["episodes"] if self._returns else 0):
            self._returns.append({"episodes": episodes, "return_sum": scrape.total(texts, f"{EPISODE_RETURN}_sum")})

    def _links_table(self) -> Table:
        table = Table()
        table.add_column("link")
        table.add_column("phase")
        table.add_column("bytes sent", justify="right")
        for (link, phase), total in sorted(self._sent.items()):
            table.add_row(link, phase, human_bytes(total))
        return table

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
        self.console.print(result_line(summary))
        self.console.print(_process_table(summary["processes"] | {SUPERVISOR: summary["supervisor"]}))
        self.console.print(f"summary written to {path}; plots in {path.with_name('learning.png')}")


def result_line(summary: dict[str, Any]) -> str:
    """What the run reached, beside what it cost: 'return 0.82 (mean of the last 100 episodes) at 20,000 env steps;
    WAN 2.6 MB sent, 130 B/env step (rollout 118, training 12)'."""
    curve = summary["curve"]
    mean, episodes = recent_return(curve)
    steps = int(curve[-1]["env_steps"]) if curve else summary["env_steps"]
    reached = (
        "return - (no episode ended)" if mean is None else f"return {mean:.3g} (mean of the last {episodes} episodes)"
    )
    wan = summary["wan_bytes"]
    segment_steps = summary["env_steps"]
    per_step = f"{sum(wan.values()) / segment_steps:.0f} B/env step" if segment_steps else "- B/env step"
    phases = ", ".join(f"{phase} {sent / segment_steps:.0f}" for phase, sent in wan.items()) if segment_steps else ""
    split = f" ({phases})" if len(wan) > 1 else ""
    return f"{reached} at {steps:,} env steps; WAN {human_bytes(sum(wan.values()))} sent, {per_step}{split}"


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
