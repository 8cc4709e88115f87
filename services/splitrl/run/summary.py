"""A run's summary: curve points from the services' counters, the summary.json `splitrl up` writes, and the
readings of a curve (bins, windows) that plots, reports and tests share.

A curve point holds cumulative counters at one moment (env_steps, episodes, return_sum, updates, wan_bytes,
seconds) and when the learner completed the last of those updates (last_update_at, unix seconds); consecutive
points give the mean return of each interval.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from splitrl.core import scrape
from splitrl.core.metrics import ENV_STEPS, EPISODE_RETURN, LEARNER_LAST_UPDATE, LEARNER_UPDATES, VIDEO_SHADOW_BYTES
from splitrl.core.usage import process_usage
from splitrl.run import files
from splitrl.run.launcher import Supervisor
from splitrl.run.settings import RunSettings

MAX_EPISODES_PER_BIN = 20
#: The name the run's own process (its `supervisor` entry) goes by in tables beside the services.
SUPERVISOR = "splitrl up"


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


#: How a curve point reaches RUN_DIR/curve.jsonl: files.append_curve, or a wrapper that survives a full disk.
SaveCurve = Callable[[Path, dict[str, float]], object]


def extend_curve(
    curve: list[dict[str, float]], point: dict[str, float], run_dir: Path, save: SaveCurve = files.append_curve
) -> bool:
    """Append `point` (and `save` it to RUN_DIR/curve.jsonl) unless a counter went backwards: a service that just
    exited took its series with it. Returns whether it was appended.

    return_sum is not checked: negative returns make it fall.
    """
    if not curve or all(point[key] >= curve[-1][key] for key in ("env_steps", "episodes", "updates", "wan_bytes")):
        curve.append(point)
        save(run_dir, point)
        return True
    return False


def curve_point(texts: list[str]) -> dict[str, float]:
    """Cumulative counters at one moment; consecutive points give the mean return of each interval.

    `wan_bytes` is every byte sent on a WAN link so far (each direction counted once, by its sender).
    `last_update_at` is not a counter: the unix time at which the learner completed the last of `updates`
    (0 before the first), so updates/s can be timed by the learner's clock rather than by when points are taken.
    """
    wan = sum(scrape.wan_by_phase(scrape.link_counts(texts)).values())
    return {
        "env_steps": scrape.total(texts, f"{ENV_STEPS}_total"),
        "episodes": scrape.total(texts, f"{EPISODE_RETURN}_count"),
        "return_sum": scrape.total(texts, f"{EPISODE_RETURN}_sum"),
        "updates": scrape.total(texts, f"{LEARNER_UPDATES}_total"),
        "wan_bytes": float(wan),
        "last_update_at": scrape.largest(texts, LEARNER_LAST_UPDATE),
    }


def shutdown_texts_by_service(run_dir: Path) -> dict[str, str]:
    """The final /metrics each service wrote on shutdown, by service instance name."""
    return {path.stem: path.read_text() for path in sorted((run_dir / "metrics").glob("*.prom"))}


def shutdown_texts(run_dir: Path) -> list[str]:
    """The final /metrics each service wrote on shutdown."""
    return list(shutdown_texts_by_service(run_dir).values())


def process_costs(
    texts_by_service: dict[str, str], retired: dict[str, list[str]], env_steps: int
) -> dict[str, dict[str, float | None]]:
    """Each service's CPU and memory over this segment, its env workers included (scrape.ProcessCost): CPU
    seconds and milliseconds per env step, resident MiB at the end and peak resident MiB. `texts_by_service`:
    each service's final /metrics; `retired`: the last /metrics of each earlier life of a service that was
    restarted, whose CPU counts too and whose peak may be the highest. None for what was not measured. The
    edge's real costs, beside the WAN bytes."""
    costs: dict[str, dict[str, float | None]] = {}
    for name, text in texts_by_service.items():
        lives = [scrape.process_cost(earlier) for earlier in retired.get(name, [])] + [scrape.process_cost(text)]
        peak = max((life.peak_resident_bytes for life in lives), key=lambda v: -math.inf if math.isnan(v) else v)
        costs[name] = _cost(sum(life.cpu_seconds for life in lives), lives[-1].resident_bytes, peak, env_steps)
    return costs


