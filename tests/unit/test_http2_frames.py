"""bench.http2_frames: TCP segments put back together and cut into HTTP/2 frames, fed synthetic packets."""

from __future__ import annotations

import itertools
import socket
import struct

from splitrl.bench.http2_frames import CLIENT_PREFACE, FrameTally

CLIENT, SERVER = ("10.0.0.1", 40000), ("10.0.0.2", 50051)
SYN, ACK, PSH = 0x02, 0x10, 0x08


def packet(source, destination, seq: int, payload: bytes = b"", flags: int = ACK | PSH) -> bytes:
    """An Ethernet + IPv4 + TCP packet (checksums left zero: the tally does not read them)."""
    tcp = struct.pack("!HHIIBBHHH", source[1], destination[1], seq, 0, 5 << 4, flags, 65535, 0, 0) + payload
    ip = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, socket.IPPROTO_TCP, 0,
        socket.inet_aton(source[0]), socket.inet_aton(destination[0]),
    )  # fmt: skip
    return b"\0" * 12 + b"\x08\x00" + ip + tcp


def frame(kind: int, payload: bytes, stream: int = 1) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, 0]) + stream.to_bytes(4, "big") + payload


def tally_of(packets: list[bytes], port: int | None = None) -> FrameTally:
    tally = FrameTally("unused", port=port)
    for one in packets:
        tally._take(one, "out")
    return tally


def test_frames_split_across_segments_and_packed_together_are_each_counted_once():
    data = frame(0x0, b"\0\0\0\0\x0bhello world")
    window_update = frame(0x8, (1000).to_bytes(4, "big"))
    settings = frame(0x4, (4).to_bytes(2, "big") + (8 << 20).to_bytes(4, "big"), stream=0)
    stream = CLIENT_PREFACE + settings + data + window_update + data
    cut = [0, 10, 30, 31, 60, len(stream)]  # the preface and frames cut at odd places
    packets = [packet(CLIENT, SERVER, 999, flags=SYN)]
    packets += [packet(CLIENT, SERVER, 1000 + a, stream[a:b]) for a, b in itertools.pairwise(cut)]
    counts = tally_of(packets).counts
    assert counts.frames[("out", "DATA")] == 2 and counts.frame_bytes[("out", "DATA")] == 2 * len(data)
    assert counts.count_of("WINDOW_UPDATE") == 1 and counts.bytes_of("WINDOW_UPDATE") == 13
    assert counts.initial_windows == [8 << 20]
    assert counts.unparsed_bytes == 0


def test_a_retransmission_counts_once_and_a_gap_stops_parsing_that_connection():
    ping = frame(0x6, b"\0" * 8, stream=0)
    packets = [
        packet(SERVER, CLIENT, 4999, flags=SYN | ACK),
        packet(SERVER, CLIENT, 5000, ping),
        packet(SERVER, CLIENT, 5000, ping + ping),  # the first again, with one more
        packet(SERVER, CLIENT, 5000 + 3 * len(ping) + 1, ping),  # a segment after one that was missed
    ]
    counts = tally_of(packets).counts
    assert counts.count_of("PING") == 2
    assert counts.unparsed_bytes == len(ping)


def test_connections_seen_mid_way_or_on_other_ports_are_not_read_as_frames():
    data = frame(0x0, b"\0\0\0\0\x01x")
    mid_way = tally_of([packet(CLIENT, SERVER, 7, data)])
    assert not mid_way.counts.frames and mid_way.counts.unparsed_bytes == len(data)
    other_port = tally_of([packet(CLIENT, SERVER, 1, flags=SYN), packet(CLIENT, SERVER, 2, data)], port=443)
    assert not other_port.counts.frames and other_port.counts.unparsed_bytes == 0


def test_sequence_numbers_wrap_past_two_to_the_32():
    data = frame(0x0, b"\0\0\0\0\x03abc")
    start = (1 << 32) - 5  # the first data byte is 4 before the wrap: the frame straddles it
    packets = [
        packet(CLIENT, SERVER, start - 1, flags=SYN),
        packet(CLIENT, SERVER, start, data[:10]),
        packet(CLIENT, SERVER, (start + 10) & 0xFFFFFFFF, data[10:] + data),
    ]
    counts = tally_of(packets).counts
    assert counts.count_of("DATA") == 2 and counts.unparsed_bytes == 0


def test_malformed_and_fragmented_packets_are_passed_over():
    good = packet(CLIENT, SERVER, 1, flags=SYN)
    long_header = bytearray(good)
    long_header[14] = 0x4F  # an IPv4 header length (60 B) longer than what follows it
    fragment = bytearray(good)
    fragment[14 + 6] = 0x20  # more fragments
    tally = tally_of([bytes(long_header), bytes(fragment), b"\0" * 20, good[:40]])
    assert not tally.counts.frames and tally.counts.unparsed_bytes == 0
