"""The network study's report: a markdown summary, a CSV of every run, and three PNG figures.

`splitrl report RUN_DIR...` and `splitrl bench network` both end here. Figures use
matplotlib's Agg canvas directly (no display, no global pyplot state).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from splitrl.bench.results import PHASES, RESEARCH_BYTES_PER_STEP, Row, RunResult, best_cloud, group_rows
from splitrl.bench.settings import RETURN_TOLERANCE
from splitrl.run.summary import curve_bins, human_bytes

FIGURES = ("wan_bytes_per_step.png", "cumulative_wan_bytes.png", "return_vs_wan_bytes.png", "pareto.png")


def write_report(
    runs: list[RunResult], out: Path, framing: Sequence[str] = (), tolerance: float = RETURN_TOLERANCE
) -> list[Path]:
    """Write report.md, runs.csv and FIGURES into `out`; returns the paths written.

    `framing`: markdown sections of `splitrl bench framing` results, appended to report.md. `tolerance`: how far
    below `cloud frame`'s return a cloud row may end and still count as matched (see results.best_cloud).
    """
    out.mkdir(parents=True, exist_ok=True)
    rows = group_rows(runs)
    (out / "report.md").write_text("\n".join([markdown(rows, tolerance), *framing]))
    write_csv(runs, out / "runs.csv")
    baseline, _ = best_cloud(rows, tolerance)
    _bytes_figure(rows, baseline, out / FIGURES[0])
    _cumulative_figure(rows, out / FIGURES[1])
    _return_figure(rows, out / FIGURES[2])
    _pareto_figure(rows, out / FIGURES[3])
    return [out / "report.md", out / "runs.csv", *(out / name for name in FIGURES)]


def _return_text(row: Row) -> str:
    returns, mean = row.returns, row.mean_return
    if mean is None:
        return "no episodes"
    if len(returns) == 1:
        return f"{mean:+.2f}"
    return f"{mean:+.2f} ({min(returns):+.2f}..{max(returns):+.2f}, {len(returns)} seeds)"


def markdown(rows: list[Row], tolerance: float = RETURN_TOLERANCE) -> str:
    """The research's table shape, measured: per row, WAN numbers and bytes per env step by phase, and return.

    Every row's bytes are compared with the best cloud codec at matched return (results.best_cloud).
    """
    baseline, chosen = best_cloud(rows, tolerance)
    envs = sorted({run.env for row in rows for run in row.runs})
    versus = "vs best cloud" if baseline is None else f"vs `{baseline.name}`"
    lines = [
        f"# Network study: {', '.join(envs)}",
        "",
        "WAN = the `encoder-inference` and `learner-encoder` links. Bytes are serialized protobuf bytes as sent;",
        "numbers are tensor elements (the research's unit). Per env step, mean over seeds. Final return: mean",
        "return of the episodes that ended in the last 20% of each run's env steps. Training / rollout: WAN",
        "training bytes (activations up, gradients down) per WAN rollout byte.",
        "",
        f"Baseline: **{'none' if baseline is None else baseline.name}**, the {chosen}.",
        "",
        "| row | env steps | WAN numbers/step | rollout B/step | training B/step | training / rollout "
        f"| total WAN B/step | {versus} | final return | env steps/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in rows:
        ratio = "" if baseline is None else f"{row.wan_bytes_per_step / baseline.wan_bytes_per_step:.3g}x"
        share = "" if row.training_to_rollout is None else f"{row.training_to_rollout:.0%}"
        lines.append(
            f"| {row.name} | {row.env_steps:,} | {row.wan_numbers_per_step:,.0f} | {row.per_step('rollout'):,.0f} "
            f"| {row.per_step('training'):,.0f} | {share} | {row.wan_bytes_per_step:,.0f} | {ratio} "
            f"| {_return_text(row)} | {row.steps_per_second:,.0f} |"
        )
    lines += [
        "",
        "## Next to the research's own figures (CarRacing 4x96x96, width 4,096, bf16 accounting)",
        "",
        "| row | research B/step (rollout + training) | research bytes at this run's env steps | measured B/step |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, research in RESEARCH_BYTES_PER_STEP.items():
        per_step = sum(research.values())
        match = next((r for r in rows if r.name == name), None)
        measured = f"{match.wan_bytes_per_step:,.0f}" if match else "not run"
        scaled = f"{per_step * match.env_steps / 1e6:,.1f} MB" if match else ""
        lines.append(f"| {name} | {research['rollout']:,.0f} + {research['training']:,.0f} | {scaled} | {measured} |")
    lines += ["", "## Bytes per env step on every link (sent)", ""]
    keys = sorted({key for row in rows for run in row.runs for key in run.link_bytes})
    lines.append("| row | " + " | ".join(f"`{key}`" for key in keys) + " |")
    lines.append("| --- |" + " ---: |" * len(keys))
    for row in rows:
        cells = [
            f"{sum(run.link_bytes.get(key, 0) / max(run.env_steps, 1) for run in row.runs) / len(row.runs):,.0f}"
            for key in keys
        ]
        lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(runs: list[RunResult], path: Path) -> None:
    """One line per run: its configuration, WAN bytes and numbers per phase, every link's bytes, final return."""
    link_keys = sorted({key for run in runs for key in run.link_bytes})
    header = ["row", "mode", "codec", "width", "gradient_codec", "seed", "env", "env_steps", "wall_seconds"]
    header += ["final_return", "final_episodes", "wan_bytes_per_env_step"]
    header += [f"wan_bytes_{phase}" for phase in PHASES] + [f"wan_numbers_{phase}" for phase in PHASES]
    header += [f"bytes:{key}" for key in link_keys]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for run in runs:
            writer.writerow(
                [run.row, run.mode, run.codec, run.width, run.gradient_codec, run.seed, run.env, run.env_steps]
                + [run.wall_seconds, "" if run.final_return is None else run.final_return, run.final_episodes]
                + [round(run.wan_bytes_per_step, 2)]
                + [run.wan_bytes[phase] for phase in PHASES]
                + [run.wan_elements[phase] for phase in PHASES]
                + [run.link_bytes.get(key, 0) for key in link_keys]
            )


