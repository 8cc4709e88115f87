"""The learner's end of the `learner-inference` link: keep inference on the newest weights, whatever happens to it.

One Publish stream at a time. The training loop `offer`s each new version and
moves on; the publisher sends the newest offer (older ones it never got to are
skipped), waits for its acknowledgement, and otherwise watches the idle stream,
so a restarted inference is noticed at once: the publisher redials (core.redial)
and re-publishes the current version on the new stream (inference accepts the
same version again). A version inference refuses (e.g. older than what it
holds, from a learner resumed from an older checkpoint) is logged and skipped,
and the publisher dials again for the next offer: the one redial loop that
retries refusals, deliberately (`retry_refusals`).

With inference replicas, `WeightsBroadcast` runs one publisher per replica:
each gets every version on its own stream, so a slow or restarting replica
holds back none of the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from splitrl.core import rpc
from splitrl.core.backoff import Backoff
from splitrl.core.config import TransportSettings, split_addresses
from splitrl.core.link_meter import LinkMeter
from splitrl.core.metrics import Metrics
from splitrl.core.redial import FAILURES, Redial, describe, is_refusal
from splitrl.core.tasks import first_done
from splitrl.v1 import weights_pb2, weights_pb2_grpc

log = logging.getLogger(__name__)


class WeightsPublisher:
    """Delivers the newest offered `Weights` to inference; `run` until cancelled.

    Invariant: every Publish stream is sent the newest offer (unless inference refused that version), so
    inference holds the learner's current weights within one redial of any restart.
    """

    def __init__(
        self,
        address: str,
        transport: TransportSettings,
        metrics: Metrics,
        backoff: Backoff,
        ack_timeout_s: float,
    ) -> None:
        self.address, self.transport = address, transport
        self._metrics = metrics
        self._meter = LinkMeter(metrics, "learner-inference")
        self._redial = Redial("inference", backoff, metrics, retry_refusals=True)
        self.ack_timeout_s = ack_timeout_s
        self._latest: weights_pb2.Weights | None = None
        self._refused: int | None = None  # a version inference refused: not sent again
        self._sending: int | None = None  # the version last written, whose acknowledgement is awaited
        self._changed = asyncio.Event()  # a new offer, or a new acknowledgement
        self.acknowledged = -1  # newest version inference acknowledged, on any stream

    def offer(self, message: weights_pb2.Weights) -> None:
        """Make `message` the weights to deliver (it replaces an older offer not yet sent)."""
        self._latest = message
        self._changed.set()

    async def delivered(self, version: int, timeout_s: float) -> bool:
        """Wait until inference acknowledged `version` (or newer); False if `timeout_s` passed or it was refused."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.acknowledged < version and self._refused != version:
            self._changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return False
        return self.acknowledged >= version

    async def run(self) -> None:
        """Keep a Publish stream open and up to date until cancelled, redialling whenever it breaks."""
        while True:
            try:
                async with rpc.dial(self.address, self.transport) as channel:
                    await asyncio.wait_for(channel.channel_ready(), self.ack_timeout_s)
                    call = weights_pb2_grpc.PolicyUpdatesStub(channel).Publish()
                    try:
                        await self._serve(call)
                    finally:
                        call.cancel()
                error: BaseException = ConnectionError("inference ended the weights stream")
            except FAILURES as failure:
                error = failure
                if is_refusal(error) and self._sending is not None:
                    self._refused = self._sending
                    reason = describe(error)
                    log.warning("inference refused weights version %d (%s); skipping it", self._refused, reason)
            await self._redial.lost(error, f"weights stream to inference {self.address}")

    async def _serve(self, call: grpc.aio.StreamStreamCall) -> None:
        """Publish on one stream until it breaks (raises); the pending read doubles as the liveness watch."""
        sent: int | None = None  # version sent on this stream
        read: asyncio.Task[object] | None = None
        try:
            while True:
                latest = self._latest
                if latest is not None and latest.version not in (sent, self._refused):
                    self._meter.sent(latest, phase="weights", payload="weights")
                    self._sending = latest.version
                    await call.write(latest)
                    read = read or asyncio.ensure_future(call.read())
                    ack = await asyncio.wait_for(read, self.ack_timeout_s)
                    read = None
                    await self._acknowledged(call, ack)
                    sent = latest.version
                    continue
                self._changed.clear()
                read = read or asyncio.ensure_future(call.read())
                await first_done(read, self._changed.wait())
                if read.done():  # inference never speaks first: the stream ended
                    message, read = read.result(), None
                    await self._acknowledged(call, message)
                    raise ConnectionError("inference sent an acknowledgement nobody asked for")
        finally:
            if read is not None:
                read.cancel()

    async def _acknowledged(self, call: grpc.aio.StreamStreamCall, ack: object) -> None:
        if ack is grpc.aio.EOF:
            await rpc.raise_if_failed(call)
            raise ConnectionError("inference closed the weights stream")
        assert isinstance(ack, weights_pb2.WeightsAck)
        self._meter.received(ack, phase="weights", payload="ack")
        self.acknowledged = max(self.acknowledged, ack.version)
        self._redial.answered()
        self._changed.set()
        log.debug("inference acknowledged weights version %d", ack.version)


class WeightsBroadcast:
    """A WeightsPublisher per inference replica at `addresses` (AddressList; "" for none: a data-parallel rank
    other than 0), offered to and awaited as one."""

    def __init__(
        self,
        addresses: str,
        transport: TransportSettings,
        metrics: Metrics,
        new_backoff: Callable[[], Backoff],
        ack_timeout_s: float,
    ) -> None:
        """`new_backoff()`: a Backoff for each replica's redial loop (one per loop: it counts that loop's failures)."""
        self.publishers = [
            WeightsPublisher(address, transport, metrics, new_backoff(), ack_timeout_s)
            for address in (split_addresses(addresses) if addresses else [])
        ]

    def offer(self, message: weights_pb2.Weights) -> None:
        """Make `message` the weights every replica is to hold."""
        for publisher in self.publishers:
            publisher.offer(message)

    async def delivered(self, version: int, timeout_s: float) -> bool:
        """Wait until every replica acknowledged `version` (or newer); False if one did not within `timeout_s`."""
        answers = await asyncio.gather(*(publisher.delivered(version, timeout_s) for publisher in self.publishers))
        return all(answers)

    async def run(self) -> None:
        """Keep every replica's stream open and up to date until cancelled."""
        await asyncio.gather(*(publisher.run() for publisher in self.publishers))