def supervisor_cost(env_steps: int) -> dict[str, float | None]:
    """What this `splitrl up` process has used so far, as `process_costs` gives a service's: it scrapes every
    service for progress, the curve and TensorBoard, and shares the machine with them. None for what was not
    measured (no /proc)."""
    usage = process_usage(os.getpid())
    if usage is None:
        return _cost(math.nan, math.nan, math.nan, env_steps)
    return _cost(usage.cpu_seconds, usage.resident_bytes, usage.peak_resident_bytes, env_steps)


def _cost(cpu_seconds: float, resident_bytes: float, peak_bytes: float, env_steps: int) -> dict[str, float | None]:
    def known(value: float, scale: float, digits: int) -> float | None:
        return None if math.isnan(value) else round(value / scale, digits)

    return {
        "cpu_seconds": known(cpu_seconds, 1, 3),
        "cpu_ms_per_env_step": known(cpu_seconds, env_steps / 1000, 4) if env_steps else None,
        "resident_mib": known(resident_bytes, 2**20, 1),
        "peak_resident_mib": known(peak_bytes, 2**20, 1),
    }


def build_summary(
    settings: RunSettings,
    run_dir: Path,
    supervisor: Supervisor,
    elapsed_s: float,
    interrupted: bool,
    curve: list[dict[str, float]],
    offset: dict[str, float] | None = None,
    save_curve: SaveCurve = files.append_curve,
) -> dict[str, Any]:
    """The run summary: settings, env steps, bytes / messages / elements per link, phase and payload, and each
    service's CPU and memory (`processes`), and this process's own (`supervisor`).

    Counters are this segment's (services that died and were restarted included: `restarts` counts them);
    `resumed_at` is the curve point earlier segments of a resumed run ended at
    (zeros for a fresh run). Its `curve` is the whole run's, cumulative, ended with a point from the final
    counters; each point's `seconds` count service-serving time over all segments.
    """
    offset = offset or files.zero_point()
    final_texts = shutdown_texts_by_service(run_dir)
    for name, text in supervisor.last_texts().items():  # no final metrics file (a crash, a full disk): its last
        final_texts.setdefault(name, text)  # scrape, so the summary still counts what it did
    texts = list(final_texts.values()) + supervisor.retired_texts()  # a restarted service's earlier counters too
    final = curve_point(texts) | {"seconds": round(elapsed_s, 3)}
    extend_curve(curve, files.shifted(final, offset), run_dir, save_curve)
    steps = int(scrape.total(texts, f"{ENV_STEPS}_total"))
    links = scrape.link_counts(texts)
    wan_bytes = scrape.wan_by_phase(links)
    episodes = int(scrape.total(texts, f"{EPISODE_RETURN}_count"))
    return_sum = scrape.total(texts, f"{EPISODE_RETURN}_sum")
    return {
        "settings": json.loads(settings.model_dump_json()),
        "interrupted": interrupted,
        "resumed_at": offset,
        "exit_codes": {name: child.process.returncode for name, child in supervisor.children.items()},
        "restarts": dict(supervisor.restarts),
        "env_steps": steps,
        "wall_seconds": round(elapsed_s, 3),
        "env_steps_per_second": round(steps / elapsed_s, 1) if elapsed_s > 0 else None,
        "episodes": episodes,
        "mean_episode_return": return_sum / episodes if episodes else None,
        "learner_updates": int(scrape.total(texts, f"{LEARNER_UPDATES}_total")),
        "wan_bytes": wan_bytes,
        "wan_bytes_per_env_step": {phase: b / steps for phase, b in wan_bytes.items()} if steps else {},
        "links": links,
        "cloud_h264_shadow": cloud_h264_shadow(texts, links, steps),
        "processes": process_costs(final_texts, {name: supervisor.retired_texts(name) for name in final_texts}, steps),
        "supervisor": supervisor_cost(steps),
        "curve": curve,
    }


