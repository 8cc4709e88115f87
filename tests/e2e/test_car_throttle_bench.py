"""benchmarks/car_throttle.py: the car's speed from a standstill on gymnasium's discrete gas and on full throttle."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "car_throttle.py"


@pytest.mark.timeout(120)
def test_full_throttle_gets_the_car_going_faster_than_discrete_gas() -> None:
    measured = subprocess.run(
        [sys.executable, str(SCRIPT), "--tracks", "1", "--frames", "50"], capture_output=True, text=True, timeout=100
    )
    assert measured.returncode == 0, measured.stdout + measured.stderr
    header, _, gas, throttle = measured.stdout.splitlines()
    assert header.split(" | ")[1:] == ["speed at frame 10", "speed at frame 25", "speed at frame 50 |"], header
    gas_speeds = [float(cell) for cell in gas.strip("| ").split(" | ")[1:]]
    throttle_speeds = [float(cell) for cell in throttle.strip("| ").split(" | ")[1:]]
    assert gas.startswith("| discrete gas (0.2) |") and throttle.startswith("| full throttle (1.0) |")
    assert gas_speeds[0] > 0 and all(a < b for a, b in itertools.pairwise(gas_speeds))
    assert throttle_speeds[-1] > 1.3 * gas_speeds[-1], measured.stdout
