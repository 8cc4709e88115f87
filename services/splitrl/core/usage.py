"""What a process has used, read from Linux's /proc: CPU seconds, resident bytes now and at its peak.

The environment reads its env workers' usage this way for its /metrics, and the throughput bench reads
`splitrl up`'s own, which no /metrics reports.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import NamedTuple

from splitrl.core.memory import peak_resident_bytes


class ProcessUsage(NamedTuple):
    """What a process used: CPU seconds (user + system, every thread), resident bytes now, and at its peak."""

    cpu_seconds: float
    resident_bytes: float
    peak_resident_bytes: float


#: What envs stepped in the caller's own process use of their own: nothing.
NO_USAGE = ProcessUsage(0.0, 0.0, 0.0)

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def process_usage(pid: int) -> ProcessUsage | None:
    """The usage of process `pid` so far; None if it is gone (or the system has no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        statm = Path(f"/proc/{pid}/statm").read_text()
    except OSError:
        return None
    peak = peak_resident_bytes(pid)
    if math.isnan(peak):  # it ended between the reads
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) ": field 3 of proc(5) is fields[0]
    return ProcessUsage((int(fields[11]) + int(fields[12])) / _CLOCK_TICKS, int(statm.split()[1]) * _PAGE_BYTES, peak)
