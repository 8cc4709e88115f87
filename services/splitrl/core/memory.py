"""The C heap's free memory: given back to the system where resident size is a cost (the edge), kept for the next
step where page faults are (a canvas drawn at every env step, a learner's minibatches).

glibc keeps memory that Python and torch free (a training step's inputs, activations and gradients, the
stacks each env step builds) inside its heap for reuse, and resident-size accounting counts it: on the
edge's CarRacing split, a large share of the process. `malloc_trim(0)` hands it back; it takes milliseconds
over such a heap, so it is called after events that free a lot (encoder optimizer steps, paced by
`FreedMemory`), never per env step. Returning every free at once instead (`MALLOC_MMAP_THRESHOLD_`) would
cost the edge page faults at every step.

The opposite case is a process that frees and reallocates the same large block at every step: CarRacing's
3.2 MB drawing canvas, freed after each step by splitrl.core.envs.ReleaseCanvas. With glibc's default
(dynamic) thresholds the freed canvas sits at the top of the heap, the heap is trimmed, and the next draw
faults its pages back in, which can double an agent step's time. `reuse_freed_blocks()` fixes the thresholds
so such a block stays in the heap for the next draw, of any env of the process, for a few MB more resident.
The learner's trainer sets the same, for its minibatches' inputs and activations (megabytes at every step),
which its steps would otherwise fault in afresh. A thread's
own heap (a glibc arena) grows by further 64 MiB mappings and unmaps each as soon as it is empty, whatever
the trim threshold, so `splitrl serve` first puts every thread on the main heap (`one_heap`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache

#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
#: Blocks up to this size come from the heap: a CarRacing canvas is 3.2 MB. glibc's default is dynamic, from
#: 128 KB up to the largest block freed so far, capped at 32 MiB; fixing it lower would send the larger tensors
#: of a PPO update in the same process (the bench's baselines: megabytes) to fresh mappings, faulted in at every
#: minibatch.
REUSED_BLOCK_BYTES = 32 * 2**20
#: The heap is trimmed when more than this is free at its top: above a canvas pair (the draw and its flip) and
#: a minibatch's largest blocks, as glibc's dynamic default would be (twice the mmap threshold).
HEAP_TRIM_BYTES = 64 * 2**20


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name)


@cache
def reuse_freed_blocks() -> bool:
    """Keep freed blocks up to REUSED_BLOCK_BYTES in this process's heap for the next allocation, and trim the
    heap only past HEAP_TRIM_BYTES free (glibc's mallopt; once per process). False where there is no mallopt
    (musl, macOS), and nothing is changed."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, REUSED_BLOCK_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_BYTES))


def one_heap() -> bool:
    """Threads that first allocate after this call do so from the process's main heap (glibc's M_ARENA_MAX of
    1), which keeps what `reuse_freed_blocks` asks. False where there is no mallopt (musl, macOS), and nothing
    is changed.

    Call it first thing in a process: a thread that allocated before keeps the heap it was given, and later
    threads are handed that heap in turn with the main one. By default glibc gives each new thread a heap of its
    own (an arena), which grows by further 64 MiB mappings and unmaps each as soon as it is empty, whatever
    the trim threshold. A learner's training thread would make and unmap many such mappings a second,
    faulting an update's blocks in afresh each time (tens of thousands of page faults a second, against a
    few thousand on the main heap). Sharing the main heap's lock costs little: a service runs one torch thread,
    and the small blocks of gRPC's and the event loop's threads come from each thread's own cache (glibc's
    tcache) without the lock.
    """
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, 1))


def _mallopt() -> Callable[[int, int], int] | None:
    return _glibc_function("mallopt", ctypes.c_int, ctypes.c_int)


def _malloc_trim() -> Callable[[int], int] | None:
    return _glibc_function("malloc_trim", ctypes.c_size_t)


@cache
def _glibc_function(name: str, *argtypes: type) -> Callable[..., int] | None:
    """libc's function `name`, taking `argtypes` and returning an int; None where the C library lacks it (the
    malloc tuning functions are glibc's: not in musl or macOS's libc)."""
    libc = _libc()
    function = None if libc is None else getattr(libc, name, None)
    if function is None:
        return None
    function.argtypes, function.restype = list(argtypes), ctypes.c_int
    return function  # type: ignore[no-any-return]


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system (glibc's malloc_trim(0)); False where there is no
    malloc_trim, and nothing is done."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


#: FreedMemory's default: a CarRacing split step's inputs (64 rows of 4 x 96 x 96 float32, 9.4 MB) pass it at
#: every step; 36 x 36 Catch steps of 32 rows (0.66 MB) at every 13th.
TRIM_AFTER_BYTES = 8 * 2**20


class FreedMemory:
    """Returns the C heap's free pages to the system (`release_free_memory`) once the steps since the last time
    have freed at least `threshold` bytes, as the caller counts them.

    A step's garbage is reused by the next step's allocations, so trimming after each of many small steps buys
    no memory and costs a fraction of a millisecond a time, a visible share of an edge-encoder's CPU when it
    steps tens of times a second. Between trims the heap holds at most the garbage of the steps counted since
    the last one, under `threshold` plus one step."""

    def __init__(self, threshold: int = TRIM_AFTER_BYTES) -> None:
        if threshold < 0:
            raise ValueError(f"FreedMemory threshold must be >= 0 bytes, got {threshold}")
        self.threshold = threshold
        self.pending_bytes = 0  # counted since the last trim

    def freed(self, nbytes: int) -> bool:
        """Count `nbytes` (>= 0) a step just freed; trim if the count reached `threshold`. Whether it trimmed."""
        if nbytes < 0:
            raise ValueError(f"freed bytes must be >= 0, got {nbytes}")
        self.pending_bytes += nbytes
        if self.pending_bytes < self.threshold:
            return False
        self.pending_bytes = 0
        return release_free_memory()


def peak_resident_bytes(pid: int | None = None) -> float:
    """The peak resident memory of process `pid` (None: this one) since it started, in bytes (Linux's VmHWM);
    NaN where the system does not say (no /proc, or the process is gone), which Prometheus reads as unknown."""
    try:
        with open(f"/proc/{'self' if pid is None else pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return float(int(line.split()[1]) * 1024)  # reported in kB
    except OSError:
        pass
    return float("nan")
