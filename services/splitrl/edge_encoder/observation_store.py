"""The edge's store of the frame stacks it encoded, by step id, so the learner can train the encoder later.

In the split modes the learner asks for fresh activations (split) or sends gradients (split-accumulate) by step
id, an update or two after the edge encoded those steps; the edge runs its encoder again on the stored stacks.
The store is bounded: an id evicted before the learner asks for it is counted (`splitrl_unknown_step_ids_total`)
and skipped, never an error. It is not thread-safe: the edge's EncoderTrainer puts and looks up under a lock,
and unpacks on its training thread only.

Frames are kept zstd-compressed (level 1): CarRacing-v3's 96 x 96 gray frames of driving shrink about 8x
in tens of microseconds each way, so a full store holds a few MB of frames instead of tens, for one pack
per env step and one unpack per frame a training request reads. Incompressible frames (noise) cost a few
bytes more than raw.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch
import zstandard

from splitrl.core.framestack import FrameRow

#: Fast and still ~8x on CarRacing; level 3 packed 1.5% smaller at 2.4x the time.
ZSTD_LEVEL = 1

#: One env's stack as the store keeps it: its frames' compressed bytes, oldest first. Rows of consecutive
#: steps of one env share the bytes objects of the frames they share.
PackedRow = tuple[bytes, ...]


class ObservationStore:
    """The frame stacks of the newest `capacity` steps, by step id.

    Invariants: len(store) <= capacity; inserting beyond capacity evicts the oldest id. Stacks come in as
    rows of frames shared with the FrameStacker (core.framestack), and each frame is compressed once, when the
    first row holding it is put: the rows of later steps that share it share its bytes. A full store so holds
    about `capacity` compressed frames, not `capacity` stacks of `depth`. `get` gives back exactly the frames
    as they were when first put: a frame must not be written after it is put (FrameStacker's never are).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"ObservationStore capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._rows: OrderedDict[int, PackedRow] = OrderedDict()
        self._frame_shape: tuple[int, ...] | None = None  # of the first frame put; every frame must match
        self._depth: int | None = None  # frames per row, of the first row put; every row must match
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        self._decompressor = zstandard.ZstdDecompressor()
        # id(frame) -> (the frame, weakly; its bytes) for frames a later row may still share: those the stacker
        # holds. The weak reference tells a live frame from a dead one whose id was reused.
        self._packed: dict[int, tuple[weakref.ref[torch.Tensor], bytes]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, step_ids: Sequence[int], rows: Sequence[FrameRow]) -> None:
        """Remember each step's stack, given as its row of uint8 [H, W] frames (FrameStacker.rows), under its
        step id. ValueError, storing none of them, for a row of another depth or a frame of another shape or
        dtype than the store's first."""
        if len(step_ids) != len(rows):
            raise ValueError(f"{len(step_ids)} step ids for {len(rows)} rows")
        if not rows:
            return
        depth = self._depth or len(rows[0])
        if depth < 1 or any(len(row) != depth for row in rows):
            raise ValueError(f"ObservationStore holds rows of {depth} frames, got {sorted({len(r) for r in rows})}")
        shape = self._frame_shape or tuple(rows[0][0].shape)
        packed_rows = [tuple(self._pack(frame, shape) for frame in row) for row in rows]
        self._depth, self._frame_shape = depth, shape
        self._rows.update(zip(step_ids, packed_rows, strict=True))
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)
        for key in [key for key, (frame, _) in self._packed.items() if frame() is None]:
            del self._packed[key]

    def _pack(self, frame: torch.Tensor, shape: tuple[int, ...]) -> bytes:
        """`frame`'s compressed bytes: those of its first put while it lives, else packed now."""
        known = self._packed.get(id(frame))
        if known is not None and known[0]() is frame:
            return known[1]
        if frame.dtype != torch.uint8 or tuple(frame.shape) != shape:
            raise ValueError(
                f"ObservationStore holds uint8 {list(shape)} frames, got {frame.dtype} {list(frame.shape)}"
            )
        # A copy of exactly the compressed size: python-zstandard allocates its output at ZSTD_compressBound
        # (a little more than the frame) and shrinks it in place, and the heap keeps each shrunk chunk's tail: a
        # full store would hold several times the bytes of its packed frames.
        packed = bytes(memoryview(self._compressor.compress(frame.contiguous().numpy().data)))
        self._packed[id(frame)] = (weakref.ref(frame), packed)
        return packed

    def frame_bytes(self) -> int:
        """Bytes of compressed frames the store holds, each shared frame counted once (walks every step: for
        tests and benchmarks, not the hot path)."""
        return sum({id(packed): len(packed) for row in self._rows.values() for packed in row}.values())

    def get(self, step_ids: Sequence[int]) -> tuple[list[int], torch.Tensor | None]:
        """(positions in `step_ids` the store holds, their stacks uint8 [n, depth, H, W]) — None when it holds
        none: `lookup`, then `unpack`."""
        found, rows = self.lookup(step_ids)
        return found, self.unpack(rows)

    def lookup(self, step_ids: Sequence[int]) -> tuple[list[int], list[PackedRow]]:
        """(positions in `step_ids` the store holds, their packed rows): the part of `get` that reads the store's
        index, so the only part a caller that puts from another thread must hold its lock for. A row's bytes
        never change once put, and an eviction after the lookup leaves the rows looked up whole."""
        found = [i for i, step_id in enumerate(step_ids) if step_id in self._rows]
        return found, [self._rows[step_ids[i]] for i in found]

    def unpack(self, rows: Sequence[PackedRow]) -> torch.Tensor | None:
        """Stacks uint8 [n, depth, H, W] of packed `rows` (from `lookup`), each distinct frame unpacked once; None
        for no row. One thread at a time: the store has one decompressor."""
        if not rows or self._frame_shape is None or self._depth is None:
            return None
        position: dict[int, int] = {}  # id(packed) -> its row in `unpacked`
        distinct: list[bytes] = []
        for packed in (packed for row in rows for packed in row):
            if id(packed) not in position:
                position[id(packed)] = len(distinct)
                distinct.append(packed)
        unpacked = np.empty((len(distinct), int(np.prod(self._frame_shape))), dtype=np.uint8)
        for index, packed in enumerate(distinct):
            unpacked[index] = np.frombuffer(self._decompressor.decompress(packed), dtype=np.uint8)
        order = np.array([position[id(packed)] for row in rows for packed in row])
        return torch.from_numpy(unpacked[order]).view(len(rows), self._depth, *self._frame_shape)
