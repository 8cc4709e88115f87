"""Giving the C heap's free memory back to the system, for processes whose resident size is a cost (the edge).

glibc keeps memory that Python and torch free (a training step's inputs, activations and gradients, the
stacks each env step builds) inside its heap for reuse, and resident-size accounting counts it. On the
edge's CarRacing split that was 100-140 MB over a ~380 MB process (docs/throughput/carracing-edge-memory).
`malloc_trim(0)` hands it back; it takes ~2 ms over such a heap, so it is called after events that free a
lot (an encoder optimizer step), never per env step. Returning every free at once instead
(`MALLOC_MMAP_THRESHOLD_`) cost the edge 40-60% more CPU per env step in page faults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)  # glibc only: not in musl or macOS's libc
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system (glibc's malloc_trim(0)); False where there is no
    malloc_trim, and nothing is done."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
