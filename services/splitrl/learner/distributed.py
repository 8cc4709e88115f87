"""Data-parallel learners: M ranks that train one policy together, through torch.distributed (gloo on CPU).

Each rank samples its share of every update's chunks from replay (`chunks_per_update / M`) and runs the same
epochs and minibatches on them; after each minibatch's backward pass the ranks average their gradients
(`average_gradients`, one all-reduce), so every rank applies the same step to the same weights. At start the
ranks take rank 0's weights, optimizer state and policy version (`sync_state`), so a rank restarted from
nothing, or rank 0 restarted from its checkpoint, starts the group identical. Rank 0 alone publishes weights
and writes checkpoints.

Invariant: after every update all ranks hold identical weights and optimizer state (same start, same
averaged gradient, same deterministic Adam step). A rank that dies breaks the others' next collective: they
fail with it and are restarted, and the group resumes from rank 0's checkpoint, as torch elastic restarts a
job. Rendezvous is a TCPStore that rank 0 hosts at `rendezvous_endpoint`.

In split modes the edges dial rank 0 alone, and every rank's activations and gradients pass through it
(`edge_relay.py`), so an edge's encoder still steps once per minibatch.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class DataParallel:
    """This process's membership of the group; build it on the thread that trains (it blocks until all ranks
    joined, up to `timeout_s`)."""

    def __init__(self, rank: int, world_size: int, rendezvous_endpoint: str, timeout_s: float) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        host, _, port = rendezvous_endpoint.rpartition(":")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size = rank, world_size
        # Rank 0 serves the store; the others wait for it up to the timeout.
        store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)

    def sync_state(self, network: nn.Module, optimizer: torch.optim.Optimizer, version: int) -> int:
        """Give every rank rank 0's weights, optimizer state and policy version; returns that version."""
        state: list[Any] = [network.state_dict(), optimizer.state_dict(), version] if self.rank == 0 else [None] * 3
        dist.broadcast_object_list(state, src=0)
        if self.rank != 0:
            network.load_state_dict(state[0])
            optimizer.load_state_dict(state[1])
        return int(state[2])

    def average_gradients(self, parameters: list[nn.Parameter], trained: bool) -> int:
        """Replace each parameter's .grad by its mean over the ranks that `trained` this minibatch (a rank that
        had no row passes False and zeros); returns how many ranks trained (0: none, and no .grad is touched).
        The group's loss is the mean of those ranks' losses. Every rank must call it once per minibatch: it is
        one all-reduce of every gradient and the count."""
        flat = [p.grad.reshape(-1) if p.grad is not None and trained else torch.zeros(p.numel()) for p in parameters]
        buffer = torch.cat([*flat, torch.tensor([1.0 if trained else 0.0])])
        dist.all_reduce(buffer)
        ranks_trained = round(float(buffer[-1]))
        if ranks_trained == 0:
            return 0
        offset = 0
        for parameter in parameters:
            size = parameter.numel()
            parameter.grad = (buffer[offset : offset + size] / ranks_trained).reshape(parameter.shape)
            offset += size
        return ranks_trained

    def rank_0_says(self, answer: bool) -> bool:
        """Rank 0's `answer` on every rank (one broadcast: every rank must call it; the others' `answer` is
        ignored). Lets the group wait together on something only rank 0 sees, a step at a time."""
        decision: list[Any] = [answer]
        dist.broadcast_object_list(decision, src=0)
        return bool(decision[0])

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def weights_checksum(network: nn.Module) -> float:
    """Sum of every weight and buffer in float64: equal on every rank while the invariant holds (a cheap check,
    exported as splitrl_learner_weights_checksum)."""
    return float(sum(tensor.double().sum() for tensor in network.state_dict().values()))
