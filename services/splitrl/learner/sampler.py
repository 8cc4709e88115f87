"""The learner's end of the `replay-learner` link: draw chunks from every replay shard, and send each chunk's
new priority back to the shard that holds it.

Replay scales as Reverb does: independent servers (shards, `--replay-shards K`), each written by its own
inference replicas and each with its own rate limiter; the learner samples from all of them
(`--replay-address a:50053,b:50053`). A draw of n chunks asks every shard for its share (n / K, the remainder
to the shards next in turn) at once and waits for every answer: a Sample call is never cancelled in flight,
since replay may already have counted its items as sampled (a FIFO table would lose them). Each shard
answers within the call's deadline, with fewer items than asked for (or none) if its rate limiter holds them
back. A shard that cannot be reached is redialled by the rule of core.redial, on its own backoff, while the
others' items are kept.

Keys are per shard: a sampled chunk remembers its shard, and priority updates are routed by it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from splitrl.core import rpc
from splitrl.core.backoff import Backoff
from splitrl.core.config import TransportSettings, split_addresses
from splitrl.core.link_meter import LinkMeter
from splitrl.core.metrics import Metrics
from splitrl.core.redial import Redial, describe, is_refusal
from splitrl.v1 import replay_pb2, replay_pb2_grpc

log = logging.getLogger(__name__)

#: Deadline of one Sample call (s): replay answers, possibly with nothing, shortly before it.
SAMPLE_WAIT_S = 5.0


@dataclass(frozen=True)
class SampledChunk:
    """What a shard said about one sampled chunk: its key there, the probability it was drawn with, the
    shard's table size, and which shard (an index into the address list)."""

    key: int
    probability: float
    table_size: int
    shard: int = 0


class ReplaySampler:
    """Samples one table of every replay shard at `addresses` (AddressList); `close` when done."""

    def __init__(
        self,
        addresses: str,
        table: str,
        transport: TransportSettings,
        metrics: Metrics,
        new_backoff: Callable[[], Backoff],
    ) -> None:
        self.addresses = split_addresses(addresses)
        self.table = table
        self._channels = [rpc.dial(address, transport) for address in self.addresses]
        self._stubs = [replay_pb2_grpc.ReplayStub(channel) for channel in self._channels]
        self._redials = [Redial("replay", new_backoff(), metrics) for _ in self.addresses]
        self._meter = LinkMeter(metrics, "replay-learner")
        self._turns = itertools.count()

    async def sample(self, count: int) -> list[tuple[replay_pb2.SampledItem, SampledChunk]]:
        """Up to `count` chunks, from every shard by its share; fewer (even none) if shards hold them back."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        shards = len(self._stubs)
        first = next(self._turns) % shards
        shares = {(first + k) % shards: count // shards + (k < count % shards) for k in range(shards)}
        answers = await asyncio.gather(
            *(self._sample_shard(shard, share) for shard, share in shares.items() if share > 0)
        )
        return [pair for answer in answers for pair in answer]

    async def _sample_shard(self, shard: int, count: int) -> list[tuple[replay_pb2.SampledItem, SampledChunk]]:
        request = replay_pb2.SampleRequest(table=self.table, num_items=count)
        self._meter.sent(request, phase="training", payload="request")
        try:
            response = await self._stubs[shard].Sample(request, timeout=SAMPLE_WAIT_S)
        except grpc.aio.AioRpcError as error:  # a refusal (e.g. an unknown table) is raised
            await self._redials[shard].lost(error, f"sample from replay {self.addresses[shard]}")
            return []
        self._redials[shard].answered()
        self._meter.received(response, phase="training", payload="batch")
        return [
            (item, SampledChunk(item.key, item.probability, max(item.table_size, 1), shard)) for item in response.items
        ]

    async def update_priorities(self, sampled: list[SampledChunk], priorities: list[float]) -> None:
        """Send each chunk's new priority to its shard, all shards at once.

        Best effort: a slow or stopping shard costs one round of priorities, not the learner; a refusal raises.
        """
        by_shard: dict[int, list[replay_pb2.KeyPriority]] = {}
        for chunk, priority in zip(sampled, priorities, strict=True):
            by_shard.setdefault(chunk.shard, []).append(replay_pb2.KeyPriority(key=chunk.key, priority=priority))
        await asyncio.gather(*(self._update_shard(shard, updates) for shard, updates in by_shard.items()))

    async def _update_shard(self, shard: int, updates: list[replay_pb2.KeyPriority]) -> None:
        request = replay_pb2.UpdatePrioritiesRequest(table=self.table, updates=updates)
        self._meter.sent(request, phase="training", payload="request")
        try:
            response = await self._stubs[shard].UpdatePriorities(request, timeout=SAMPLE_WAIT_S)
        except grpc.aio.AioRpcError as error:
            if is_refusal(error):
                raise
            log.warning(
                "priority update to replay %s failed (%s); these chunks keep their priorities",
                self.addresses[shard],
                describe(error),
            )
            return
        self._meter.received(response, phase="training", payload="ack")

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close(grace=None)
