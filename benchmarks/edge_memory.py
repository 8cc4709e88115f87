"""Benchmark (not a test): the split edge-encoder's resident memory through a `splitrl up` run, per checkout.

    python benchmarks/edge_memory.py --runs 2 /path/to/old/checkout /path/to/new/checkout
    python benchmarks/edge_memory.py --runs 3 --also-with "--encoder-precision bfloat16" .

Each run is `splitrl up` at the CarRacing recipe's split (configs/carracing.yaml with the flags of README's
split rows, `--steps` agent steps, 8,000 by default), with PYTHONPATH set to CHECKOUT/services, from inside
CHECKOUT. Every 2 s it reads the edge-encoder's /proc/PID/status (VmRSS, VmHWM) and /proc/PID/smaps
(resident MiB of the heap, of other anonymous mappings and of file-backed ones). Printed per run: the median,
min and max of VmRSS over the run's second half, the peak (VmHWM), the last reading, and the three parts'
medians. Checkouts alternate run by run; with `--also-with FLAGS` each checkout also runs with those flags
added, in turn with its plain run. Issue 18 asks ≤ 300 MB for the edge-encoder.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPLIT_FLAGS = [
    "--config", "configs/carracing.yaml", "--mode", "split", "--width", "32", "--bottleneck", "layernorm",
    "--encoder-epochs", "1", "--encoder-fraction", "0.5", "--activation-codec", "int4+zstd",
    "--gradient-codec", "int4+zstd",
]  # fmt: skip


def status_mib(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of `pid` in MiB; None once it is gone or a zombie."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    fields = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in lines if line.startswith("Vm")}
    return (fields["VmRSS"], fields["VmHWM"]) if "VmRSS" in fields else None


def parts_mib(pid: int) -> tuple[float, float, float] | None:
    """Resident MiB of `pid`'s heap, its other anonymous mappings and its file-backed ones (/proc/PID/smaps)."""
    parts = {"heap": 0, "anonymous": 0, "file": 0}
    mapping = "anonymous"
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                words = line.split()
                if words[0] == "Rss:":
                    parts[mapping] += int(words[1])
                elif not words[0].endswith(":"):  # a mapping's header: range perms offset dev inode [path]
                    path = words[5] if len(words) > 5 else ""
                    mapping = "heap" if path == "[heap]" else "file" if path.startswith("/") else "anonymous"
    except OSError:
        return None
    return parts["heap"] / 1024, parts["anonymous"] / 1024, parts["file"] / 1024


def measure(checkout: Path, steps: int, extra_flags: list[str]) -> str:
    """One `splitrl up` run from `checkout` with `extra_flags` after the split's; one line of figures."""
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch) / "run"
        command = [sys.executable, "-m", "splitrl.cli.main", "up", *SPLIT_FLAGS, *extra_flags, "--steps", str(steps)]
        env = {**os.environ, "PYTHONPATH": str(checkout / "services")}
        with (Path(scratch) / "up.log").open("wb") as log:
            up = subprocess.Popen(
                [*command, "--run-dir", str(run_dir)], cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        port_file = run_dir / "edge-encoder.ports.json"
        rss: list[float] = []
        parts: list[tuple[float, float, float]] = []
        peak, pid = 0.0, None
        while up.poll() is None:
            time.sleep(2)
            if pid is None and port_file.exists():
                pid = int(json.loads(port_file.read_text())["pid"])
            status = status_mib(pid) if pid is not None else None
            smaps = parts_mib(pid) if pid is not None else None
            if status is None or smaps is None:
                continue
            rss.append(status[0])
            peak = max(peak, status[1])
            parts.append(smaps)
        if up.returncode != 0 or not rss:
            raise SystemExit(f"{checkout}: splitrl up exited {up.returncode} after {len(rss)} readings")
    half, half_parts = rss[len(rss) // 2 :], parts[len(parts) // 2 :]
    heap, anonymous, filed = (statistics.median(part[i] for part in half_parts) for i in range(3))
    return (
        f"{' '.join([str(checkout), *extra_flags])}: VmRSS second half median {statistics.median(half):.0f}, "
        f"min {min(half):.0f}, max {max(half):.0f}; peak {peak:.0f}; last {rss[-1]:.0f} MiB; medians: heap {heap:.0f}, "
        f"other anonymous {anonymous:.0f}, file-backed {filed:.0f} MiB ({len(rss)} readings)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkouts", nargs="+", type=Path, help="repository roots to compare (each has services/)")
    parser.add_argument("--runs", type=int, default=2, help="runs per checkout (default 2)")
    parser.add_argument("--steps", type=int, default=8000, help="agent steps per run (default 8,000)")
    parser.add_argument(
        "--also-with",
        default="",
        metavar="FLAGS",
        help='run each checkout with these `splitrl up` flags too, e.g. "--encoder-precision bfloat16" (a single '
        "flag with no space: --also-with=--encoder-precision=bfloat16)",
    )
    args = parser.parse_args()
    if args.runs < 1 or args.steps < 1:
        parser.error(f"--runs and --steps must be >= 1, got {args.runs} and {args.steps}")
    for checkout in args.checkouts:
        if not (checkout / "services" / "splitrl").is_dir():
            parser.error(f"{checkout} has no services/splitrl: not a splitrl checkout")
    variants = [[]] + ([shlex.split(args.also_with)] if args.also_with else [])
    for _ in range(args.runs):
        for checkout in args.checkouts:
            for extra_flags in variants:
                print(measure(checkout.resolve(), args.steps, extra_flags), flush=True)


if __name__ == "__main__":
    main()
