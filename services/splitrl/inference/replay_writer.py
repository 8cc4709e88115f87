"""Asynchronous, acknowledged writes of trajectory chunks to replay.

Acting never waits for replay unless `max_pending` chunks are already
buffered (backpressure, bounded memory). A chunk stays buffered until replay
acknowledges it; if the stream breaks, unacknowledged chunks are re-sent in
order on the next connection (redialled by the rule in core.redial; a refusal, such as an unknown table, ends
the writer with replay's reason).

Memory is bounded by `max_pending` chunks: `_unacked` holds at most that many
(a semaphore slot per chunk, released by its acknowledgement), and the outbox
only ever holds sequences of chunks in `_unacked`.

Every request carries this writer's random id and its sequence, so replay
acknowledges a re-sent chunk it already stored (its ack was lost, or replay
restarted from its data_dir) as a duplicate instead of storing it twice; a new
writer (a restarted inference) has a new id and starts again at 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict

import grpc

from splitrl.core import rpc
from splitrl.core.backoff import Backoff
from splitrl.core.config import TransportSettings
from splitrl.core.link_meter import LinkMeter
from splitrl.core.metrics import Metrics
from splitrl.core.redial import FAILURES, Redial
from splitrl.core.tasks import first_done
from splitrl.v1 import replay_pb2, replay_pb2_grpc

log = logging.getLogger(__name__)


class ReplayWriter:
    """Streams InsertRequests to one replay table; `flush` waits until everything queued is acknowledged."""

    def __init__(
        self,
        address: str,
        table: str,
        metrics: Metrics,
        max_pending: int,
        transport: TransportSettings,
        backoff: Backoff | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.address, self.table, self._metrics = address, table, metrics
        self.transport = transport  # inference's TLS settings, for dialling replay
        # Between redials; reset by every acknowledgement.
        self._redial = Redial("replay", backoff or Backoff(0.1, 5.0), metrics)
        self._meter = LinkMeter(metrics, "inference-replay")
        self._slots = asyncio.Semaphore(max_pending)
        self._unacked: OrderedDict[int, tuple[replay_pb2.InsertRequest, float]] = OrderedDict()
        self._outbox: asyncio.Queue[int] = asyncio.Queue()
        self._next_sequence = 0
        #: Names this writer to replay, for deduplication of re-sent chunks; new in every process.
        self.writer_id = uuid.uuid4().hex
        self._idle = asyncio.Event()
        self._idle.set()
        self.acknowledged = 0

    async def put(self, trajectory: replay_pb2.Trajectory) -> None:
        """Queue one chunk; blocks while `max_pending` chunks are unacknowledged."""
        await self._slots.acquire()
        request = replay_pb2.InsertRequest(
            table=self.table, sequence=self._next_sequence, trajectory=trajectory, writer_id=self.writer_id
        )
        self._unacked[self._next_sequence] = (request, time.perf_counter())
        self._idle.clear()
        await self._outbox.put(self._next_sequence)
        self._next_sequence += 1

    async def flush(self, timeout_s: float) -> bool:
        """Wait until every queued chunk is acknowledged; False if `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            log.warning("%d chunks not acknowledged by replay at shutdown", len(self._unacked))
            return False

    async def run(self) -> None:
        """Keep a stream to replay open, reconnecting with backoff, until cancelled."""
        async with rpc.dial(self.address, self.transport) as channel:
            stub = replay_pb2_grpc.ReplayStub(channel)
            while True:
                try:
                    await self._stream(stub)
                    error: BaseException = ConnectionError("replay ended the stream")
                except FAILURES as failure:
                    error = failure
                if isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    self._drop_refused(error)
                    continue
                await self._redial.lost(error, f"replay stream ({len(self._unacked)} chunks to re-send)")

    def _drop_refused(self, refusal: grpc.aio.AioRpcError) -> None:
        """Replay refused the oldest unacknowledged chunk (it reads them in order): sent again it would be
        refused again, and hold every later chunk back. It is dropped, counted and logged; the rest go on.

        Replay never stored it, nor any chunk after it (the refusal ended the stream there), and it expects each
        writer's sequences without gaps: the later chunks take one sequence less."""
        if not self._unacked:
            return
        sequence, _ = self._unacked.popitem(last=False)
        later = list(self._unacked.values())
        self._unacked.clear()
        for request, queued_at in later:
            request.sequence -= 1
            self._unacked[request.sequence] = (request, queued_at)
        self._next_sequence -= 1
        self._metrics.trajectory_chunks_dropped.labels(reason="refused by replay").inc()
        log.error("replay refused chunk %d, dropped: %s", sequence, refusal.details())
        self._slots.release()
        if not self._unacked:
            self._idle.set()

    async def _stream(self, stub: replay_pb2_grpc.ReplayStub) -> None:
        # Re-send, in order, whatever the previous stream did not get acknowledged.
        self._outbox = asyncio.Queue()
        for sequence in self._unacked:
            self._outbox.put_nowait(sequence)
        call = stub.Insert()
        reader = asyncio.create_task(self._read_acks(call))
        try:
            while True:
                get = await first_done(reader, self._outbox.get())
                if get is None or reader.done():
                    reader.result()  # raises the stream's error
                    return
                entry = self._unacked.get(get.result())
                if entry is None:  # acknowledged by an earlier stream
                    continue
                self._meter.sent(entry[0], phase="rollout", payload="trajectory")
                await call.write(entry[0])
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
            call.cancel()

    async def _read_acks(self, call: grpc.aio.StreamStreamCall) -> None:
        async for ack in call:
            self._meter.received(ack, phase="rollout", payload="ack")
            entry = self._unacked.pop(ack.sequence, None)
            if entry is None:
                continue  # a duplicate acknowledgement of a re-sent chunk
            self._metrics.hop_latency.labels(hop="inference-replay").observe(time.perf_counter() - entry[1])
            self.acknowledged += 1
            self._redial.answered()
            self._slots.release()
            if not self._unacked:
                self._idle.set()