def _figure(width: float, height: float) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _colours(rows: list[Row]) -> dict[str, tuple[float, ...]]:
    palette = colormaps["tab10"] if len(rows) <= 10 else colormaps["tab20"]
    return {row.name: palette(i % palette.N) for i, row in enumerate(rows)}


def _bytes_figure(rows: list[Row], baseline: Row | None, out: Path) -> None:
    """Horizontal bars of WAN bytes per env step (log scale), rollout and training stacked, research marked."""
    fig, axes = _figure(11, 1.2 + 0.45 * len(rows))
    positions = np.arange(len(rows))
    rollout = np.array([max(row.per_step("rollout"), 1e-3) for row in rows])
    training = np.array([row.per_step("training") for row in rows])
    axes.barh(positions, rollout, color="tab:blue", label="rollout")
    axes.barh(positions, training, left=rollout, color="tab:orange", label="training")
    for position, row in enumerate(rows):
        axes.text(row.wan_bytes_per_step * 1.1, position, human_bytes(row.wan_bytes_per_step), va="center", fontsize=8)
    top = axes.get_xaxis_transform()  # x in data, y in axes fraction
    for name, research in RESEARCH_BYTES_PER_STEP.items():
        axes.axvline(sum(research.values()), color="grey", linestyle=":", linewidth=1)
        axes.text(sum(research.values()), 0.99, f"research:\n{name} ", fontsize=7, va="top", ha="right", transform=top)
    if baseline is not None:
        axes.axvline(baseline.wan_bytes_per_step, color="tab:red", linestyle="--", label=f"{baseline.name} (baseline)")
    axes.set_yticks(positions, [row.name for row in rows])
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.set_xlim(min(rollout) / 4, max(row.wan_bytes_per_step for row in rows) * 4)  # small parts stay visible
    axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: human_bytes(x)))
    axes.set_xlabel("WAN bytes per env step (log scale)")
    axes.set_title("WAN bytes per env step by mode and codec")
    axes.legend(loc="lower right", fontsize=8)
    fig.savefig(out, dpi=100)


def _cumulative_figure(rows: list[Row], out: Path) -> None:
    fig, axes = _figure(10, 6)
    colours = _colours(rows)
    for row in rows:
        for i, run in enumerate(row.runs):
            points = [(p["env_steps"], p.get("wan_bytes", 0.0)) for p in run.curve if p.get("wan_bytes", 0.0) > 0]
            if points:
                steps, sent = zip(*points, strict=True)
                axes.plot(steps, sent, color=colours[row.name], label=row.name if i == 0 else None)
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FuncFormatter(lambda x, _: human_bytes(x)))
    axes.set_xlabel("env steps")
    axes.set_ylabel("cumulative WAN bytes (log scale)")
    axes.set_title("Cumulative WAN bytes")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    fig.savefig(out, dpi=100)


