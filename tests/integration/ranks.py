"""Data-parallel learner ranks as real processes, for tests: gloo meets over a real TCPStore on loopback."""

from __future__ import annotations

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