def cloud_h264_shadow(texts: list[str], links: dict[str, Any], steps: int) -> dict[str, float] | None:
    """A split run with --video-shadow: cloud mode's WAN bytes over H.264 for the same driving (its ActRequests,
    counted on the edge, plus the actions inference sent back, which cloud sends alike), and the split's WAN
    bytes as a share of them. None for a run without a shadow."""
    shadow_requests = scrape.total(texts, f"{VIDEO_SHADOW_BYTES}_total")
    if not shadow_requests or not steps:
        return None
    actions = links.get("encoder-inference", {}).get("rollout", {}).get("action", {}).get("sent", {}).get("bytes", 0)
    cloud = shadow_requests + actions
    return {
        "wan_bytes": cloud,
        "wan_bytes_per_env_step": cloud / steps,
        "split_share": sum(scrape.wan_by_phase(links).values()) / cloud,
    }


def curve_bins(curve: list[dict[str, float]]) -> list[tuple[float, float]]:
    """(env step at the bin's end, mean return of the episodes finished in the bin), from cumulative samples.

    Consecutive samples merge until a bin holds enough episodes: 20, or a fifth of all for short runs;
    a short remainder joins the last bin.
    """
    total = curve[-1]["episodes"] if curve else 0
    needed = max(1.0, min(MAX_EPISODES_PER_BIN, total // 5))
    ends: list[dict[str, float]] = []
    start = {"episodes": 0.0}
    for point in curve:
        if point["episodes"] - start["episodes"] >= needed:
            ends.append(point)
            start = point
    if ends and curve[-1]["episodes"] > ends[-1]["episodes"]:
        ends[-1] = curve[-1]
    starts = [{"episodes": 0.0, "return_sum": 0.0}, *ends]
    return [
        (end["env_steps"], (end["return_sum"] - start["return_sum"]) / (end["episodes"] - start["episodes"]))
        for start, end in zip(starts, ends, strict=False)
    ]


def mean_return_between(curve: list[dict[str, float]], first: float, last: float) -> tuple[float | None, int]:
    """(mean return, episodes) of the episodes finished between env steps `first` and `last` of a run's curve.

    The window runs from the first sample at or after `first` to the last at or before `last`; the mean is
    None when no episode finished in it.
    """
    inside = [point for point in curve if first <= point["env_steps"] <= last]
    if len(inside) < 2:
        return None, 0
    episodes = int(inside[-1]["episodes"] - inside[0]["episodes"])
    if episodes == 0:
        return None, 0
    return (inside[-1]["return_sum"] - inside[0]["return_sum"]) / episodes, episodes


#: Episodes the recent mean return is taken over (Stable-Baselines3's ep_rew_mean window).
RECENT_EPISODES = 100


def recent_return(points: list[dict[str, float]], episodes: int = RECENT_EPISODES) -> tuple[float | None, int]:
    """(mean return, episodes) of the last `episodes` or more episodes finished by the last of `points`
    (cumulative `episodes` and `return_sum`, oldest first): from the newest point at least `episodes` episodes
    before it, else from the start. None when no episode finished. Points are as often as counters are read, so
    the window holds whole reads: a few episodes more than `episodes` where many finish between reads."""
    if not points or not points[-1]["episodes"]:
        return None, 0
    last = points[-1]
    start = {"episodes": 0.0, "return_sum": 0.0}
    for point in reversed(points):
        if last["episodes"] - point["episodes"] >= episodes:
            start = point
            break
    count = int(last["episodes"] - start["episodes"])
    return (last["return_sum"] - start["return_sum"]) / count, count
