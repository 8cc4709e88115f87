"""splitrl.core.memory: glibc's free heap memory goes back to the system on request."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from splitrl.core.memory import release_free_memory


def resident_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def test_memory_freed_between_kept_buffers_is_given_back():
    """The edge's pattern: each step frees a large buffer (a stack) and keeps a small one (a frame); glibc
    keeps the holes resident until trimmed."""
    if not release_free_memory():
        pytest.skip("no malloc_trim in this C library (not glibc)")
    kept = []
    for _ in range(400):
        transient = torch.ones(300_000, dtype=torch.uint8)  # 300 KB, freed at the next step
        kept.append(torch.ones(70_000, dtype=torch.uint8))  # 70 KB, kept (28 MB in all)
        del transient
    before = resident_mib()
    assert release_free_memory()
    assert resident_mib() < before - 10, f"resident {resident_mib():.0f} MiB after trim, {before:.0f} before"
    assert sum(buffer.numel() for buffer in kept) == 400 * 70_000
