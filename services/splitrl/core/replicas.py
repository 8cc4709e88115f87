"""Client side of a replicated service: one channel per replica, streams spread evenly and kept so.

A replicated service (inference, `--inference-replicas N`) is dialled at a
comma-separated address list (core.config.AddressList). Each lockstep stream
stays on the replica that holds its trajectories, so spreading is per stream,
not per call (gRPC's `round_robin` balances calls):

- a new stream goes to the replica with the fewest open streams, ties taken in
  round-robin turn, skipping replicas gRPC could not connect to (unless all
  failed): S streams land S/N per replica (±1);
- a stream that breaks is reopened the same way, which spreads the streams of
  a lost replica over the others;
- a replica that comes back, or that streams ending left with fewer, gets its
  share again: between two steps, a stream whose replica holds 2 or more
  streams more than a connected one moves there (`should_move`). A move ends
  the stream as a reconnect does (inference drops each env's unfinished chunk:
  at most one chunk per env per move).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from splitrl.core import rpc
from splitrl.core.config import TransportSettings, split_addresses
from splitrl.core.metrics import Metrics

#: States in which a channel is not offered new streams while another replica's channel is not in one.
_FAILED = (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN)


@dataclass
class Lease:
    """One open stream's place on a replica; `Replicas.release` it when the stream ends."""

    index: int
    address: str
    channel: grpc.aio.Channel
    released: bool = False


class Replicas:
    """Channels to every replica of `service` at `addresses` (AddressList); `close` them when done.

    Invariant: `open_streams[i]` is the number of unreleased leases on replica i.
    """

    def __init__(
        self,
        service: str,
        addresses: str,
        transport: TransportSettings,
        metrics: Metrics,
        dial: Callable[[str, TransportSettings], grpc.aio.Channel] = rpc.dial,
    ) -> None:
        self.service = service
        self.addresses = split_addresses(addresses)
        self._channels = [dial(address, transport) for address in self.addresses]
        self.open_streams = [0] * len(self.addresses)
        self._turns = itertools.count()
        self._opened = [metrics.streams_opened.labels(service=service, replica=address) for address in self.addresses]

    def acquire(self) -> Lease:
        """The replica a new stream goes to: fewest open streams among those not failed, ties in turn."""
        turn = next(self._turns)
        usable = [index for index, channel in enumerate(self._channels) if _state(channel) not in _FAILED]
        candidates = usable or list(range(len(self._channels)))
        index = min(candidates, key=lambda i: (self.open_streams[i], (i - turn) % len(self._channels)))
        self.open_streams[index] += 1
        self._opened[index].inc()
        return Lease(index, self.addresses[index], self._channels[index])

    def release(self, lease: Lease) -> None:
        """The stream of `lease` ended (idempotent)."""
        if not lease.released:
            lease.released = True
            self.open_streams[lease.index] -= 1

    def should_move(self, lease: Lease) -> bool:
        """True if a connected replica holds 2 or more streams fewer than `lease`'s: the stream should move.

        Cheap enough to ask between every two steps (a few list reads; a channel's state is a local read). It
        also asks gRPC to connect idle channels of replicas with fewer streams, so a restarted one is found.
        """
        mine = self.open_streams[lease.index]
        return any(
            mine - self.open_streams[index] >= 2
            and channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY
            for index, channel in enumerate(self._channels)
        )

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close(grace=None)


def _state(channel: grpc.aio.Channel) -> grpc.ChannelConnectivity:
    return channel.get_state(try_to_connect=False)
