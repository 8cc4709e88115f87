"""Sampling profiles of running services (py-spy), for `splitrl bench throughput --profile-s N`.

py-spy samples a process's Python stacks from outside (ptrace: root, or CAP_SYS_PTRACE in a container) without
slowing it down much (`--nonblocking`: the target is never paused). Each service of a stack run is sampled for
the same seconds at once; a profile keeps, per service, the functions the samples were in (self) and the share
of samples spent waiting for I/O (the event loop's select and idle worker threads), so "where the remaining
time goes" is read per service next to the hop latencies.

py-spy samples only threads the OS reports running (no `--idle`: with it, every idle gRPC pool thread would add
a sample per tick and the shares would count threads, not time). A service that waited through the whole
window (replay, between updates) therefore has few samples or none: zero samples is a measurement, not a
failure, and its waiting share is reported as 0.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

#: Samples per second per process.
SAMPLE_RATE_HZ = 100
#: Frames (py-spy's "function (file)") in which a sampled thread runs no Python of its own: the event loop in
#: select(), and threads whose Python is only their run loop (gRPC's pollers, idle thread-pool workers).
WAITING = (
    "Selector.select (selectors.py)",
    "Thread.run (threading.py)",
    "_worker (concurrent/futures/thread.py)",
    "Condition.wait (threading.py)",
)
#: Functions listed per service.
TOP = 8


@dataclass(frozen=True)
class ServiceProfile:
    """One process's samples: `samples` stacks of its running threads in all (0 if it waited throughout),
    `waiting_share` of them waiting (see WAITING; 0.0 without samples), and the `top` other functions by the
    share of samples they were running in themselves (self time), busiest first."""

    samples: int
    waiting_share: float
    top: list[tuple[str, float]] = field(default_factory=list)


def py_spy() -> str | None:
    """The py-spy executable (beside this interpreter, or on PATH), None if it is not installed."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def record(pids: dict[str, int], seconds: float, out_dir: Path) -> dict[str, ServiceProfile]:
    """Sample each process of `pids` (name -> pid) for `seconds`, all at once; raw stacks are kept as
    out_dir/profile-NAME.txt. A process py-spy could not sample (gone, or no ptrace rights) is left out, with
    py-spy's message in out_dir/profile-NAME.log."""
    executable = py_spy()
    if executable is None:
        raise RuntimeError("py-spy is not installed: pip install py-spy (in the dev extra)")
    out_dir.mkdir(parents=True, exist_ok=True)
    running = {}
    for name, pid in pids.items():
        command = [executable, "record", "--pid", str(pid), "--duration", f"{max(1, round(seconds))}"]
        command += ["--rate", str(SAMPLE_RATE_HZ), "--format", "raw", "--nonblocking"]
        command += ["--output", str(out_dir / f"profile-{name}.txt")]
        log = (out_dir / f"profile-{name}.log").open("w")
        running[name] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log)
    profiles = {}
    for name, (process, log) in running.items():
        process.wait(timeout=seconds + 60)
        log.close()
        raw = out_dir / f"profile-{name}.txt"
        if process.returncode == 0 and raw.exists():
            profiles[name] = parse_raw(raw.read_text())
    return profiles


def parse_raw(text: str) -> ServiceProfile:
    """A ServiceProfile from py-spy's raw format: one line per distinct stack, "frame;frame;...;leaf COUNT",
    each frame "function (file:line)"; functions are counted without their line."""
    leaves: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        function, _, where = leaf.partition(" (")
        leaves[f"{function} ({where.rsplit(':', 1)[0]})" if where else function] += int(count)
    samples = sum(leaves.values())
    waiting = sum(n for leaf, n in leaves.items() if leaf.endswith(WAITING))
    busy = Counter({leaf: n for leaf, n in leaves.items() if not leaf.endswith(WAITING)})
    return ServiceProfile(
        samples=samples,
        waiting_share=waiting / samples if samples else 0.0,
        top=[(leaf, n / samples) for leaf, n in busy.most_common(TOP)],
    )
