"""Replay service: acknowledged inserts from inference, samples and priority updates for the learner.

With `data_dir` every insert is in the write-ahead log before it is acknowledged, and the tables are
restored at start (persistence.py). Inserts carrying a writer id are deduplicated: a re-sent chunk is
acknowledged again (`duplicate`) with its original key, never stored twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence

import grpc

from splitrl.core import trajectory
from splitrl.core.link_meter import LinkMeter
from splitrl.core.metrics import Metrics
from splitrl.core.rpc import BadRequest, Busy
from splitrl.replay.dedup import Writers
from splitrl.replay.persistence import ReplayStore
from splitrl.replay.settings import ReplaySettings, TableSettings
from splitrl.replay.table import InsertHook, Table
from splitrl.v1 import replay_pb2, replay_pb2_grpc

log = logging.getLogger(__name__)

#: Seconds before a Sample call's deadline at which replay stops waiting and answers with what it has.
SAMPLE_DEADLINE_MARGIN_S = 1.0
#: Seconds between checks of whether a snapshot is due.
SNAPSHOT_POLL_S = 0.5


class _Duplicate(Exception):
    """Raised by an insert's hook: the writer's sequence was stored while this insert waited."""

    def __init__(self, key: int) -> None:
        super().__init__(key)
        self.key = key


def build_table(settings: TableSettings, metrics: Metrics, seed: int | None = None) -> Table:
    """A table as `settings` describe it, exporting its series to `metrics`."""
    return Table(
        settings.name,
        settings.max_size,
        selector=settings.selector,
        rate_limiter=settings.rate_limiter(),
        max_times_sampled=settings.max_times_sampled,
        priority_exponent=settings.priority_exponent,
        seed=seed,
        metrics=metrics,
    )


class ReplayService(replay_pb2_grpc.ReplayServicer):
    """Serves the tables; every insert is validated before it is stored and acknowledged.

    A rate limiter that refuses an insert delays its acknowledgement (the
    Insert stream is not read meanwhile: backpressure); a Sample waits for its
    rate limiter until just before the call's deadline, then answers with what it has.
    """

    service_names: Sequence[str] = (replay_pb2.DESCRIPTOR.services_by_name["Replay"].full_name,)
    serves_wan = False

    def __init__(self, settings: ReplaySettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.insert_meter = LinkMeter(metrics, "inference-replay")
        self.sample_meter = LinkMeter(metrics, "replay-learner")
        self.tables = {
            table.name: build_table(table, metrics, None if settings.seed is None else settings.seed + index)
            for index, table in enumerate(settings.tables())
        }
        self.writers = Writers(settings.dedup_window)
        self.limits = settings.chunk_limits()
        self.store: ReplayStore | None = None
        if settings.data_dir is not None:  # restored before the server starts: no call sees a half-restored table
            self.store = ReplayStore(settings.data_dir, settings.fsync, metrics, settings.keep_snapshots)
            self.store.restore(self.tables, self.writers)
        self._snapshots: asyncio.Task[None] | None = None
        #: Set once the log cannot be written (a full disk): the service then stops, and exits saying why.
        self._stopped_writing = asyncio.Event()
        self._write_failure: OSError | None = None

    def register(self, server: grpc.aio.Server) -> None:
        replay_pb2_grpc.add_ReplayServicer_to_server(self, server)

    def finished(self) -> asyncio.Event:
        return self._stopped_writing

    def failure(self) -> BaseException | None:
        """The write that failed, once the log cannot be written: acknowledging more inserts would be a lie."""
        return self._write_failure

    async def start(self) -> None:
        if self.store is not None:
            self._snapshots = asyncio.create_task(self._snapshot_loop(self.store), name="replay snapshots")

    async def stop(self) -> None:
        """After the server drained: stop snapshotting, write a last snapshot, release data_dir."""
        if self._snapshots is not None:
            self._snapshots.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._snapshots
        if self.store is not None:
            await self.store.close(self.tables, self.writers)

    async def _snapshot_loop(self, store: ReplayStore) -> None:
        """Snapshot every checkpoint_every_s or checkpoint_every_inserts changes; a failure is logged and retried."""
        s = self.settings
        last = time.monotonic()
        while True:
            await asyncio.sleep(SNAPSHOT_POLL_S)
            if store.log is not None and store.log.failed is not None:  # a sample's or a priority's record
                self._cannot_write(store.log.failed)
                return
            by_count = 0 < s.checkpoint_every_inserts <= store.changes_since_snapshot
            if not (by_count or time.monotonic() - last >= s.checkpoint_every_s) or not store.changes_since_snapshot:
                continue
            try:
                await store.snapshot(self.tables, self.writers)
            except OSError as error:  # the log still holds everything; the next attempt may succeed
                log.error("replay snapshot failed: %s", error)
            last = time.monotonic()

    def _table(self, name: str) -> Table:
        table = self.tables.get(name)
        if table is None:
            raise BadRequest(f"unknown table {name!r}; this replay has {sorted(self.tables)}")
        return table

    async def Insert(
        self, request_iterator: AsyncIterator[replay_pb2.InsertRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[replay_pb2.InsertResponse]:
        async for request in request_iterator:
            self.insert_meter.received(request, phase="rollout", payload="trajectory")
            table = self._table(request.table)
            trajectory.check(request.trajectory, max_length=self.settings.max_trajectory_length)
            self.limits.check(request.trajectory)  # could a run of this spec have made it? (core.chunk_content)
            original = self.writers.check(request.writer_id, request.sequence) if request.writer_id else None
            if original is None:
                try:
                    priority = request.priority if request.HasField("priority") else None
                    key = await table.insert(request.trajectory, priority, on_insert=self._on_insert(request))
                except BadRequest:
                    raise
                except _Duplicate as duplicate:  # stored by another stream of this writer while this one waited
                    original = duplicate.key
                except ValueError as error:  # a bad priority, refused before anything was stored
                    raise BadRequest(f"InsertRequest.priority: {error}") from None
                except OSError as error:
                    raise self._cannot_write(error) from None
            if self.store is not None and self.store.log is not None:
                try:
                    await self.store.log.durable()  # acknowledged only once on disk (a duplicate: its original)
                except OSError as error:
                    raise self._cannot_write(error) from None
            if original is not None:
                self.metrics.replay_duplicates.labels(table=table.name).inc()
            ack = replay_pb2.InsertResponse(
                sequence=request.sequence, key=key if original is None else original, duplicate=original is not None
            )
            self.insert_meter.sent(ack, phase="rollout", payload="ack")
            yield ack

    def _cannot_write(self, error: OSError) -> Busy:
        """The log cannot be written: stop (the process exits saying why); the writer re-sends elsewhere or later."""
        if self._write_failure is None:
            log.error("replay stops: its log cannot be written: %s", error)
            self._write_failure = error
            self._stopped_writing.set()
        return Busy(f"replay cannot write its log ({error}); it is stopping")

    def _on_insert(self, request: replay_pb2.InsertRequest) -> InsertHook:
        """Runs in the table's atomic store step: re-check the writer's sequence, log, then remember it."""

        def hook(key: int, priority: float) -> None:
            writer = request.writer_id
            if writer:
                original = self.writers.check(writer, request.sequence)
                if original is not None:
                    raise _Duplicate(original)
            if self.store is not None:
                self.store.log_insert(request, key, priority)
            if writer:
                self.writers.record(writer, request.sequence, key)

        return hook

    async def Sample(
        self, request: replay_pb2.SampleRequest, context: grpc.aio.ServicerContext
    ) -> replay_pb2.SampleResponse:
        self.sample_meter.received(request, phase="training", payload="request")
        table = self._table(request.table)
        if request.num_items < 1:
            raise BadRequest(f"SampleRequest.num_items must be >= 1, got {request.num_items}")
        remaining = context.time_remaining()
        # Answer (possibly empty) before the caller's deadline, never let the deadline answer for us.
        wait_s = None if remaining is None else max(0.0, remaining - SAMPLE_DEADLINE_MARGIN_S)
        items = await table.sample(request.num_items, wait_s)
        response = replay_pb2.SampleResponse(
            items=[
                replay_pb2.SampledItem(
                    key=i.key,
                    trajectory=i.trajectory,
                    probability=i.probability,
                    times_sampled=i.times_sampled,
                    table_size=i.table_size,
                    priority=i.priority,
                )
                for i in items
            ]
        )
        self.sample_meter.sent(response, phase="training", payload="batch")
        return response

    async def UpdatePriorities(
        self, request: replay_pb2.UpdatePrioritiesRequest, context: grpc.aio.ServicerContext
    ) -> replay_pb2.UpdatePrioritiesResponse:
        self.sample_meter.received(request, phase="training", payload="request")
        table = self._table(request.table)
        try:
            updated, unknown = table.update_priorities((u.key, u.priority) for u in request.updates)
        except ValueError as error:
            raise BadRequest(f"UpdatePrioritiesRequest: {error}; no priority was changed") from None
        response = replay_pb2.UpdatePrioritiesResponse(updated=updated, unknown_keys=unknown)
        self.sample_meter.sent(response, phase="training", payload="ack")
        return response

    async def Info(self, request: replay_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> replay_pb2.InfoResponse:
        return replay_pb2.InfoResponse(tables=[table.info() for table in self.tables.values()])
