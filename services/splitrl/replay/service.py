"""Replay service: acknowledged inserts from inference, samples and priority updates for the learner."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from splitrl.core.metrics import LinkMeter, Metrics
from splitrl.core.rpc import BadRequest
from splitrl.core.trajectory import from_proto
from splitrl.replay.settings import ReplaySettings, TableSettings
from splitrl.replay.table import Table
from splitrl.v1 import replay_pb2, replay_pb2_grpc

#: Seconds before a Sample call's deadline at which replay stops waiting and answers with what it has.
SAMPLE_DEADLINE_MARGIN_S = 1.0


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

    def __init__(self, settings: ReplaySettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.insert_meter = LinkMeter(metrics, "inference-replay")
        self.sample_meter = LinkMeter(metrics, "replay-learner")
        self.tables = {
            table.name: build_table(table, metrics, None if settings.seed is None else settings.seed + index)
            for index, table in enumerate(settings.tables())
        }

    def register(self, server: grpc.aio.Server) -> None:
        replay_pb2_grpc.add_ReplayServicer_to_server(self, server)

    def finished(self) -> None:
        return None

    def failure(self) -> None:
        return None

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

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
            from_proto(request.trajectory, max_length=self.settings.max_trajectory_length)
            try:
                priority = request.priority if request.HasField("priority") else None
                key = await table.insert(request.trajectory, priority)
            except ValueError as error:  # a bad priority, refused before anything was stored
                raise BadRequest(f"InsertRequest.priority: {error}") from None
            ack = replay_pb2.InsertResponse(sequence=request.sequence, key=key)
            self.insert_meter.sent(ack, phase="rollout", payload="ack")
            yield ack

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
