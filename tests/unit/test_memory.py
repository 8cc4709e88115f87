"""splitrl.core.memory: glibc's free heap memory goes back to the system on request."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from splitrl.core import memory
from splitrl.core.memory import FreedMemory


def run_fresh(script: str, *args: str) -> str:
    """`script` run by a fresh Python (the heap settings are process-wide and once only) with no malloc settings
    from this environment; its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        env={k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


#: In a fresh process with glibc's heap pinned (no mmap for these sizes, no trimming by free() itself), free
#: 400 buffers of 300 KB lying between 400 kept ones of 70 KB: the edge's pattern (stacks freed, frames kept).
#: Their 117 MB stay resident until trimmed. Prints resident MiB before and after release_free_memory().
SCRIPT = """
from pathlib import Path
from splitrl.core.memory import release_free_memory

def resident_mib():
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024

pairs = [(b"t" * 300_000, b"k" * 70_000) for _ in range(400)]
kept = [frame for _, frame in pairs]
del pairs
before = resident_mib()
print(release_free_memory(), before, resident_mib(), len(kept))
"""
PINNED_HEAP = {"MALLOC_MMAP_THRESHOLD_": str(4 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_ARENA_MAX": "1"}


def test_memory_freed_between_kept_buffers_is_given_back():
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env={**os.environ, **PINNED_HEAP}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    released, before, after, kept = result.stdout.split()
    if released == "False":  # not glibc: nothing to call, and nothing done
        assert float(after) >= float(before) - 1
        return
    assert int(kept) == 400
    assert float(after) < float(before) - 80, f"resident {after} MiB after the trim, {before} before"


#: A canvas and its flipped copy (2 x 3.2 MB) drawn and freed 40 times, as ReleaseCanvas frees CarRacing's:
#: prints the minor page faults of the 40 draws without and with reuse_freed_blocks() (fresh process: the
#: setting is process-wide and once only).
CANVAS_SCRIPT = """
import resource
import numpy as np
from splitrl.core.memory import reuse_freed_blocks

def faults_of_draws(count=40):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(count):
        canvas = np.empty(3_200_000, np.uint8); canvas.fill(1)
        flipped = canvas[::-1].copy()
        del canvas, flipped
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

default = faults_of_draws()
print(reuse_freed_blocks(), default, faults_of_draws())
"""


def test_a_block_freed_at_every_step_is_reused_not_faulted_back_in():
    applied, default_faults, reused_faults = run_fresh(CANVAS_SCRIPT).split()
    if applied == "False":  # not glibc: nothing set
        return
    # Each draw faults ~1,560 pages (6.4 MB) back in with glibc's defaults; reused, only the first does.
    assert int(default_faults) > 20_000, default_faults
    assert int(reused_faults) < 4_000, reused_faults


#: A thread holds 48 MB and then allocates, writes and frees 24 MB 20 times (a learner's training thread: updates
#: beside kept weights and optimizer state): prints whether one_heap() applied and the thread's minor page faults
#: after its first step. one_heap() runs first, as `splitrl serve` calls it: before numpy's import starts threads
#: of its own. Transparent huge pages are off for the process (as torch's allocator leaves them by default;
#: numpy asks for them on large blocks, which would turn thousands of faults a step into tens).
THREAD_HEAP_SCRIPT = """
import ctypes, ctypes.util, resource, sys, threading
from splitrl.core.memory import one_heap, reuse_freed_blocks

applied = one_heap() if sys.argv[1] == "one-heap" else None
ctypes.CDLL(ctypes.util.find_library("c")).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
import numpy as np
reuse_freed_blocks()
faults = []

def step():
    block = np.empty(24_000_000, np.uint8)
    block.fill(1)
    del block

def steps():
    kept = [np.ones(12_000_000, np.uint8) for _ in range(4)]
    step()  # the first step's pages are new in either heap
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(20):
        step()
    faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

thread = threading.Thread(target=steps)
thread.start()
thread.join()
print(applied, faults[0])
"""


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread page faults (RUSAGE_THREAD) and glibc's heaps")
def test_a_threads_freed_blocks_stay_in_the_one_heap_instead_of_mappings_made_and_unmapped():
    def run(variant: str) -> tuple[str, int]:
        applied, faults = run_fresh(THREAD_HEAP_SCRIPT, variant).split()
        return applied, int(faults)

    applied, one_heap_faults = run("one-heap")
    if applied == "False":  # not glibc: nothing set
        return
    _, own_heap_faults = run("own-heap")
    # In a heap of its own the thread's 24 MB block lands in a new 64 MiB mapping that is unmapped when it is
    # freed, and faulted in afresh (~5,900 pages) at every step; in the main heap it stays for the next step.
    assert own_heap_faults > 50_000, own_heap_faults
    assert one_heap_faults < 500, one_heap_faults


#: `splitrl serve` refused after it parsed its flags (a bad port), then a thread allocates: prints how many heaps
#: (glibc arenas) the process has, from malloc_info's report.
SERVE_HEAPS_SCRIPT = """
import ctypes, ctypes.util, sys, tempfile, threading
from splitrl.cli.main import main

try:
    main(["serve", "replay", "--port", "-5"])
except SystemExit:
    pass
thread = threading.Thread(target=lambda: [bytearray(200_000) for _ in range(10)])
thread.start()
thread.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as report:
    stream = libc.fopen(report.name.encode(), b"w")
    assert stream, "fopen failed"
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(open(report.name).read().count("<heap nr="))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc_info")
def test_splitrl_serve_keeps_every_thread_on_one_heap_from_its_start():
    heaps = run_fresh(SERVE_HEAPS_SCRIPT)
    assert heaps.split() == ["1"], heaps


def test_freed_memory_trims_once_the_counted_bytes_reach_the_threshold(monkeypatch):
    trims: list[int] = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: trims.append(1) or True)
    freed = FreedMemory(threshold=10)
    assert [freed.freed(4), freed.freed(4), freed.freed(4), freed.freed(9), freed.freed(1)] == [
        False,
        False,
        True,
        False,
        True,
    ]
    assert len(trims) == 2 and freed.pending_bytes == 0
    every_step = FreedMemory(threshold=0)
    assert every_step.freed(0) and len(trims) == 3


@pytest.mark.parametrize("call", [lambda: FreedMemory(threshold=-1), lambda: FreedMemory().freed(-5)])
def test_freed_memory_refuses_negative_bytes_with_the_value(call):
    with pytest.raises(ValueError, match="got -"):
        call()


#: A fresh process touches 64 MiB and frees it: resident memory falls back, its peak does not. Prints the peak
#: before, the peak after and the resident bytes after.
PEAK_SCRIPT = """
from pathlib import Path
from splitrl.core.memory import peak_resident_bytes

def resident_bytes():
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024

before = peak_resident_bytes()
block = b"x" * (64 * 2**20)  # every page written
del block
print(before, peak_resident_bytes(), resident_bytes())
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="no /proc: the peak is NaN (unknown)")
def test_the_peak_resident_memory_remembers_a_block_already_freed():
    result = subprocess.run([sys.executable, "-c", PEAK_SCRIPT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    before, peak, resident = (float(value) for value in result.stdout.split())
    assert peak >= before + 60 * 2**20, (before, peak)
    assert resident < peak - 32 * 2**20, (resident, peak)  # the block was freed: only the peak keeps it
