"""HTTP/2 flow control on splitrl's links, as the frames on the wire show it.

A real gRPC server and channel with splitrl's options exchange small lockstep messages on loopback while
`bench.http2_frames.FrameTally` reads the frames of that one connection (its port): windows are announced at
the fixed size (rpc.FLOW_CONTROL_WINDOW_BYTES) and no bandwidth probes (PING frames) ride beside the
messages. Needs a raw packet socket (root or CAP_NET_RAW); skipped without one.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from splitrl.bench.http2_frames import FrameTally, raw_sockets_allowed
from splitrl.core import rpc

pytestmark = pytest.mark.skipif(not raw_sockets_allowed(), reason="a raw packet socket needs CAP_NET_RAW")

ROUND_TRIPS = 400


async def _echo(requests, context):
    async for request in requests:
        yield request[:4]


async def test_windows_are_fixed_and_no_bandwidth_probes_ride_with_small_messages():
    server = grpc.aio.server(options=list(rpc.SERVER_OPTIONS))
    handler = grpc.stream_stream_rpc_method_handler(_echo)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Echo": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    with FrameTally("lo", port=port) as tally:
        async with rpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream("/test.Echo/Echo")()
            for _ in range(ROUND_TRIPS):  # a lockstep stream of 40 B messages, as an edge's Act stream of a few envs
                await call.write(b"a" * 40)
                await call.read()
            await call.done_writing()
            await asyncio.sleep(0.2)
        await server.stop(0)
    counts = tally.counts
    # Each message is one DATA frame: 9 B header + 5 B gRPC prefix + the message.
    assert counts.count_of("DATA") >= 2 * ROUND_TRIPS, dict(counts.frames)
    assert counts.bytes_of("DATA") >= ROUND_TRIPS * (14 + 40 + 14 + 4)
    assert counts.unparsed_bytes == 0
    assert counts.initial_windows.count(rpc.FLOW_CONTROL_WINDOW_BYTES) == 2, counts.initial_windows  # both ends
    # With gRPC's probing on, the same exchange carried 10 PING frames (probes and their acks). What may remain
    # is a connection's opening ping and its ack.
    assert counts.count_of("PING") <= 2, f"{counts.count_of('PING')} PING frames in {ROUND_TRIPS} round trips"