def _return_figure(rows: list[Row], out: Path) -> None:
    """Mean episode return (binned) against the WAN bytes spent to reach it: the study's trade-off."""
    fig, axes = _figure(10, 6)
    colours = _colours(rows)
    for row in rows:
        for i, run in enumerate(row.runs):
            curve = [p for p in run.curve if "wan_bytes" in p]
            bins = curve_bins(curve)
            if not bins or curve[-1]["wan_bytes"] <= 0:
                continue
            steps = [p["env_steps"] for p in curve]
            sent = np.interp([step for step, _ in bins], steps, [p["wan_bytes"] for p in curve])
            axes.plot(
                np.maximum(sent, 1.0),
                [value for _, value in bins],
                marker=".",
                color=colours[row.name],
                label=row.name if i == 0 else None,
            )
    if not axes.get_legend_handles_labels()[1]:
        axes.text(0.5, 0.5, "no finished episodes", ha="center", va="center", transform=axes.transAxes)
    else:
        axes.set_xscale("log")
        axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: human_bytes(x)))
        axes.legend(fontsize=8)
    axes.set_xlabel("cumulative WAN bytes (log scale)")
    axes.set_ylabel("mean episode return")
    axes.set_title("Return vs WAN bytes spent")
    axes.grid(alpha=0.3)
    fig.savefig(out, dpi=100)


def pareto_front(rows: list[Row]) -> list[Row]:
    """Rows no other row beats on both counts (fewer or equal WAN bytes per step and higher or equal final
    return, one of them strictly), cheapest first; rows without episodes are left out."""
    scored = [row for row in rows if row.mean_return is not None]

    def dominated(row: Row) -> bool:
        return any(
            other.wan_bytes_per_step <= row.wan_bytes_per_step
            and other.mean_return >= row.mean_return  # type: ignore[operator]
            and (other.wan_bytes_per_step, other.mean_return) != (row.wan_bytes_per_step, row.mean_return)
            for other in scored
        )

    return sorted((row for row in scored if not dominated(row)), key=lambda row: row.wan_bytes_per_step)


def _pareto_figure(rows: list[Row], out: Path) -> None:
    """Final return against total WAN bytes per env step, one point per row (bars: seed range), one panel per
    env, with the Pareto front drawn through the rows nothing beats on both."""
    envs = sorted({run.env for row in rows for run in row.runs})
    fig = Figure(figsize=(10, 6 * len(envs)), layout="constrained")
    FigureCanvasAgg(fig)
    for axes, env in zip(np.atleast_1d(fig.subplots(len(envs), 1)), envs, strict=True):
        here = [row for row in rows if any(run.env == env for run in row.runs)]
        for row in here:
            if row.mean_return is None:
                continue
            spread = [[row.mean_return - min(row.returns)], [max(row.returns) - row.mean_return]]
            colour = "tab:blue" if row.is_cloud else "tab:orange"
            axes.errorbar(row.wan_bytes_per_step, row.mean_return, yerr=spread, fmt="o", color=colour, capsize=3)
            axes.annotate(
                row.name,
                (row.wan_bytes_per_step, row.mean_return),
                fontsize=7,
                xytext=(4, 4),
                textcoords="offset points",
            )
        front = pareto_front(here)
        if front:
            axes.step(
                [row.wan_bytes_per_step for row in front],
                [row.mean_return for row in front],
                where="post",
                color="grey",
                linestyle="--",
                label="Pareto front",
            )
            axes.set_xscale("log")
            axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: human_bytes(x)))
            axes.plot([], [], "o", color="tab:blue", label="cloud (observations)")
            axes.plot([], [], "o", color="tab:orange", label="split (activations + gradients)")
            axes.legend(fontsize=8)
        else:
            axes.text(0.5, 0.5, "no finished episodes", ha="center", va="center", transform=axes.transAxes)
        axes.set_xlabel("total WAN bytes per env step (rollout + training, log scale)")
        axes.set_ylabel("final return")
        axes.set_title(f"{env}: return vs WAN bytes per env step")
        axes.grid(alpha=0.3)
    fig.savefig(out, dpi=100)
