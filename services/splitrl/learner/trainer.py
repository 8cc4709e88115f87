"""One PPO update over a batch of trajectory chunks, CleanRL style: advantages, then epochs of minibatches.

What a minibatch trains on depends on the mode (docs/design.md §3):
  cloud             frame stacks from replay through encoder + head; no WAN.
  split             activations the edge recomputes for the minibatch (WAN up), gradients back (WAN down),
                    in lockstep every minibatch of every epoch: the research's naive split. `encoder_fraction`
                    < 1 fetches them for a sampled share of the rows only; the rest train the head alone.
  split-accumulate  activations stored in replay, no WAN; a sampled `encoder_fraction` of each minibatch's
                    activation gradients is pushed down to the edge without waiting (the pipeline).
"""

from __future__ import annotations

import logging
import math
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

import torch
from torch import nn

from splitrl.core import precision
from splitrl.core.memory import reuse_freed_blocks
from splitrl.core.models import ActorCritic
from splitrl.learner.algorithms import gae, linear_anneal, ppo_loss, vtrace
from splitrl.learner.batch import Batch, Rows
from splitrl.learner.distributed import DataParallel
from splitrl.learner.network import FusedAdam
from splitrl.learner.settings import ACCUMULATE_ENCODER_FRACTION, LearnerSettings

log = logging.getLogger(__name__)


class EdgeTraining(Protocol):
    """The trainer's view of the `learner-encoder` link (implemented by `splitrl.learner.edges.EdgeLinks`)."""

    def fetch_activations(self, step_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]: ...

    def return_gradients(self, ticket: Any, gradients: torch.Tensor, learning_rate_scale: float) -> None: ...

    def push_gradients(
        self,
        step_ids: torch.Tensor,
        encoder_versions: torch.Tensor,
        gradients: torch.Tensor,
        learning_rate_scale: float,
    ) -> None: ...


