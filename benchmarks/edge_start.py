"""Benchmark (not a test): seconds from starting a split edge-encoder to its port being open, per checkout.

    python benchmarks/edge_start.py --runs 3 /path/to/old/checkout /path/to/new/checkout

Each run execs `splitrl serve edge-encoder --mode split` (width 32, plaintext, a fresh checkpoint directory;
the learner and inference addresses it dials are loopback port 1, where nothing listens) with PYTHONPATH
set to CHECKOUT/services, waits for the port file the service writes once it serves (`splitrl up`'s own
wait, run.launcher.wait_ready), and stops it. Checkouts
alternate run by run, so a busy machine slows each about equally. Issue 18 asks that a killed service serve
again within 5 s; the edge builds its encoder and optimizer before it serves, so what those import counts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from splitrl.run.launcher import Child, wait_ready


def seconds_to_serve(checkout: Path, timeout_s: float = 60.0) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch)
        port_file = run_dir / "ports.json"
        command = [sys.executable, "-m", "splitrl.cli.main", "serve", "edge-encoder", "--tls", "plaintext"]
        command += ["--mode", "split", "--width", "32", "--bottleneck", "layernorm", "--checkpoint-dir", scratch]
        command += ["--learner-address", "127.0.0.1:1", "--inference-address", "127.0.0.1:1"]
        command += ["--port", "0", "--metrics-port", "0", "--port-file", str(port_file)]
        env = {**os.environ, "PYTHONPATH": str(checkout / "services")}
        (run_dir / "logs").mkdir()
        started = time.monotonic()
        with (run_dir / "logs" / "edge-encoder.log").open("wb") as log:  # where wait_ready quotes it from
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(Child("edge-encoder", process, port_file), run_dir, timeout_s)
            return time.monotonic() - started
        finally:
            process.terminate()
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkouts", nargs="+", type=Path, help="repository roots to compare (each has services/)")
    parser.add_argument("--runs", type=int, default=3, help="starts per checkout (default 3)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    for checkout in args.checkouts:
        if not (checkout / "services" / "splitrl").is_dir():
            parser.error(f"{checkout} has no services/splitrl: not a splitrl checkout")
    seconds: dict[Path, list[float]] = {checkout: [] for checkout in args.checkouts}
    for _ in range(args.runs):
        for checkout in args.checkouts:
            seconds[checkout].append(seconds_to_serve(checkout))
    for checkout, runs in seconds.items():
        shown = ", ".join(f"{s:.2f}" for s in runs)
        print(f"{checkout}: median {statistics.median(runs):.2f} s to serve ({shown})")


if __name__ == "__main__":
    main()
