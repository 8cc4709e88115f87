"""Deduplication of re-sent inserts, by writer id and per-writer sequence (persisted with replay's data)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from splitrl.core.rpc import BadRequest
from splitrl.v1 import replay_store_pb2


class Writers:
    """Deduplication of re-sent inserts: per writer id, its highest stored sequence and its last `window` keys.

    A writer replay does not know may start at any sequence (a new inference process starts at 0; an
    old one, after an in-memory replay restarted, re-sends from its oldest unacknowledged chunk).
    At most `max_writers` writers are remembered, the least recently active forgotten first.
    """

    def __init__(self, window: int, max_writers: int = 1024) -> None:
        if window < 1 or max_writers < 1:
            raise ValueError(f"window and max_writers must be >= 1, got {window}, {max_writers}")
        self.window, self.max_writers = window, max_writers
        self._highest: OrderedDict[str, int] = OrderedDict()
        self._keys: dict[str, OrderedDict[int, int]] = {}

    def check(self, writer_id: str, sequence: int) -> int | None:
        """None: a new chunk, to store. An int: a duplicate, its original key (0 if forgotten).

        BadRequest if `sequence` skips ahead of the writer's next one (a chunk would be missing).
        """
        highest = self._highest.get(writer_id)
        if highest is None or sequence == highest + 1:
            return None
        if sequence <= highest:
            return self._keys[writer_id].get(sequence, 0)
        raise BadRequest(
            f"InsertRequest.sequence {sequence} of writer {writer_id!r} skips ahead: replay stored up to "
            f"{highest}, so the next is {highest + 1} (or a re-send <= {highest})"
        )

    def record(self, writer_id: str, sequence: int, key: int) -> None:
        """`writer_id`'s `sequence` is stored under `key` (the caller checked it is the next one)."""
        self._highest[writer_id] = sequence
        self._highest.move_to_end(writer_id)
        keys = self._keys.setdefault(writer_id, OrderedDict())
        keys[sequence] = key
        if len(keys) > self.window:
            keys.popitem(last=False)
        if len(self._highest) > self.max_writers:
            forgotten, _ = self._highest.popitem(last=False)
            del self._keys[forgotten]

    def state(self) -> list[replay_store_pb2.WriterState]:
        return [
            replay_store_pb2.WriterState(
                writer_id=writer_id,
                highest_sequence=highest,
                sequences=list(self._keys[writer_id]),
                keys=list(self._keys[writer_id].values()),
            )
            for writer_id, highest in self._highest.items()
        ]

    def restore(self, states: Sequence[replay_store_pb2.WriterState]) -> None:
        for state in states:
            self._highest[state.writer_id] = state.highest_sequence
            self._keys[state.writer_id] = OrderedDict(zip(state.sequences, state.keys, strict=True))
