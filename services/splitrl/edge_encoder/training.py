"""The edge's half of split-mode training: a store of frame stacks by step id, and an encoder optimizer.

Steps are keyed by their id (`splitrl.core.step_ids`). The store is bounded:
an id evicted before the learner asks for it is counted
(`splitrl_unknown_step_ids_total`) and skipped, never an error.

Everything here is synchronous torch work; the service runs it on its single
compute thread, so rollout forwards and training steps never interleave.

With a checkpoint path the trainer saves encoder, optimizer and encoder version
every `checkpoint_every` optimizer steps and at shutdown (atomically,
core.checkpoint), and restores them when it is built: a restarted edge keeps
the encoder the learner trained instead of going back to its seed weights.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from splitrl.core import checkpoint, wire
from splitrl.core.config import FloatCodec
from splitrl.core.framestack import FrameRow, stack_rows
from splitrl.core.memory import release_free_memory
from splitrl.core.metrics import Metrics
from splitrl.core.models import Encoder
from splitrl.core.rpc import BadRequest
from splitrl.core.step_ids import unpack_step_ids
from splitrl.v1 import training_pb2

log = logging.getLogger(__name__)

#: Split mode: graphs kept for activations whose gradients have not come back yet. Every optimizer
#: step invalidates all of them (the weights they saved change in place), so they are dropped then.
MAX_PENDING_GRAPHS = 4


class ObservationStore:
    """The frame stacks of the newest `capacity` steps, by step id.

    Invariants: len(store) <= capacity; inserting beyond capacity evicts the oldest id. Stacks are kept as
    rows of frames shared with the FrameStacker (core.framestack), so consecutive steps of one env share all
    but one frame: a full store holds about `capacity` frames (9,216 B each at 96 x 96), not `capacity`
    stacks (36,864 B each at 4 x 96 x 96).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"ObservationStore capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._rows: OrderedDict[int, FrameRow] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, step_ids: Sequence[int], rows: Sequence[FrameRow]) -> None:
        """Remember each step's stack, given as its row of frames (FrameStacker.rows), under its step id."""
        for step_id, row in zip(step_ids, rows, strict=True):
            self._rows[step_id] = row
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)

    def frame_bytes(self) -> int:
        """Bytes of frame storage the store holds, each shared storage counted once (walks every step: for
        tests and benchmarks, not the hot path)."""
        storages = {
            frame.untyped_storage().data_ptr(): frame.untyped_storage().nbytes()
            for row in self._rows.values()
            for frame in row
        }
        return sum(storages.values())

    def get(self, step_ids: Sequence[int]) -> tuple[list[int], torch.Tensor | None]:
        """(positions in `step_ids` the store holds, their stacks uint8 [n, depth, H, W]) — None when it holds
        none."""
        found = [i for i, step_id in enumerate(step_ids) if step_id in self._rows]
        if not found:
            return found, None
        return found, stack_rows([self._rows[step_ids[i]] for i in found])


class EncoderTrainer:
    """Applies the learner's activation gradients to the edge's encoder; `version` counts optimizer steps."""

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
    ) -> None:
        """`checkpoint_path`: restore from it if it exists; save to it every `checkpoint_every` steps (0: only
        when `save_checkpoint` is called)."""
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
        self.encoder = encoder
        self.activation_codec: FloatCodec = activation_codec
        self.store = store
        self.metrics = metrics
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.Adam(encoder.parameters(), lr=learning_rate, eps=1e-5)
        self.version = 0
        self._graphs: OrderedDict[int, torch.Tensor] = OrderedDict()
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
        """Split: recompute activations for the requested steps, keeping the graph for their gradients."""
        requested = unpack_step_ids(request.steps) if request.HasField("steps") else []
        found, stacks = self.store.get(requested)
        held = set(found)
        missing = [step_id for i, step_id in enumerate(requested) if i not in held]
        if missing:
            self.metrics.unknown_step_ids.labels(request="activation").inc(len(missing))
        if stacks is None:
            rows = torch.zeros((0, self.encoder.width))
        else:
            rows = self.encoder(stacks)
            self._graphs[request.request_id] = rows
            while len(self._graphs) > MAX_PENDING_GRAPHS:
                self._graphs.popitem(last=False)
        return training_pb2.Activations(
            request_id=request.request_id,
            activations=wire.encode_float(rows.detach(), self.activation_codec),
            missing_step_ids=missing,
            encoder_version=self.version,
        )

    def apply(self, message: training_pb2.EncoderGradients) -> training_pb2.GradientsApplied:
        """Backpropagate the gradients through the encoder and take one optimizer step."""
        gradients = wire.decode_float(message.gradients)  # any float codec; NaN / Inf refused
        if gradients.dim() != 2 or gradients.shape[1] != self.encoder.width:
            raise BadRequest(f"EncoderGradients.gradients has shape {list(gradients.shape)}; expected [n, width]")
        if message.HasField("steps"):  # split-accumulate: recompute the forward pass from the stored stacks
            steps = unpack_step_ids(message.steps)
            if len(steps) != gradients.shape[0]:
                raise BadRequest(f"EncoderGradients has {len(steps)} step ids for {gradients.shape[0]} rows")
            found, stacks = self.store.get(steps)
            unknown = len(steps) - len(found)
            rows = None if stacks is None else self.encoder(stacks)
            gradients = gradients[found]
        else:  # split: the graph kept when the activations were sent
            rows = self._graphs.pop(message.request_id, None)
            unknown = 0 if rows is not None else gradients.shape[0]
            if rows is not None and rows.shape != gradients.shape:
                raise BadRequest(f"EncoderGradients rows {list(gradients.shape)} do not match {list(rows.shape)}")
        if unknown:
            self.metrics.unknown_step_ids.labels(request="gradient").inc(unknown)
        if rows is not None and rows.shape[0] > 0:
            self.optimizer.zero_grad()
            rows.backward(gradients.float())
            nn.utils.clip_grad_norm_(self.encoder.parameters(), self.max_grad_norm)
            self.optimizer.step()
            self._graphs.clear()  # saved for the old weights: backpropagating them now would be wrong
            release_free_memory()  # the step's inputs, activations and gradients (backward freed them; glibc keeps)
            self.version += 1
            self.metrics.encoder_updates.inc()
            self.metrics.encoder_version.set(self.version)
            if self.checkpoint_every and self.version % self.checkpoint_every == 0:
                self.save_checkpoint()
        return training_pb2.GradientsApplied(
            request_id=message.request_id, encoder_version=self.version, unknown_step_ids=unknown
        )

    def forget_pending(self) -> None:
        """Drop kept graphs (the learner's stream ended; their gradients will never come)."""
        self._graphs.clear()
