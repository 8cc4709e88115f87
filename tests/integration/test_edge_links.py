"""The learner's end of the learner-encoder link (learner.edges.EdgeLinks) with real edge streams over gRPC.

A trainer call with no rows sends nothing (the trainer and the data-parallel relay call it regardless), and one
call asks all its edges at once under one deadline, so however many edges are silent a step waits on them for
EDGE_REPLY_TIMEOUT_S at most: data-parallel ranks sit in a collective meanwhile.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
import torch

from splitrl.core import rpc
from splitrl.core.step_ids import first_id
from splitrl.learner import edges as edges_module
from splitrl.learner.edges import EdgeLinks
from splitrl.learner.service import LearnerService
from splitrl.learner.settings import LearnerSettings
from splitrl.v1 import training_pb2, training_pb2_grpc
from tests.integration.stack import FAST_ENV, address, start

pytestmark = pytest.mark.asyncio

#: Nothing listens on port 1: the learner only waits for replay and inference here.
SETTINGS = LearnerSettings(
    tls="plaintext", env=FAST_ENV, mode="split", replay_address="127.0.0.1:1", inference_address="127.0.0.1:1"
)
REPLY_TIMEOUT_S = 2.0


class SilentEdge:
    """An edge that says hello, then only listens: it records what the learner sends and never answers."""

    def __init__(self, channel: grpc.aio.Channel, prefix: int) -> None:
        self.received: list[training_pb2.LearnerMessage] = []
        self._leaving = asyncio.Event()
        hello = training_pb2.EdgeHello(step_id_prefix=prefix, width=SETTINGS.width, edge_id=f"silent-{prefix}")

        async def messages():
            yield training_pb2.EdgeMessage(hello=hello)
            await self._leaving.wait()

        self.call = training_pb2_grpc.EncoderTrainingStub(channel).Train(messages())
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.call:
            self.received.append(message)

    async def leave(self) -> None:
        self._leaving.set()
        self.call.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


async def connected(links: EdgeLinks, count: int) -> None:
    for _ in range(100):
        if links.edge_count == count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{links.edge_count} edges connected, expected {count}")


def no_edge_rows(links: EdgeLinks) -> float:
    return links.metrics.registry.get_sample_value("splitrl_unknown_step_ids_total", {"request": "no-edge"}) or 0.0


async def test_no_rows_send_nothing_and_one_deadline_covers_every_silent_edge(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(edges_module, "EDGE_REPLY_TIMEOUT_S", REPLY_TIMEOUT_S)
    learner = await start(LearnerService, SETTINGS)
    links = learner.service.edges
    assert links is not None
    async with rpc.insecure_channel(address(learner)) as channel:
        edges = [SilentEdge(channel, prefix) for prefix in (1, 2)]
        try:
            await connected(links, 2)
            none = torch.zeros(0, dtype=torch.long)
            fetched, present, ticket = await asyncio.to_thread(links.fetch_activations, none)
            await asyncio.to_thread(links.return_gradients, ticket, torch.zeros(0, SETTINGS.width), 1.0)
            await asyncio.to_thread(links.push_gradients, none, none, torch.zeros(0, SETTINGS.width), 1.0)
            assert fetched.shape == (0, SETTINGS.width) and len(present) == 0 and ticket.parts == []
            await asyncio.sleep(0.2)  # anything sent would have arrived by now
            assert [edge.received for edge in edges] == [[], []] and no_edge_rows(links) == 0

            started = time.monotonic()
            ids = torch.tensor([first_id(1), first_id(2), first_id(2) + 1])
            _, present, ticket = await asyncio.to_thread(links.fetch_activations, ids)
            waited = time.monotonic() - started
            # Both edges asked at once: one deadline, where one after the other would take twice as long.
            assert REPLY_TIMEOUT_S <= waited < 2 * REPLY_TIMEOUT_S, waited
            assert [len(edge.received) for edge in edges] == [1, 1]
            assert not present.any() and ticket.parts == [] and no_edge_rows(links) == 3
        finally:
            for edge in edges:
                await edge.leave()
            await learner.stop()


async def test_gradients_carry_the_learning_rate_scale_only_below_1():
    """The edge steps its encoder at the learner's schedule: a scale below 1 crosses the link; at 1 the field
    stays unset (the edge's default), so a run without a schedule sends no byte for it."""
    learner = await start(LearnerService, SETTINGS)
    links = learner.service.edges
    assert links is not None
    async with rpc.insecure_channel(address(learner)) as channel:
        edge = SilentEdge(channel, 1)
        try:
            await connected(links, 1)
            ids, versions = torch.tensor([first_id(1)]), torch.zeros(1, dtype=torch.long)
            for scale in (0.5, 1.0):
                await asyncio.to_thread(links.push_gradients, ids, versions, torch.ones(1, SETTINGS.width), scale)
            for _ in range(100):
                if len(edge.received) == 2:
                    break
                await asyncio.sleep(0.05)
            halved, whole = (message.gradients for message in edge.received)
            assert halved.HasField("learning_rate_scale") and halved.learning_rate_scale == 0.5
            assert not whole.HasField("learning_rate_scale")
        finally:
            await edge.leave()
            await learner.stop()
