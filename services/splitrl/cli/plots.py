"""A run at a glance: learning curve and bytes per link, drawn from `summary.json` into one PNG.

Uses matplotlib's Agg canvas directly (no pyplot), so it needs no display and keeps no global figure state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from splitrl.core import scrape
from splitrl.core.metrics import WAN_LINKS
from splitrl.run.summary import curve_bins, human_bytes

WAN_COLOUR, LOCAL_COLOUR = "tab:red", "tab:blue"


def plot_run(summary: dict[str, Any], out: Path, evaluations: Sequence[dict[str, Any]] = ()) -> Path:
    """Write a PNG of `summary` (as `splitrl up` writes it) to `out`: returns `out`.

    Left: mean episode return vs env steps, with cumulative learner updates on a second axis, and the
    `evaluations` of `splitrl eval` (mean +- std over unseen episodes) at the env steps they were taken.
    Right: bytes sent per (link, phase), log scale, WAN links in red, each bar annotated with bytes per env step.
    """
    settings = summary.get("settings") or {}
    fig = Figure(figsize=(15, 6), layout="constrained")
    FigureCanvasAgg(fig)
    curve_axes, bytes_axes = fig.subplots(1, 2, width_ratios=(1, 1.2))
    _draw_curve(curve_axes, summary.get("curve") or [], evaluations)
    _draw_bytes(bytes_axes, summary.get("links") or {}, summary.get("env_steps") or 0)
    fig.suptitle(
        f"{settings.get('mode', '?')} on {settings.get('env', '?')}: {int(summary.get('env_steps') or 0):,} env steps, "
        f"{int(summary.get('episodes') or 0):,} episodes, {summary.get('wall_seconds') or 0:.0f} s"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def _say(axes: Axes, message: str) -> None:
    """An empty panel with `message` in its middle (no meaningless 0..1 ticks)."""
    axes.set_xticks([])
    axes.set_yticks([])
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes, fontsize=12)


def _draw_curve(axes: Axes, curve: list[dict[str, float]], evaluations: Sequence[dict[str, Any]]) -> None:
    axes.set_title("Learning curve")
    axes.set_xlabel("env steps")
    bins = curve_bins(curve)
    if not bins:
        _say(axes, "no finished episodes")
        return
    steps, returns = zip(*bins, strict=True)
    (line,) = axes.plot(steps, returns, marker="o", color="tab:green", label="mean episode return (per bin)")
    handles: list[Any] = [line]
    placed = [e for e in evaluations if e.get("env_steps") is not None]
    if placed:
        handles.append(
            axes.errorbar(
                [e["env_steps"] for e in placed],
                [e["mean"] for e in placed],
                yerr=[e["std"] for e in placed],
                fmt="D",
                color="black",
                capsize=4,
                label="evaluation: mean +- std over unseen episodes",
            )
        )
    axes.set_ylabel("mean episode return")
    axes.set_xlim(left=0)
    axes.grid(alpha=0.3)
    updates = axes.twinx()
    (stairs,) = updates.step(
        [p["env_steps"] for p in curve], [p["updates"] for p in curve], where="post", color="grey", alpha=0.6
    )
    stairs.set_label("learner updates (cumulative, right axis)")
    updates.set_ylabel("learner updates (cumulative)", color="grey")
    updates.set_ylim(bottom=0)
    axes.legend(handles=[*handles, stairs], loc="upper left")


def _draw_bytes(axes: Axes, links: dict[str, Any], env_steps: float) -> None:
    """Horizontal bars of bytes sent per (link, phase), summed over payloads; each end counts, so only 'sent'."""
    axes.set_title("Bytes sent per link and phase")
    bars = sorted((key, sent) for key, sent in scrape.sent_bytes(links).items() if sent > 0)
    if not bars:
        _say(axes, "no link traffic")
        return
    labels = [f"{link} / {phase}" for (link, phase), _ in bars]
    sizes = [sent for _, sent in bars]
    colours = [WAN_COLOUR if link in WAN_LINKS else LOCAL_COLOUR for (link, _), _ in bars]
    rows = range(len(bars))
    axes.barh(rows, sizes, color=colours)
    axes.set_yticks(rows, labels)
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.set_xlim(min(sizes) / 2, max(sizes) * 60)  # room on the right for the annotations
    axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: human_bytes(x)))
    axes.set_xlabel("bytes sent (log scale)")
    for row, size in zip(rows, sizes, strict=True):
        per_step = f" ({human_bytes(size / env_steps)}/step)" if env_steps else ""
        axes.text(size * 1.15, row, f"{human_bytes(size)}{per_step}", va="center", fontsize=8)
    axes.legend(
        handles=[Patch(color=WAN_COLOUR, label="WAN (edge <-> cloud)"), Patch(color=LOCAL_COLOUR, label="local")],
        loc="best",
    )
