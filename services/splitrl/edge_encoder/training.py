"""The edge's half of split-mode training: the learner's gradients applied to the encoder, on stored stacks.

Steps are keyed by their id (`splitrl.core.step_ids`); their stacks are in the
edge's ObservationStore (edge_encoder.observation_store).

Everything here is synchronous torch work. The service acts on one thread and
trains on another, so an env's step does not queue behind a training step of
the whole minibatch: `act` and training's touches of what acting uses (the
store's index, the weights and version at the optimizer step) take turns under
one lock; training's unpacking of stored frames and its forward and backward
passes, which only read the weights, run beside acting. Every
encoder pass runs in the trainer's `precision` (core.precision): acting and
training see the same encoder.

With a checkpoint path the trainer saves encoder, optimizer and encoder version
every `checkpoint_every` optimizer steps and at shutdown (atomically,
core.checkpoint), and restores them when it is built: a restarted edge keeps
the encoder the learner trained instead of going back to its seed weights.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from splitrl.core import checkpoint, wire
from splitrl.core.config import FloatCodec, Precision
from splitrl.core.framestack import FrameRow
from splitrl.core.memory import FreedMemory
from splitrl.core.metrics import Metrics
from splitrl.core.models import Encoder
from splitrl.core.precision import forward_in, warn_if_emulated
from splitrl.core.rpc import BadRequest
from splitrl.core.step_ids import unpack_step_ids
from splitrl.edge_encoder.observation_store import ObservationStore
from splitrl.edge_encoder.optimizer import LeanAdam
from splitrl.v1 import training_pb2

log = logging.getLogger(__name__)

#: Split mode: requests whose gradients have not come back yet, each kept as its activations' graph (or as its
#: stacks, to run again: rows_per_pass). Every optimizer step invalidates all of them (a graph saved the old
#: weights; activations the learner saw came from them), so they are dropped then.
MAX_PENDING = 4

#: Training passes run on a multiple of this many rows. oneDNN, torch's CPU convolution, builds and keeps a
#: kernel per layer, direction and batch size (its primitive cache holds up to 1,024), and the rows of a training
#: request vary: in split-accumulate, the rows of one learner minibatch that came from this edge's stream. Every
#: size from 1 to 32 rows builds hundreds of kernels, megabytes of the edge's resident memory more than padding
#: to 8 rows gives (8, 16, 24, 32: 4 sizes), for up to 7 zero rows more per pass, in its
#: compute and, in split, in each kept graph (MAX_PENDING). rows_to_run says the size; passes in pieces of
#: --encoder-rows-per-pass N run at most N rows.
TRAINING_ROWS_MULTIPLE = 8


def learning_rate_scale_of(message: training_pb2.EncoderGradients) -> float:
    """The share of the encoder's learning rate `message` asks for: 1 when unset; BadRequest outside [0, 1]."""
    if not message.HasField("learning_rate_scale"):
        return 1.0
    scale = message.learning_rate_scale
    if not 0.0 <= scale <= 1.0:  # NaN fails both comparisons
        raise BadRequest(f"EncoderGradients.learning_rate_scale must be in [0, 1], got {scale}")
    return scale


