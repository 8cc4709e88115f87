"""HTTP/2 flow control on splitrl's links, as the frames on the wire show it.

A real server and channel made as services make them (`rpc.create_server`, `rpc.dial`) exchange small lockstep
messages on loopback while `bench.http2_frames.FrameTally` reads the frames of that one connection (its
port). On a WAN link windows are announced at the fixed size (rpc.WAN_WINDOW_BYTES) and no bandwidth probes
(PING frames) ride beside the messages; other links keep gRPC's probing. Needs a raw packet socket (root or
CAP_NET_RAW); skipped without one.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from splitrl.bench.http2_frames import FrameCounts, FrameTally, raw_sockets_allowed
from splitrl.bench.link import measure
from splitrl.core import rpc
from splitrl.core.config import TransportSettings
from splitrl.core.metrics import Metrics

pytestmark = pytest.mark.skipif(not raw_sockets_allowed(), reason="a raw packet socket needs CAP_NET_RAW")

ROUND_TRIPS = 400


async def _echo(requests, context):
    async for request in requests:
        yield request[:4]


async def lockstep_frames(wan: bool) -> FrameCounts:
    """The frames of ROUND_TRIPS 40 B requests and 4 B answers on one stream, as an edge's Act stream of a few
    envs, with both ends made for a WAN link or not."""
    server, _, _ = await rpc.create_server(Metrics(CollectorRegistry()), (), wan=wan)
    handler = grpc.stream_stream_rpc_method_handler(_echo)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Echo": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with FrameTally("lo", port=port) as tally:
            async with rpc.dial(f"127.0.0.1:{port}", TransportSettings(tls="plaintext"), wan=wan) as channel:
                call = channel.stream_stream("/test.Echo/Echo")()
                for _ in range(ROUND_TRIPS):
                    await call.write(b"a" * 40)
                    await call.read()
                await call.done_writing()
                await asyncio.sleep(0.2)
    finally:
        await server.stop(0)
    counts = tally.counts
    # Each message is one DATA frame: 9 B header + 5 B gRPC prefix + the message.
    assert counts.count_of("DATA") >= 2 * ROUND_TRIPS, dict(counts.frames)
    assert counts.bytes_of("DATA") >= ROUND_TRIPS * (14 + 40 + 14 + 4)
    assert counts.unparsed_bytes == 0
    return counts


async def test_a_wan_link_has_fixed_windows_and_no_bandwidth_probes():
    counts = await lockstep_frames(wan=True)
    assert counts.initial_windows.count(rpc.WAN_WINDOW_BYTES) == 2, counts.initial_windows  # both ends
    # What may remain is a connection's opening ping and its ack (the test below sees gRPC's probing).
    assert counts.count_of("PING") <= 2, f"{counts.count_of('PING')} PING frames in {ROUND_TRIPS} round trips"


async def test_other_links_keep_grpcs_probing():
    counts = await lockstep_frames(wan=False)
    assert rpc.WAN_WINDOW_BYTES not in counts.initial_windows, counts.initial_windows
    assert counts.count_of("PING") > 2, dict(counts.frames)


def test_the_link_benchs_wan_stream_is_set_as_the_wan_links_are():
    """`splitrl bench throughput --link-wan`: its grpc-wan stream announces the WAN window at both ends."""
    with FrameTally("lo") as tally:  # the receiver's port is chosen in its own process: all of loopback
        result = measure("grpc-wan", 8192, 0.3)
    assert result.messages > 0 and result.transport == "grpc-wan"
    assert tally.counts.initial_windows.count(rpc.WAN_WINDOW_BYTES) >= 2, tally.counts.initial_windows
