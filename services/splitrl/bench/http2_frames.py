"""HTTP/2 frames on a network interface, counted by type: what the bytes between splitrl's messages are.

`FrameTally` reads every packet of one interface (a raw AF_PACKET socket: root, or CAP_NET_RAW), optionally
inside a named network namespace (`ip netns`) and only the TCP connections with a given port. Each direction of
each connection is followed from its SYN by sequence number and cut into HTTP/2 frames (RFC 9113, section 4.1:
9 B header + payload), so a frame split across segments or several frames in one segment are each counted once.
Plaintext IPv4 only: under TLS the frames are inside records.

What it does not read, counted in `unparsed_bytes`: connections whose SYN came before the tally started (or
carried data), and a connection's bytes after a segment that came early or never (the socket dropped it:
`dropped_packets`); bytes of a frame still incomplete when the tally ends are not counted at all. On loopback
each packet is seen once, as "in".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ETH_P_ALL = 0x0003
CLONE_NEWNET = 0x40000000
#: Linux socket options (socket(7), packet(7)) that Python's socket module does not name.
SO_RCVBUFFORCE = 33
SOL_PACKET, PACKET_STATISTICS = 263, 6
ETHERNET_HEADER_BYTES = 14
FRAME_HEADER_BYTES = 9
CLIENT_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: RFC 9113 section 6 (and 10 for the extension ids gRPC may send).
FRAME_TYPES = {
    0x0: "DATA",
    0x1: "HEADERS",
    0x2: "PRIORITY",
    0x3: "RST_STREAM",
    0x4: "SETTINGS",
    0x5: "PUSH_PROMISE",
    0x6: "PING",
    0x7: "GOAWAY",
    0x8: "WINDOW_UPDATE",
    0x9: "CONTINUATION",
}
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
_SYN, _FIN, _RST = 0x02, 0x01, 0x04


@dataclass
class _Direction:
    """One direction of one TCP connection: the next sequence number expected and the bytes not yet a frame."""

    next_seq: int | None
    pending: bytearray = field(default_factory=bytearray)
    started: bool = False  # the client preface (if any) has been looked for
    lost: bool = False


@dataclass
class FrameCounts:
    """Frames seen, by direction ("out": sent from the interface's side, "in": received) and type name."""

    frames: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Bytes of those frames, each with its 9 B header.
    frame_bytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: INITIAL_WINDOW_SIZE values announced in SETTINGS frames, in order.
    initial_windows: list[int] = field(default_factory=list)
    #: TCP payload bytes not cut into frames (connections seen mid-way, or with a segment missing).
    unparsed_bytes: int = 0
    #: Packets the kernel could not queue for the tally (its receive buffer was full).
    dropped_packets: int = 0

    def kinds(self) -> list[str]:
        """The frame types seen, either way, sorted."""
        return sorted({kind for _, kind in self.frames})

    def bytes_of(self, kind: str) -> int:
        return sum(b for (_, k), b in self.frame_bytes.items() if k == kind)

    def count_of(self, kind: str) -> int:
        return sum(n for (_, k), n in self.frames.items() if k == kind)


class FrameTally:
    """Counts HTTP/2 frames on `interface` while open (a context manager; counts in `counts` after exit).

    `namespace`: the `ip netns` name the interface lives in (None: this process's namespace). `port`: count only
    TCP connections with this port at either end (None: all).
    """

    def __init__(self, interface: str, namespace: str | None = None, port: int | None = None) -> None:
        self.interface, self.namespace, self.port = interface, namespace, port
        self.counts = FrameCounts()
        self._directions: dict[tuple[int, int, int, int], _Direction] = {}
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"frame-tally-{interface}", daemon=True)

    def __enter__(self) -> FrameTally:
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise RuntimeError(f"the frame tally on {self.interface} did not start within 10 s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            raise RuntimeError(f"the frame tally on {self.interface} did not stop within 30 s")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            if self.namespace is not None:
                _enter_namespace(self.namespace)  # this thread only: a network namespace is per thread
            sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            try:  # past net.core.rmem_max, which root may do: parsing in Python must not drop packets
                sniffer.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
            except PermissionError:
                sniffer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
            sniffer.bind((self.interface, 0))
            sniffer.settimeout(0.1)
        except BaseException as error:  # handed to the caller in __enter__
            self._error = error
            self._ready.set()
            return
        self._ready.set()
        try:
            with sniffer:
                while not self._stop.is_set():
                    self._read(sniffer)
                sniffer.setblocking(False)
                while self._read(sniffer):  # what was queued before the stop
                    pass
                tp_packets_and_drops = sniffer.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
                self.counts.dropped_packets = int.from_bytes(tp_packets_and_drops[4:8], sys.byteorder)
        except BaseException as error:  # handed to the caller in __exit__
            self._error = error

    def _read(self, sniffer: socket.socket) -> bool:
        """Take one packet; False when none came (a timeout, or none queued)."""
        try:
            packet, address = sniffer.recvfrom(1 << 17)
        except (TimeoutError, BlockingIOError):
            return False
        # Loopback shows each packet twice (out and in): count the inbound copy there.
        if not (self.interface == "lo" and address[2] == socket.PACKET_OUTGOING):
            self._take(packet, "out" if address[2] == socket.PACKET_OUTGOING else "in")
        return True

    def _take(self, packet: bytes, direction: str) -> None:
        ip = packet[ETHERNET_HEADER_BYTES:]
        if len(ip) < 40 or ip[0] >> 4 != 4 or ip[9] != socket.IPPROTO_TCP:
            return
        if int.from_bytes(ip[6:8], "big") & 0x3FFF:  # a fragment (MF set, or an offset): not seen on TCP here
            return
        ip_end = int.from_bytes(ip[2:4], "big")
        tcp = ip[(ip[0] & 0x0F) * 4 : ip_end]
        if len(tcp) < 20 or len(tcp) < (tcp[12] >> 4) * 4:
            return
        ports = int.from_bytes(tcp[0:2], "big"), int.from_bytes(tcp[2:4], "big")
        if self.port is not None and self.port not in ports:
            return
        key = (int.from_bytes(ip[12:16], "big"), ports[0], int.from_bytes(ip[16:20], "big"), ports[1])
        seq, flags = int.from_bytes(tcp[4:8], "big"), tcp[13]
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if flags & _SYN:
            self._directions[key] = _Direction(next_seq=(seq + 1) & 0xFFFFFFFF)
            return
        flow = self._directions.get(key)
        if flow is None:
            self.counts.unparsed_bytes += len(payload)
            return
        if payload:
            self._append(flow, seq, bytes(payload), direction)
        if flags & (_FIN | _RST):
            self._directions.pop(key, None)

    def _append(self, flow: _Direction, seq: int, payload: bytes, direction: str) -> None:
        assert flow.next_seq is not None
        behind = (flow.next_seq - seq) & 0xFFFFFFFF
        if behind and behind < 1 << 31:  # a retransmission: keep only what is new
            payload = payload[behind:]
            seq = flow.next_seq
        if flow.lost or seq != flow.next_seq:
            flow.lost = True
            self.counts.unparsed_bytes += len(payload)
            return
        flow.next_seq = (seq + len(payload)) & 0xFFFFFFFF
        flow.pending += payload
        if not flow.started:
            if len(flow.pending) < len(CLIENT_PREFACE) and CLIENT_PREFACE.startswith(bytes(flow.pending)):
                return
            if flow.pending.startswith(CLIENT_PREFACE):
                del flow.pending[: len(CLIENT_PREFACE)]
            flow.started = True
        self._cut_frames(flow, direction)

    def _cut_frames(self, flow: _Direction, direction: str) -> None:
        at, pending = 0, flow.pending
        while len(pending) - at >= FRAME_HEADER_BYTES:
            length = int.from_bytes(pending[at : at + 3], "big")
            end = at + FRAME_HEADER_BYTES + length
            if end > len(pending):
                break
            kind = FRAME_TYPES.get(pending[at + 3], f"type {pending[at + 3]}")
            self.counts.frames[(direction, kind)] += 1
            self.counts.frame_bytes[(direction, kind)] += FRAME_HEADER_BYTES + length
            if kind == "SETTINGS":
                self._read_settings(bytes(pending[at + FRAME_HEADER_BYTES : end]))
            at = end
        del pending[:at]

    def _read_settings(self, payload: bytes) -> None:
        for at in range(0, len(payload) - 5, 6):
            if int.from_bytes(payload[at : at + 2], "big") == SETTINGS_INITIAL_WINDOW_SIZE:
                self.counts.initial_windows.append(int.from_bytes(payload[at + 2 : at + 6], "big"))


def _enter_namespace(name: str) -> None:
    """Move the calling thread into network namespace `name` (as `ip netns exec` does for a process)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    with Path(f"/run/netns/{name}").open() as handle:
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into network namespace {name!r} failed")


def raw_sockets_allowed() -> bool:
    """Whether this process may open a raw packet socket (root or CAP_NET_RAW)."""
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL)).close()
    except (PermissionError, AttributeError, OSError):
        return False
    return True
