"""The learning bench's figure: return vs env frames, and vs cumulative WAN bytes, per row and seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from splitrl.run.summary import curve_bins

#: Evaluation markers, one per seed (matplotlib marker codes).
SEED_MARKERS = "Dos^v"


def plot_learning(results: list[dict[str, Any]], out: Path) -> Path:
    """Lines: training return (bins of finished episodes); markers: evaluations (mean +- std) on unseen
    episodes, filled for the most likely action, hollow for sampled actions. One colour per row, one marker
    shape per seed (each seed is its own line); the legend, below the panels, names each row once. Rows
    without WAN bytes (a one-process reference peer) are left out of the bytes panel."""
    fig = Figure(figsize=(14, 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    by_frames, by_bytes = fig.subplots(1, 2, sharey=True)
    colours = {row: f"C{i}" for i, row in enumerate(dict.fromkeys(r["row"] for r in results))}
    seeds = sorted({r["seed"] for r in results})
    labelled: set[str] = set()
    for r in results:
        repeat, curve, colour = r["action_repeat"], r["curve"], colours[r["row"]]
        bins = curve_bins(curve)
        wan_at = _wan_bytes_at(curve)
        label = r["row"] if r["row"] not in labelled else None
        labelled.add(r["row"])
        if bins:
            steps, returns = zip(*bins, strict=True)
            frames = [s * repeat for s in steps]
            by_frames.plot(frames, returns, color=colour, alpha=0.5, lw=1, label=label)
            if r["wan_bytes"] is not None:
                by_bytes.plot([wan_at(s) for s in steps], returns, color=colour, alpha=0.5, lw=1)
        marker = SEED_MARKERS[seeds.index(r["seed"]) % len(SEED_MARKERS)]
        for deterministic in (True, False):  # argmax filled, sampled hollow
            evals = [e for e in r["evals"] if e["deterministic"] == deterministic]
            if not evals:
                continue
            means, stds = [e["mean"] for e in evals], [e["std"] for e in evals]
            style = {"yerr": stds, "fmt": marker, "color": colour, "capsize": 3}
            if not deterministic:
                style["mfc"] = "none"
            by_frames.errorbar([e["frames"] for e in evals], means, **style)
            if r["wan_bytes"] is not None:
                by_bytes.errorbar([wan_at(e["env_steps"]) for e in evals], means, **style)
    by_frames.set_xlabel("env frames")
    by_frames.set_ylabel("episode return")
    by_frames.set_title("Return vs env frames")
    by_bytes.set_xlabel("cumulative WAN bytes (log)")
    by_bytes.set_xscale("log")
    by_bytes.set_title("Return vs WAN bytes sent")
    for axes in (by_frames, by_bytes):
        axes.grid(alpha=0.3)
    if results:
        shapes = ", ".join(f"{SEED_MARKERS[i % len(SEED_MARKERS)]} seed {seed}" for i, seed in enumerate(seeds))
        fig.legend(
            loc="outside lower center",
            ncols=min(4, len(colours)),
            fontsize=8,
            title=f"lines: training return; markers: evaluations, mean ± std, filled argmax, hollow sampled ({shapes})",
            title_fontsize=8,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def _wan_bytes_at(curve: list[dict[str, float]]) -> Any:
    """env step -> cumulative WAN bytes at the first curve point at or after it (the last point past the end)."""

    def at(step: float) -> float:
        for point in curve:
            if point["env_steps"] >= step:
                return max(point["wan_bytes"], 1.0)
        return max(curve[-1]["wan_bytes"], 1.0) if curve else 1.0

    return at
