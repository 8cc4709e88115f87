"""Replay service: acknowledged inserts from inference, samples for the learner."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from splitrl.core.metrics import LinkMeter, Metrics
from splitrl.core.rpc import BadRequest
from splitrl.core.trajectory import from_proto
from splitrl.replay.settings import ReplaySettings
from splitrl.replay.table import QueueTable
from splitrl.v1 import replay_pb2, replay_pb2_grpc

#: Seconds before a Sample call's deadline at which replay stops waiting and answers with what it has.
SAMPLE_DEADLINE_MARGIN_S = 1.0


class ReplayService(replay_pb2_grpc.ReplayServicer):
    """Serves the tables; every insert is validated before it is stored and acknowledged."""

    service_names: Sequence[str] = (replay_pb2.DESCRIPTOR.services_by_name["Replay"].full_name,)

    def __init__(self, settings: ReplaySettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.insert_meter = LinkMeter(metrics, "inference-replay")
        self.sample_meter = LinkMeter(metrics, "replay-learner")
        self.tables = {settings.table: QueueTable(settings.table, settings.max_size, settings.min_size_to_sample)}

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

    def _table(self, name: str) -> QueueTable:
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
            key = await table.insert(request.trajectory)
            self.metrics.replay_inserts.labels(table=table.name).inc()
            self.metrics.replay_size.labels(table=table.name).set(table.size)
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
        self.metrics.replay_samples.labels(table=table.name).inc(len(items))
        self.metrics.replay_size.labels(table=table.name).set(table.size)
        response = replay_pb2.SampleResponse(
            items=[
                replay_pb2.SampledItem(
                    key=i.key, trajectory=i.trajectory, probability=1.0, times_sampled=i.times_sampled
                )
                for i in items
            ]
        )
        self.sample_meter.sent(response, phase="training", payload="batch")
        return response

    async def Info(self, request: replay_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> replay_pb2.InfoResponse:
        return replay_pb2.InfoResponse(tables=[table.info() for table in self.tables.values()])
