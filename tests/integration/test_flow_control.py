"""HTTP/2 flow control on splitrl's links, as the frames on the wire show it.

A real gRPC server and channel with splitrl's options exchange small lockstep messages on loopback while a
raw socket reads the frames of that one connection (its port): windows are announced at the fixed size
(rpc.FLOW_CONTROL_WINDOW_BYTES) and no bandwidth probes (PING frames) ride beside the messages.
Needs CAP_NET_RAW for the raw socket; skipped without it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest

from splitrl.core import rpc

ETH_P_ALL = 0x0003
#: HTTP/2 frame types (RFC 9113 section 6).
SETTINGS, PING = 0x4, 0x6
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
CLIENT_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _raw_socket() -> socket.socket | None:
    try:
        sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    except (PermissionError, AttributeError, OSError):
        return None
    sniffer.bind(("lo", 0))
    sniffer.settimeout(0.1)
    return sniffer


def _frames(segment: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each whole HTTP/2 frame in a TCP segment that starts at a frame boundary."""
    if segment.startswith(CLIENT_PREFACE):
        segment = segment[len(CLIENT_PREFACE) :]
    at = 0
    while at + 9 <= len(segment):
        length, kind = int.from_bytes(segment[at : at + 3], "big"), segment[at + 3]
        yield kind, segment[at + 9 : at + 9 + length]
        at += 9 + length


class _Sniffer:
    """Counts the frames of the TCP connection to `port` on lo, each packet once (its inbound copy)."""

    def __init__(self, sniffer: socket.socket, port: int) -> None:
        self.sniffer, self.port = sniffer, port
        self.kinds: Counter[int] = Counter()
        self.initial_windows: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Sniffer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sniffer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                packet, address = self.sniffer.recvfrom(1 << 17)
            except TimeoutError:
                continue
            if address[2] == socket.PACKET_OUTGOING or len(packet) < 34 or packet[23] != socket.IPPROTO_TCP:
                continue
            tcp = packet[14 + (packet[14] & 0x0F) * 4 :]
            ports = int.from_bytes(tcp[0:2], "big"), int.from_bytes(tcp[2:4], "big")
            if self.port not in ports:
                continue
            for kind, payload in _frames(tcp[(tcp[12] >> 4) * 4 :]):
                self.kinds[kind] += 1
                if kind == SETTINGS:
                    entries = (payload[i : i + 6] for i in range(0, len(payload) - 5, 6))
                    self.initial_windows += [
                        int.from_bytes(e[2:], "big")
                        for e in entries
                        if int.from_bytes(e[:2], "big") == SETTINGS_INITIAL_WINDOW_SIZE
                    ]


async def _echo(requests, context):
    async for request in requests:
        yield request[:4]


@pytest.fixture
def raw_socket():
    sniffer = _raw_socket()
    if sniffer is None:
        pytest.skip("a raw packet socket needs CAP_NET_RAW")
    return sniffer


async def test_windows_are_fixed_and_no_bandwidth_probes_ride_with_small_messages(raw_socket):
    server = grpc.aio.server(options=list(rpc.SERVER_OPTIONS))
    handler = grpc.stream_stream_rpc_method_handler(_echo)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Echo": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    with _Sniffer(raw_socket, port) as sniffed:
        async with rpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream("/test.Echo/Echo")()
            for _ in range(400):  # a lockstep stream of 40 B messages, as an edge's Act stream of a few envs
                await call.write(b"a" * 40)
                await call.read()
            await call.done_writing()
            await asyncio.sleep(0.2)
        await server.stop(0)
    assert sniffed.kinds[0x0] >= 800, f"the sniffer missed the messages: {dict(sniffed.kinds)}"
    assert rpc.FLOW_CONTROL_WINDOW_BYTES in sniffed.initial_windows, sniffed.initial_windows
    # With gRPC's probing on, the same exchange carried 10 PING frames (probes and their acks). What may remain
    # is a connection's opening ping and its ack.
    assert sniffed.kinds[PING] <= 2, f"{sniffed.kinds[PING]} PING frames in 400 round trips"