@dataclass(frozen=True)
class LossTerms:
    """Loss terms of PPO, as floats; the names are the `term` label of splitrl_learner_loss."""

    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float

    @classmethod
    def mean(cls, terms: list[LossTerms]) -> LossTerms:
        """The mean of each term over `terms` (zeros when empty: no minibatch trained)."""
        count = max(len(terms), 1)
        return cls(*(sum(getattr(term, f.name) for term in terms) / count for f in fields(cls)))

    def items(self) -> list[tuple[str, float]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


@dataclass
class UpdateStats:
    losses: LossTerms  # mean over the update's minibatches
    steps: int
    chunk_priorities: list[float]  # mean |advantage| of each chunk, in batch order
    optimizer_steps: int  # steps taken; 0 when no minibatch had a row (split: no edge answered). Equal on all ranks
    learning_rate: float  # Adam's, in this update
    entropy_coef: float  # the entropy bonus's weight in this update


class Trainer:
    """Owns the trainable network (ActorCritic in cloud mode, the head in split modes) and its optimizer."""

    def __init__(
        self,
        network: nn.Module,
        settings: LearnerSettings,
        edges: EdgeTraining | None = None,
        parallel: DataParallel | None = None,
    ) -> None:
        """`parallel`: this learner's data-parallel group (learner.distributed); gradients are averaged over it
        before every optimizer step."""
        if settings.mode != "cloud" and edges is None:
            raise ValueError(f"mode {settings.mode!r} trains the encoder through the edge: pass `edges`")
        self.network = network
        self.settings = settings
        self.edges = edges
        self.parallel = parallel
        self.optimizer = FusedAdam(network.parameters(), lr=settings.learning_rate)
        #: Optimizer steps skipped for non-finite gradients since the trainer was built.
        self.skipped_steps = 0
        #: Minibatch shuffling and encoder-row draws; the learner checkpoints its state.
        self.generator = torch.Generator().manual_seed(settings.seed)
        #: Share of a minibatch's rows that train the encoder (`encoder_fraction` with its per-mode default).
        default_share = ACCUMULATE_ENCODER_FRACTION if settings.mode == "split-accumulate" else 1.0
        self.encoder_rows = default_share if settings.encoder_fraction is None else settings.encoder_fraction
        precision.warn_if_emulated(settings.train_precision, "train_precision", "the learner's", log)
        # A minibatch's inputs and activations (CarRacing: megabytes each) come back from the heap at every step
        # instead of from fresh mappings that fault every page in. Process-wide, once.
        reuse_freed_blocks()

    def update(self, batch: Batch, *, version: int) -> UpdateStats:
        """One PPO update on `batch`; `version` is the number of updates before it (the policy version it
        starts from), which sets the learning rate and the entropy bonus's weight (`learning_rate_at`,
        `entropy_coef_at`)."""
        s = self.settings
        advantages, returns, old_log_probs = self._advantages(batch)
        rows = Rows.of(batch, advantages, returns, old_log_probs)
        if isinstance(self.network, ActorCritic):  # cloud: frames put in the convolutions' layout once per update
            rows = replace(rows, inputs=self.network.encoder.in_layout(rows.inputs))
        steps_per_update = len(rows) * s.world_size
        learning_rate = self.learning_rate_at(version, steps_per_update)
        entropy_coef = self.entropy_coef_at(version, steps_per_update)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        minibatch = self._minibatch_rows(len(rows))
        terms: list[LossTerms] = []
        optimizer_steps = 0
        for epoch in range(s.epochs):
            train_encoder = s.encoder_epochs is None or epoch >= s.epochs - s.encoder_epochs
            order = torch.randperm(len(rows), generator=self.generator)
            for start in range(0, len(rows), minibatch):
                index = order[start : start + minibatch]
                trained, stepped = self._minibatch(rows, index, entropy_coef, train_encoder)
                if trained is not None:
                    terms.append(trained)
                if stepped:
                    optimizer_steps += 1
        return UpdateStats(
            LossTerms.mean(terms),
            steps=len(rows),
            chunk_priorities=advantages.abs().mean(dim=1).tolist(),
            optimizer_steps=optimizer_steps,
            learning_rate=learning_rate,
            entropy_coef=entropy_coef,
        )

    def _minibatch_rows(self, update_rows: int) -> int:
        """Rows in each minibatch of an update of `update_rows` rows (the last may hold fewer)."""
        return max(1, update_rows // self.settings.minibatches)

    def learning_rate_at(self, version: int, steps_per_update: int) -> float:
        """Adam's learning rate for the update after `version` updates of `steps_per_update` agent steps:
        `learning_rate`, or with `lr_anneal_steps` the same falling linearly to 0 at that many steps."""
        s = self.settings
        return linear_anneal(s.learning_rate, version * steps_per_update, s.lr_anneal_steps)

    def entropy_coef_at(self, version: int, steps_per_update: int) -> float:
        """The entropy bonus's weight in the update after `version` updates of `steps_per_update` agent steps:
        `entropy_coef`, or with `entropy_anneal_steps` the same falling linearly to 0 at that many steps."""
        s = self.settings
        return linear_anneal(s.entropy_coef, version * steps_per_update, s.entropy_anneal_steps)

    def _minibatch(
        self, update: Rows, index: torch.Tensor, entropy_coef: float, train_encoder: bool = True
    ) -> tuple[LossTerms | None, bool]:
        """One optimizer step on rows `index` of `update`: (this rank's loss terms, or None if it had no row to
        train; whether the step was taken, which with data-parallel ranks is the same on every rank).

        `train_encoder` False (split modes, before the last `encoder_epochs`): the head trains on the newest
        activations `update` holds for each row (the rollout's, or those an encoder epoch fetched), and nothing
        crosses the WAN. In split mode the activations an encoder epoch fetches are written back into
        `update.inputs`; a row drawn to train the encoder that the edge no longer holds is left out. With
        data-parallel ranks every rank goes through every collective (gradient average, encoder traffic through
        rank 0: learner.edge_relay) even when it has no row."""
        s = self.settings
        rows = update.take(index)
        inputs = rows.inputs if s.mode == "cloud" else rows.inputs.float()
        ticket, leaf = None, None
        if s.mode == "split" and train_encoder:
            rows, inputs, leaf, ticket = self._fetch_fresh(update, index, rows, inputs)
        elif s.mode == "split-accumulate" and train_encoder:
            leaf = inputs = inputs.requires_grad_()  # a leaf: its .grad is what the edge's encoder needs
        terms = self._backward(rows, inputs, entropy_coef) if len(rows) else None
        ranks_trained = int(terms is not None)  # the group's (learner.distributed), or this learner alone
        if self.parallel is not None:
            ranks_trained = self.parallel.average_gradients(list(self.network.parameters()), terms is not None)
        if ranks_trained:
            # A non-finite gradient (a NaN reward or loss got through) would make every weight NaN for good, and
            # the checkpoint with them: the step is skipped instead. Averaged gradients are the same on every rank,
            # so every rank skips the same steps.
            norm = nn.utils.clip_grad_norm_(self.network.parameters(), s.max_grad_norm)
            if torch.isfinite(norm):
                self.optimizer.step()
            else:
                self.skipped_steps += 1
                log.error("optimizer step skipped: the gradients' norm is %s (weights unchanged)", norm.item())
                self.optimizer.zero_grad()
                ranks_trained = 0
        if leaf is not None:
            self._send_encoder_gradients(rows, leaf, ticket, ranks_trained)
        return terms, ranks_trained > 0

    def _backward(self, rows: Rows, inputs: torch.Tensor, entropy_coef: float) -> LossTerms:
        """PPO's loss on `rows` (the network reading `inputs`, the entropy bonus weighted `entropy_coef`),
        backpropagated into fresh .grad fields."""
        s = self.settings
        advantages = (rows.advantages - rows.advantages.mean()) / (rows.advantages.std(unbiased=False) + 1e-8)
        with self._autocast():
            distribution, new_values = self.network(inputs)
        loss = ppo_loss(
            distribution.log_prob(rows.actions),
            rows.old_log_probs,
            advantages,
            new_values,
            rows.returns,
            distribution.entropy(),
            clip=s.clip,
            value_coef=s.value_coef,
            entropy_coef=entropy_coef,
            sample_weights=None if s.importance_beta == 0 else rows.weights,
        )
        self.optimizer.zero_grad()
        loss.total.backward()
        return LossTerms(
            loss.policy.item(), loss.value.item(), loss.entropy.item(), loss.approx_kl.item(), loss.clip_fraction.item()
        )

    def _autocast(self) -> AbstractContextManager[Any]:
        """The forward passes' number format (`train_precision`; the learner trains on the CPU); backward follows
        it. The network's output layers stay float32 inside it (models.ActorCriticHead), so the loss sees
        float32 log-probabilities."""
        return precision.autocast(self.settings.train_precision)

    def _send_encoder_gradients(self, rows: Rows, leaf: torch.Tensor, ticket: Any, ranks_trained: int) -> None:
        """Send the edges d(loss)/d(activations) of `leaf`: split returns it for the rows fetched with `ticket`;
        split-accumulate pushes it for a drawn share of `rows` (the rows `leaf` holds). With data-parallel ranks
        the loss is the mean of the `ranks_trained` ranks' losses, so the rows are scaled by 1/ranks_trained,
        as the head's gradient is averaged. A leaf no loss reached (no row here) sends zeros, or nothing when
        it is empty. Called even then: with ranks it is a collective (learner.edge_relay)."""
        assert self.edges is not None
        gradient = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        gradient = gradient / max(ranks_trained, 1)
        # The edges' encoders step at their own rate times this update's share, so the network anneals together.
        scale = self.optimizer.param_groups[0]["lr"] / self.settings.learning_rate
        if self.settings.mode == "split":
            self.edges.return_gradients(ticket, gradient, scale)
            return
        chosen = self._draw_encoder_rows(len(rows))
        self.edges.push_gradients(rows.step_ids[chosen], rows.encoder_versions[chosen], gradient[chosen], scale)

    def _fetch_fresh(
        self, update: Rows, index: torch.Tensor, rows: Rows, inputs: torch.Tensor
    ) -> tuple[Rows, torch.Tensor, torch.Tensor, Any]:
        """Split mode's encoder epoch: fresh activations from the edge for the rows drawn to train the encoder
        (written back into `update.inputs`), the other rows keeping `inputs`. Returns (rows, inputs, leaf,
        ticket): the rows to train (a drawn row the edge no longer holds is left out), their inputs, and the
        leaf whose .grad goes back down with `ticket` (empty when no row was drawn: the fetch still happens, as
        with data-parallel ranks it is a collective, and asks no edge for anything)."""
        assert self.edges is not None
        drawn = self._draw_encoder_rows(len(rows)).nonzero().squeeze(1)
        fetched, present, ticket = self.edges.fetch_activations(rows.step_ids[drawn])
        update.inputs[index[drawn[present]]] = fetched[present].to(update.inputs.dtype)
        leaf = fetched.requires_grad_()  # rows the edge lacked stay 0 here and get a 0 gradient
        inputs = inputs.index_put((drawn,), leaf)  # differentiable in `leaf`: its .grad goes down
        kept = torch.ones(len(rows), dtype=torch.bool)
        kept[drawn[~present]] = False
        return rows.take(kept), inputs[kept], leaf, ticket

    def _draw_encoder_rows(self, count: int) -> torch.Tensor:
        """A bool mask over `count` rows: the share `encoder_rows` of them, drawn without replacement, train the
        encoder (all of them at 1, without drawing, so the research's split keeps its shuffling sequence).

        How many: count x encoder_rows, rounded down or up at random with the odds that make it exact on
        average. So the edge trains on minibatches of one or two sizes, and builds its kernels and heap blocks
        for those once (a coin flip per row would give dozens of sizes, each with kernels and blocks of its
        own)."""
        if self.encoder_rows >= 1:
            return torch.ones(count, dtype=torch.bool)
        expected = count * self.encoder_rows
        drawn = math.floor(expected)
        drawn += int(torch.rand((), generator=self.generator).item() < expected - drawn)
        mask = torch.zeros(count, dtype=torch.bool)
        mask[torch.randperm(count, generator=self.generator)[:drawn]] = True
        return mask

    @torch.no_grad()
    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(advantages, value targets, log-probs the PPO ratio is taken against), each [B, T].

        GAE: the ratio is against the behaviour policy. V-trace: its advantages already carry the
        truncated importance weight, so the ratio is against the current policy before this update
        (as in APPO); using the behaviour policy there would correct twice.
        """
        s = self.settings
        rewards = batch.rewards * s.reward_scale
        if s.correction == "gae":
            advantages, returns = gae(rewards, batch.values, batch.dones, s.gamma, s.gae_lambda)
            return advantages, returns, batch.behaviour_log_probs
        chunks, horizon = batch.rewards.shape
        inputs = batch.inputs.reshape(chunks * (horizon + 1), *batch.inputs.shape[2:])
        actions = torch.cat([batch.actions, batch.actions[:, -1:]], dim=1)  # pad: the bootstrap row has no action
        target_log_probs, values = self._evaluate(
            inputs,
            actions.reshape(len(inputs), *batch.actions.shape[2:]),
            rows_at_once=self._minibatch_rows(chunks * horizon),  # `update`'s minibatches: no bootstrap rows
        )
        values = values.reshape(chunks, horizon + 1)
        target_log_probs = target_log_probs.reshape(chunks, horizon + 1)[:, :-1]
        result = vtrace(
            batch.behaviour_log_probs, target_log_probs, rewards, values, batch.dones, s.gamma, lam=s.gae_lambda
        )
        return result.pg_advantages, result.value_targets, target_log_probs

    @torch.no_grad()
    def _evaluate(
        self, inputs: torch.Tensor, actions: torch.Tensor, rows_at_once: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The current network's log-probs of `actions` and its values on `inputs` ([N] each), `rows_at_once`
        rows at a time. A whole CarRacing update at once (528 rows) made blocks of 78 MB (its frames as
        float32) and 36 MB (the first convolution's output), over glibc's 32 MiB mmap threshold
        (core.memory.REUSED_BLOCK_BYTES): mapped afresh and faulted in at every update."""
        log_probs, values = [], []
        # The minibatches' precision and row count, so each update's ratios start at 1 (bfloat16 rounding, and
        # kernels chosen by row count, would otherwise put noise into the ratios' logs before any weight moves).
        with self._autocast():
            for part, part_actions in zip(inputs.split(rows_at_once), actions.split(rows_at_once), strict=True):
                distribution, part_values = self.network(part)
                log_probs.append(distribution.log_prob(part_actions))
                values.append(part_values)
        return torch.cat(log_probs), torch.cat(values)
