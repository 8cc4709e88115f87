"""core.replicas: how streams are placed on, and moved between, the replicas of a service."""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, generate_latest

from splitrl.core import scrape
from splitrl.core.config import TransportSettings
from splitrl.core.metrics import STREAMS_OPENED, Metrics
from splitrl.core.replicas import Replicas

READY, IDLE = grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.IDLE
FAILED = grpc.ChannelConnectivity.TRANSIENT_FAILURE


class FakeChannel:
    """A channel whose connectivity the test sets; records whether a connection was asked for."""

    def __init__(self, address: str) -> None:
        self.address, self.state, self.asked_to_connect = address, IDLE, False

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        self.asked_to_connect |= try_to_connect
        return self.state

    async def close(self, grace: float | None = None) -> None:
        self.state = grpc.ChannelConnectivity.SHUTDOWN


def replicas(count: int) -> tuple[Replicas, list[FakeChannel], Metrics]:
    metrics = Metrics(CollectorRegistry())
    addresses = ",".join(f"inference-{i}:50052" for i in range(count))
    transport = TransportSettings(tls="plaintext")
    made = Replicas("inference", addresses, transport, metrics, dial=lambda address, _: FakeChannel(address))
    return made, made._channels, metrics  # type: ignore[return-value]


def test_streams_are_spread_evenly_in_turn():
    pool, _, metrics = replicas(3)
    leases = [pool.acquire() for _ in range(7)]
    assert [lease.address for lease in leases[:3]] == ["inference-0:50052", "inference-1:50052", "inference-2:50052"]
    assert sorted(pool.open_streams) == [2, 2, 3]
    assert scrape.total([generate_latest(metrics.registry).decode()], f"{STREAMS_OPENED}_total") == 7


def test_a_freed_place_is_filled_first_and_release_is_idempotent():
    pool, _, _ = replicas(2)
    first, second, third = pool.acquire(), pool.acquire(), pool.acquire()
    assert pool.open_streams == [2, 1]
    pool.release(second)
    pool.release(second)
    assert pool.open_streams == [2, 0]
    assert pool.acquire().index == second.index
    assert (first.index, third.index) == (0, 0)


def test_a_replica_that_cannot_be_reached_gets_no_new_stream_unless_all_are_down():
    pool, channels, _ = replicas(3)
    channels[1].state = FAILED
    for _ in range(4):
        pool.acquire()
    assert pool.open_streams == [2, 0, 2]
    for channel in channels:
        channel.state = FAILED
    assert pool.acquire().index in (0, 1, 2)  # nowhere better: try one, the caller's redial handles the failure


def test_a_stream_moves_only_to_a_connected_replica_with_two_fewer_streams():
    pool, channels, _ = replicas(2)
    channels[1].state = FAILED
    leases = [pool.acquire() for _ in range(4)]
    assert pool.open_streams == [4, 0]
    assert not pool.should_move(leases[0])  # the other replica is down
    assert channels[1].asked_to_connect  # ...but asked to reconnect, so its return is seen
    channels[1].state = READY
    assert pool.should_move(leases[0])
    pool.release(leases[0])
    assert pool.acquire().index == 1
    assert pool.should_move(leases[1])  # 3 against 1
    pool.release(leases[1])
    assert pool.acquire().index == 1
    assert pool.open_streams == [2, 2]
    assert not any(pool.should_move(lease) for lease in leases[2:])  # even: nobody moves
