"""Data-parallel learner ranks as real processes, for tests: gloo meets over a real TCPStore on loopback."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from tests.ports import free_port


def run_ranks(target: Callable[..., Any], *args: Any, world_size: int = 2, timeout_s: float = 150) -> dict[int, Any]:
    """Run `target(rank, rendezvous_endpoint, *args)` in `world_size` spawned processes (a module-level function,
    so spawn can import it) and return what each rank's call returned, by rank. Every process must exit 0.
    The target joins the group at the endpoint itself (it picks the group's timeout) and leaves it."""
    context = mp.get_context("spawn")
    results = context.Queue()
    endpoint = f"127.0.0.1:{free_port()}"
    processes = [
        context.Process(target=_report, args=(target, rank, endpoint, args, results)) for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    got = dict(pickle.loads(results.get(timeout=timeout_s)) for _ in processes)
    for process in processes:
        process.join(30)
        assert process.exitcode == 0, f"a rank exited with {process.exitcode}"
    return got


def _report(target: Callable[..., Any], rank: int, endpoint: str, args: tuple[Any, ...], results: Any) -> None:
    torch.set_num_threads(1)
    # Pickled here: a queue would share tensors' memory with this process, which is about to exit.
    results.put(pickle.dumps((rank, target(rank, endpoint, *args))))
    # Then exit without interpreter shutdown. gloo's worker threads free a finished collective's work, and the
    # Python tensors it holds, under the GIL after the collective has returned; a worker still waiting for the
    # GIL when shutdown begins is ended mid-destructor and aborts the process ("terminate called without an
    # active exception": ~1 run in 40 of test_data_parallel_split, a gather's work in the core dump; a barrier
    # before leaving the group only moved it to the barrier's work, which holds the gather's). A learner service
    # is not exposed: it leaves the group to its exit, after its stop has waited on threads and written files.
    results.close()
    results.join_thread()  # the result is in the pipe before the process goes
    os._exit(0)