class EncoderTrainer:
    """Applies the learner's activation gradients to the edge's encoder; `version` counts optimizer steps.

    Thread use: `act` from one thread, everything else (training, checkpoints) from one other thread. Acting
    sees each optimizer step whole: activations and the version they are sent with come from one set of
    weights, and the store's index never changes under a training lookup."""

    def __init__(
        self,
        encoder: Encoder,
        store: ObservationStore,
        metrics: Metrics,
        *,
        learning_rate: float,
        max_grad_norm: float,
        activation_codec: FloatCodec = "bf16",
        checkpoint_path: Path | None = None,
        checkpoint_every: int = 0,
        rows_per_pass: int = 0,
        precision: Precision = "float32",
    ) -> None:
        """`checkpoint_path`: restore from it if it exists; save to it every `checkpoint_every` steps (0: only
        when `save_checkpoint` is called). `rows_per_pass`: 0 keeps a split request's graph from its activations
        to its gradients and runs split-accumulate's rows in one pass; N > 0 runs the encoder with a graph
        over N rows at a time only (split: the activations are sent without one and recomputed when the
        gradients come), so training's memory is bounded by N rows for one more forward pass per row.
        `precision`: the number format of every encoder pass (EncoderTrainingSettings.encoder_precision)."""
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
        if rows_per_pass < 0:
            raise ValueError(f"rows_per_pass must be >= 0, got {rows_per_pass}")
        self.encoder = encoder
        self.activation_codec: FloatCodec = activation_codec
        self.store = store
        self.metrics = metrics
        self.max_grad_norm = max_grad_norm
        self.learning_rate = learning_rate  # before the learner's schedule (EncoderGradients.learning_rate_scale)
        self.optimizer = LeanAdam(encoder.parameters(), lr=learning_rate, eps=1e-5)  # torch.optim.Adam's steps
        self.version = 0
        self.rows_per_pass = rows_per_pass
        self.precision: Precision = precision
        warn_if_emulated(precision, "encoder_precision", "the edge encoder's", log)
        self._freed = FreedMemory()  # each optimizer step's inputs, activations and gradients
        #: Guards what acting and training share: held by `act`, and by training around the store's lookups and
        #: the optimizer step (weights, version).
        self._shared = threading.Lock()
        # request id -> activations with their graph, or the uint8 stacks to run again (rows_per_pass)
        self._pending: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.checkpoint_path, self.checkpoint_every = checkpoint_path, checkpoint_every
        self._saved_version: int | None = None  # none yet: even an encoder that never trained is saved
        if checkpoint_path is not None:
            self._restore(checkpoint_path)

    def save_checkpoint(self) -> None:
        """Save encoder, optimizer and version if there is a path and anything new to save (compute thread).

        The first call always saves, so a run whose encoder never stepped (`--encoder-fraction 0`: a frozen
        encoder) still leaves the weights `splitrl eval` and a resumed edge need."""
        if self.checkpoint_path is None or self.version == self._saved_version:
            return
        state = {
            "version": self.version,
            "encoder": self.encoder.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        checkpoint.save(state, self.checkpoint_path)
        self._saved_version = self.version

    def _restore(self, path: Path) -> None:
        state = checkpoint.load(path)
        if state is None:
            return
        self.encoder.load_state_dict(state["encoder"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = self._saved_version = int(state["version"])
        self.metrics.encoder_version.set(self.version)
        log.info("encoder resumed from %s at version %d", path, self.version)

    def activations(self, request: training_pb2.ActivationRequest) -> training_pb2.Activations:
        """Split: recompute activations for the requested steps, keeping what their gradients will need."""
        requested = unpack_step_ids(request.steps) if request.HasField("steps") else []
        with self._shared:
            found, packed = self.store.lookup(requested)
        stacks = self.store.unpack(packed)
        held = set(found)
        missing = [step_id for i, step_id in enumerate(requested) if i not in held]
        if missing:
            self.metrics.unknown_step_ids.labels(request="activation").inc(len(missing))
        if stacks is None:
            rows = torch.zeros((0, self.encoder.width))
        elif self.rows_per_pass:
            with torch.no_grad():
                rows = torch.cat([self._forward(piece) for piece in stacks.split(self.rows_per_pass)])
            self._keep(request.request_id, stacks)
        else:
            rows = self._forward(stacks)
            self._keep(request.request_id, rows)
        return training_pb2.Activations(
            request_id=request.request_id,
            activations=wire.encode_float(rows.detach(), self.activation_codec),
            missing_step_ids=missing,
            encoder_version=self.version,
        )

    def apply(self, message: training_pb2.EncoderGradients) -> training_pb2.GradientsApplied:
        """Backpropagate the gradients through the encoder and take one optimizer step, at the learning rate
        times the message's `learning_rate_scale` (the learner's schedule)."""
        learning_rate = self.learning_rate * learning_rate_scale_of(message)
        gradients = wire.decode_float(message.gradients)  # any float codec; NaN / Inf refused
        if gradients.dim() != 2 or gradients.shape[1] != self.encoder.width:
            raise BadRequest(f"EncoderGradients.gradients has shape {list(gradients.shape)}; expected [n, width]")
        if message.HasField("steps"):  # split-accumulate: recompute the forward pass from the stored stacks
            steps = unpack_step_ids(message.steps)
            if len(steps) != gradients.shape[0]:
                raise BadRequest(f"EncoderGradients has {len(steps)} step ids for {gradients.shape[0]} rows")
            with self._shared:
                found, packed = self.store.lookup(steps)
            pending = self.store.unpack(packed)
            unknown = len(steps) - len(found)
            gradients = gradients[found]
        else:  # split: what was kept when the activations were sent
            pending = self._pending.pop(message.request_id, None)
            unknown = 0 if pending is not None else gradients.shape[0]
            if pending is not None and pending.shape[0] != gradients.shape[0]:
                raise BadRequest(f"EncoderGradients has {gradients.shape[0]} rows; the request had {pending.shape[0]}")
        if unknown:
            self.metrics.unknown_step_ids.labels(request="gradient").inc(unknown)
        if pending is not None and pending.shape[0] > 0:
            self.optimizer.zero_grad()
            self._backpropagate(pending, gradients.float())
            nn.utils.clip_grad_norm_(self.encoder.parameters(), self.max_grad_norm)
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate
            with self._shared:  # weights and version change together, between two acting passes
                self.optimizer.step()
                self.version += 1
            self._pending.clear()  # made with the old weights: backpropagating them now would be wrong
            # What the step's inputs, activations and gradients took is free now, kept by glibc: counted by the
            # size of the rows' float32 inputs.
            self._freed.freed(pending.shape[0] * 4 * math.prod(self.encoder.input_shape))
            self.metrics.encoder_updates.inc()
            self.metrics.encoder_version.set(self.version)
            if self.checkpoint_every and self.version % self.checkpoint_every == 0:
                self.save_checkpoint()
        return training_pb2.GradientsApplied(
            request_id=message.request_id, encoder_version=self.version, unknown_step_ids=unknown
        )

    def forget_pending(self) -> None:
        """Drop what pending requests kept (the learner's stream ended; their gradients will never come)."""
        self._pending.clear()

    def _keep(self, request_id: int, pending: torch.Tensor) -> None:
        self._pending[request_id] = pending
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)

    def _backpropagate(self, pending: torch.Tensor, gradients: torch.Tensor) -> None:
        """Accumulate the encoder's parameter gradients for `gradients` float32 [n, width]. `pending`: activations
        with their graph, or uint8 stacks [n, ...] to run the encoder on again, rows_per_pass rows at a time."""
        if pending.dtype != torch.uint8:
            backward_through(pending, gradients)
            return
        rows = self.rows_per_pass or pending.shape[0]
        for stacks, piece in zip(pending.split(rows), gradients.split(rows), strict=True):
            backward_through(self._forward(stacks), piece)

    def act(self, step_ids: list[int], rows: list[FrameRow], stacks: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Acting, on the acting thread: remember each step's stack (`rows` of shared frames, FrameStacker.rows)
        under its id for training, and return (`encode(stacks)`, the encoder version that made them)."""
        with self._shared:
            self.store.put(step_ids, rows)
            self.metrics.observation_store_size.set(len(self.store))
            return self.encode(stacks), self.version

    def encode(self, stacks: torch.Tensor) -> torch.Tensor:
        """Acting's pass (through `act` while training runs on another thread): activations float32 [B, width] of
        uint8 stacks [B, ...], without a graph. B is an env stream's message size, the same at each of its steps,
        so acting needs no padding (TRAINING_ROWS_MULTIPLE)."""
        with torch.no_grad():
            return forward_in(self.precision, self.encoder, stacks)

    def _forward(self, stacks: torch.Tensor) -> torch.Tensor:
        """A training pass: the encoder on `stacks` [B, ...] in `precision` (a graph unless grad is off), as
        float32 [B, width]: the codecs and the learner's gradients are float32, and the backward pass follows
        the forward's precision. It runs on `rows_to_run(B)` rows, the extra ones zero stacks whose activations
        are cut off: each row's activations depend on its own stack only (the encoder mixes no rows), so the cut
        rows change no other row's activations (beyond float rounding: oneDNN's kernel for another batch size)
        and, getting no gradient, no parameter."""
        rows = stacks.shape[0]
        padded = padded_to(stacks, rows_to_run(rows, self.rows_per_pass))
        return forward_in(self.precision, self.encoder, padded)[:rows]


def rows_to_run(rows: int, rows_per_pass: int) -> int:
    """The rows a training pass of `rows` (>= 0) runs on: rounded up to TRAINING_ROWS_MULTIPLE, and at most
    `rows_per_pass` when it is set (> 0; ValueError for a pass of more rows), so a request's passes in pieces
    all run at one size."""
    if rows_per_pass and rows > rows_per_pass:
        raise ValueError(f"a pass of {rows} rows is over rows_per_pass={rows_per_pass}")
    rounded = -(-rows // TRAINING_ROWS_MULTIPLE) * TRAINING_ROWS_MULTIPLE
    return min(rounded, rows_per_pass) if rows_per_pass else rounded


def padded_to(stacks: torch.Tensor, total_rows: int) -> torch.Tensor:
    """`stacks` [B, ...] followed by zero stacks up to `total_rows` (>= B) rows; itself when B is total_rows."""
    if total_rows < stacks.shape[0]:
        raise ValueError(f"cannot pad {stacks.shape[0]} rows to {total_rows}")
    if total_rows == stacks.shape[0]:
        return stacks
    return torch.cat([stacks, stacks.new_zeros((total_rows - stacks.shape[0], *stacks.shape[1:]))])


def backward_through(activations: torch.Tensor, gradients: torch.Tensor) -> None:
    """Backpropagate `gradients` (the loss's gradient with respect to `activations`, same shape) into the encoder.

    The same parameter gradients as activations.backward(gradients): the sum's gradient is 1 and the product's
    is then `gradients`, exactly. Passing gradients to backward() instead makes torch.autograd import
    torch.fx's symbolic shapes, and sympy with them, to check their shape (tens of MB on the edge); the product
    would broadcast a wrong shape instead, so it is checked here."""
    if gradients.shape != activations.shape:
        raise ValueError(f"gradients of shape {list(gradients.shape)} for activations {list(activations.shape)}")
    (activations * gradients).sum().backward()
