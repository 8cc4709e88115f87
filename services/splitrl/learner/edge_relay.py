"""Split modes with data-parallel learners: every rank's encoder traffic goes through rank 0.

Edges dial one learner, rank 0 (they sit behind NAT and keep one training stream). The other ranks compute
activation gradients for step ids of any edge, so they hand them to rank 0 over the group (torch.distributed,
cloud-internal, not the WAN), and rank 0 speaks for the group to each edge:

  split             every rank names its drawn step ids; rank 0 asks each edge once for all of them and hands
                    every rank its own rows (scatter); after the backward pass rank 0 collects every rank's
                    gradient rows and returns them in one EncoderGradients per edge.
  split-accumulate  rank 0 collects every rank's chosen rows and pushes one EncoderGradients per edge.

Invariant: per minibatch each edge receives at most one EncoderGradients, holding the rows of every rank for
its step ids, so the edge's encoder takes one optimizer step per minibatch whatever M is. The trainer scales
its rows by 1/(ranks that trained) (`DataParallel.average_gradients`), so they are the gradient of the group's
loss, the mean of those ranks' losses, as the head's averaged gradient is. That is one learner's gradient for
the union minibatch up to advantage normalization, which each rank does over its own rows, and (split) up to
the weight of a rank whose edges lost more of its rows than another's. WAN bytes are one learner's for the
union minibatch.

Every rank must call each method once per minibatch that trains the encoder, in the same order (each is a
collective); a rank with no row passes empty tensors.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from splitrl.learner.distributed import DataParallel
from splitrl.learner.trainer import EdgeTraining


class EdgeRelay:
    """`EdgeTraining` for one rank of a data-parallel group; `edges` is rank 0's link to the edges (None on the
    other ranks). Tickets are rank 0's (what `edges` returned) and None elsewhere."""

    def __init__(self, parallel: DataParallel, edges: EdgeTraining | None) -> None:
        if (parallel.rank == 0) != (edges is not None):
            raise ValueError(f"rank {parallel.rank}: the edges dial rank 0, so rank 0 alone holds their links")
        self.parallel, self.edges = parallel, edges

    def fetch_activations(self, step_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Split: this rank's rows of one group fetch, as EdgeLinks.fetch_activations answers for them."""
        every_rank_ids = self._gather_to_rank_0(step_ids)
        answers: list[Any] | None = None
        ticket = None
        if self.edges is not None:
            activations, present, ticket = self.edges.fetch_activations(torch.cat(every_rank_ids))
            counts = [len(ids) for ids in every_rank_ids]
            # Cloned: a view pickles with its whole storage, which would send every rank every row.
            rows = zip(activations.split(counts), present.split(counts), strict=True)
            answers = [(rank_rows.clone(), rank_present.clone()) for rank_rows, rank_present in rows]
        mine: list[Any] = [None]
        dist.scatter_object_list(mine, answers, src=0)
        activations, present = mine[0]
        return activations, present, ticket

    def return_gradients(self, ticket: Any, gradients: torch.Tensor, learning_rate_scale: float) -> None:
        """Split: this rank's gradient rows [n, width] for its fetched rows; rank 0 returns the group's (every
        rank is at the same update, so rank 0's `learning_rate_scale` is the group's)."""
        parts = self._gather_to_rank_0(gradients)
        if self.edges is not None:
            self.edges.return_gradients(ticket, torch.cat(parts), learning_rate_scale)

    def push_gradients(
        self,
        step_ids: torch.Tensor,
        encoder_versions: torch.Tensor,
        gradients: torch.Tensor,
        learning_rate_scale: float,
    ) -> None:
        """Split-accumulate: this rank's chosen rows; rank 0 pushes the group's, one message per edge."""
        parts = self._gather_to_rank_0((step_ids, encoder_versions, gradients))
        if self.edges is not None:
            ids, versions, rows = (torch.cat(column) for column in zip(*parts, strict=True))
            self.edges.push_gradients(ids, versions, rows, learning_rate_scale)

    def _gather_to_rank_0(self, value: Any) -> list[Any]:
        """Every rank's `value` in rank order on rank 0; an empty list elsewhere."""
        gathered: list[Any] | None = [None] * self.parallel.world_size if self.parallel.rank == 0 else None
        dist.gather_object(value, gathered, dst=0)
        return gathered or []
