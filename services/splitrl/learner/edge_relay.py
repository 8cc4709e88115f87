"""Split modes with data-parallel learners: every rank's encoder traffic goes through rank 0.

Edges dial one learner, rank 0 (they sit behind NAT and keep one training stream). The other ranks compute
activation gradients for step ids of any edge, so they hand them to rank 0 over the group (torch.distributed,
cloud-internal, not the WAN), and rank 0 sends each edge what one learner would have sent for the union of the
ranks' minibatches:

  split             every rank names its drawn step ids; rank 0 asks each edge once for all of them, and every
                    rank gets its own rows back; after the backward pass rank 0 collects every rank's gradient
                    rows and returns them in one EncoderGradients per edge.
  split-accumulate  rank 0 collects every rank's chosen rows and pushes one EncoderGradients per edge.

Invariant: per minibatch each edge receives at most one EncoderGradients, holding the rows of every rank for
its step ids, each scaled by 1/M: the group's loss is the mean of the M ranks' losses, so that is the gradient
one learner would send for the union minibatch, and the edge's encoder takes one optimizer step per
minibatch whatever M is. WAN bytes are those of one learner with the union minibatch.

Every rank must call each method once per minibatch that trains the encoder, in the same order (each is a
collective); a rank with no row passes empty tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from splitrl.learner.distributed import DataParallel
from splitrl.learner.trainer import EdgeTraining


@dataclass
class RelayTicket:
    """This rank's rows of a group fetch: where they start and how many, and rank 0's ticket for the edges."""

    offset: int
    count: int
    edges_ticket: Any  # rank 0 only: what EdgeLinks.fetch_activations returned; None elsewhere


class EdgeRelay:
    """`EdgeTraining` for one rank of a data-parallel group; `edges` is rank 0's link to the edges (None on the
    other ranks)."""

    def __init__(self, parallel: DataParallel, edges: EdgeTraining | None, width: int) -> None:
        if (parallel.rank == 0) != (edges is not None):
            raise ValueError(f"rank {parallel.rank}: the edges dial rank 0, so rank 0 alone holds their links")
        self.parallel, self.edges, self.width = parallel, edges, width

    def fetch_activations(self, step_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, RelayTicket]:
        """Split: this rank's rows of one group fetch, as EdgeLinks.fetch_activations answers for them."""
        every_rank_ids = self._all_gather(step_ids)
        counts = [len(ids) for ids in every_rank_ids]
        offset = sum(counts[: self.parallel.rank])
        answer: list[Any] = [None]
        edges_ticket = None
        if self.edges is not None:
            activations, present, edges_ticket = self.edges.fetch_activations(torch.cat(every_rank_ids))
            answer = [(activations, present)]
        dist.broadcast_object_list(answer, src=0)
        activations, present = answer[0]
        mine = slice(offset, offset + len(step_ids))
        return activations[mine], present[mine], RelayTicket(offset, len(step_ids), edges_ticket)

    def return_gradients(self, ticket: RelayTicket, gradients: torch.Tensor) -> None:
        """Split: this rank's gradient rows [count, width] (for its fetched rows); rank 0 returns the group's."""
        parts = self._gather_to_rank_0(gradients / self.parallel.world_size)
        if self.edges is not None:
            self.edges.return_gradients(ticket.edges_ticket, torch.cat(parts))

    def push_gradients(self, step_ids: torch.Tensor, encoder_versions: torch.Tensor, gradients: torch.Tensor) -> None:
        """Split-accumulate: this rank's chosen rows; rank 0 pushes the group's, one message per edge."""
        parts = self._gather_to_rank_0((step_ids, encoder_versions, gradients / self.parallel.world_size))
        if self.edges is not None:
            ids, versions, rows = (torch.cat(column) for column in zip(*parts, strict=True))
            if len(ids):
                self.edges.push_gradients(ids, versions, rows)

    def _all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        gathered: list[Any] = [None] * self.parallel.world_size
        dist.all_gather_object(gathered, tensor)
        return gathered

    def _gather_to_rank_0(self, value: Any) -> list[Any]:
        """Every rank's `value` in rank order on rank 0; an empty list elsewhere."""
        gathered: list[Any] | None = [None] * self.parallel.world_size if self.parallel.rank == 0 else None
        dist.gather_object(value, gathered, dst=0)
        return gathered or []
