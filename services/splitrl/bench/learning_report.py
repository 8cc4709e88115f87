"""The learning bench's report: learning.md (a row per run, its final evaluations, every evaluation, the video
shadow's bytes, the edge's own costs), learning.json and the figure (splitrl.bench.learning_plots)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from splitrl.run.registry import EDGE_SERVICES


def write_learning_report(results: list[dict[str, Any]], out: Path) -> list[Path]:
    """Write learning.md, learning.json and learning.png for `results` (splitrl.bench.learning.summarize_run)."""
    from splitrl.bench.learning_plots import plot_learning

    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "| row | seed | env frames | wall min | WAN bytes | WAN B/frame | train return (last 20%) "
        "| final eval: episodes | mean | IQM | std | sampled: mean | IQM | std |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        argmax, sampled = _last_eval(r, deterministic=True), _last_eval(r, deterministic=False)
        train = "n/a" if r["train_return_last_20pct"] is None else f"{r['train_return_last_20pct']:.1f}"
        episodes = "n/a" if argmax is None else str(argmax["episodes"])
        per_frame = "n/a" if r["wan_bytes_per_frame"] is None else f"{r['wan_bytes_per_frame']:.1f}"
        wan = "n/a (one process)" if r["wan_bytes"] is None else f"{r['wan_bytes']:,.0f}"
        lines.append(
            f"| {r['row']} | {r['seed']} | {r['frames']:,} | {r['wall_seconds'] / 60:.1f} | {wan} "
            f"| {per_frame} | {train} | {episodes} | {_scores(argmax)} | {_scores(sampled)} |"
        )
    lines += evaluation_table_lines(results)
    lines += shadow_table_lines(results)
    lines += edge_cost_table_lines(results)
    (out / "learning.md").write_text("\n".join(lines) + "\n")
    without_curves = [{k: v for k, v in r.items() if k != "curve"} for r in results]
    (out / "learning.json").write_text(json.dumps(without_curves, indent=2))
    return [out / "learning.md", out / "learning.json", plot_learning(results, out / "learning.png")]


def _last_eval(result: dict[str, Any], *, deterministic: bool) -> dict[str, Any] | None:
    played = [e for e in result["evals"] if e["deterministic"] == deterministic]
    return played[-1] if played else None


def _scores(evaluation: dict[str, Any] | None) -> str:
    """mean | IQM | std cells of one evaluation (blank cells without one)."""
    if evaluation is None:
        return "- | - | -"
    return f"{evaluation['mean']:.1f} | {evaluation['iqm']:.1f} | {evaluation['std']:.1f}"


def evaluation_table_lines(results: list[dict[str, Any]]) -> list[str]:
    """Every evaluation of every run, argmax and sampled side by side at each env-frame count (none: no lines)."""
    points: dict[tuple[str, int, int], dict[bool, dict[str, Any]]] = {}
    for r in results:
        for e in r["evals"]:
            points.setdefault((r["row"], r["seed"], e["frames"]), {})[e["deterministic"]] = e
    if not points:
        return []
    lines = [
        "",
        "Every evaluation on unseen episodes: the most likely action (argmax), and the policy sampling its actions; "
        "how many episodes the time limit cut, and how many scored the env's solved return (argmax / sampled; - "
        "where not recorded).",
        "",
        "| row | seed | env frames | episodes | argmax: mean | IQM | std | sampled: mean | IQM | std "
        "| cut by time limit | at solved score |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (row, seed, frames), played in points.items():
        episodes = next(iter(played.values()))["episodes"]
        argmax, sampled = played.get(True), played.get(False)
        lines.append(
            f"| {row} | {seed} | {int(frames):,} | {episodes} | {_scores(argmax)} | {_scores(sampled)} "
            f"| {_counts(argmax, sampled, 'out_of_time')} | {_counts(argmax, sampled, 'at_threshold')} |"
        )
    return lines


def _counts(argmax: dict[str, Any] | None, sampled: dict[str, Any] | None, key: str) -> str:
    """ "argmax / sampled" episode counts under `key` of two evaluations ("-" for one without it)."""
    return " / ".join("-" if e is None or e.get(key) is None else str(e[key]) for e in (argmax, sampled))


def shadow_table_lines(results: list[dict[str, Any]]) -> list[str]:
    """The table of the runs that carry a video shadow (none: no lines)."""
    shadowed = [r for r in results if r.get("last_segment_shadow")]
    if not shadowed:
        return []
    lines = [
        "",
        "Split runs with `--video-shadow`, last segment: the split's WAN bytes per agent step beside cloud mode's "
        "over H.264 for the same frames (the edge encodes them as cloud would and counts, sending nothing).",
        "",
        "| row | seed | agent steps | split WAN B/step | cloud H.264 B/step, same frames | split / cloud |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in shadowed:
        shadow = r["last_segment_shadow"]
        lines.append(
            f"| {r['row']} | {r['seed']} | {shadow['env_steps']:,} | {shadow['split_wan_bytes_per_env_step']:.1f} "
            f"| {shadow['cloud_h264_wan_bytes_per_env_step']:.1f} | {shadow['split_share']:.3f} |"
        )
    return lines


def edge_cost_table_lines(results: list[dict[str, Any]]) -> list[str]:
    """What the edge device paid besides WAN bytes, per run recorded with it (none: no lines)."""
    costed = [r for r in results if r.get("last_segment_edge_costs")]
    if not costed:
        return []
    lines = [
        "",
        "The edge's own costs in each run's last segment (services start afresh with each segment): CPU ms per "
        "agent step (start-up included), resident MiB at the end and at its peak.",
        "",
        "| row | seed | " + " | ".join(f"{name}: CPU ms/step | MiB | peak MiB" for name in EDGE_SERVICES) + " |",
        "| --- | ---: |" + " ---: | ---: | ---: |" * len(EDGE_SERVICES),
    ]
    for r in costed:
        cells = [_cost_cells(r["last_segment_edge_costs"].get(name)) for name in EDGE_SERVICES]
        lines.append(f"| {r['row']} | {r['seed']} | " + " | ".join(cells) + " |")
    return lines


def _cost_cells(cost: dict[str, Any] | None) -> str:
    """CPU ms/step | MiB | peak MiB of one process ("-" where not recorded)."""
    if cost is None:
        return "- | - | -"
    cpu, peak = cost.get("cpu_ms_per_env_step"), cost.get("peak_resident_mib")
    cpu_cell = "-" if cpu is None else f"{cpu:.2f}"
    peak_cell = "-" if peak is None else f"{peak:.0f}"
    return f"{cpu_cell} | {cost['resident_mib']:.0f} | {peak_cell}"
