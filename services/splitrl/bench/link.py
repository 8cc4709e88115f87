"""Link microbenchmark: how many tensor messages per second one gRPC stream carries, against a raw TCP socket.

Both transports run between two processes on loopback (the receiver in a child
process, as a service would be), for a fixed time per message size:

- `grpc`: a client-streaming call of serialized `splitrl.v1.Tensor` messages,
  each parsed by the receiver as the services parse theirs;
- `grpc-wan`: the same with both ends set as splitrl's WAN links are (a fixed
  flow-control window, no bandwidth probing: core.rpc.WAN_FLOW_CONTROL);
- `tcp`: the same bytes, length-prefixed, on a plain socket, not parsed: the
  floor of what any framing on this machine can do.

Messages/s and MB/s are counted at the receiver; the ratio grpc/tcp is the
price of HTTP/2 + gRPC + protobuf over bare bytes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import struct
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Literal

import grpc
import numpy as np

from splitrl.core import rpc, wire

Transport = Literal["grpc", "grpc-wan", "tcp"]
_METHOD = "/splitrl.bench.LinkBench/Drain"
_FRAME = struct.Struct("<I")  # little-endian length prefix of each TCP message (bytes)


@dataclass(frozen=True)
class LinkResult:
    """What the receiver counted for one transport and message size over `seconds`."""

    transport: Transport
    message_bytes: int  # serialized size of one message (bytes)
    messages: int
    seconds: float

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def megabytes_per_s(self) -> float:
        return self.messages * self.message_bytes / self.seconds / 1e6

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self) | {"messages_per_s": self.messages_per_s, "megabytes_per_s": self.megabytes_per_s}


def tensor_message(size_bytes: int) -> bytes:
    """A serialized uint8 `Tensor` of exactly `size_bytes` bytes (random payload, so nothing compresses)."""
    if size_bytes < 16:
        raise ValueError(f"a tensor message needs at least 16 bytes, got {size_bytes}")
    rng = np.random.default_rng(0)
    elements = size_bytes - 16  # dtype, shape and length fields take a few bytes
    for _ in range(8):  # varint lengths change with the element count: converge on the exact size
        data = wire.encode(rng.integers(0, 256, elements, dtype=np.uint8)).SerializeToString()
        if len(data) == size_bytes:
            return data
        elements += size_bytes - len(data)
    raise ValueError(f"no uint8 tensor serializes to exactly {size_bytes} bytes")


def measure(transport: Transport, size_bytes: int, seconds: float) -> LinkResult:
    """Stream `size_bytes` messages for about `seconds` over `transport` to a receiver in a child process."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    message = tensor_message(size_bytes)
    context = multiprocessing.get_context("spawn")
    parent_end, child_end = context.Pipe()
    receiver = context.Process(target=_receive, args=(transport, child_end), daemon=True)
    receiver.start()
    try:
        if not parent_end.poll(60):
            raise RuntimeError(f"the {transport} receiver did not start")
        port = parent_end.recv()
        if transport != "tcp":
            asyncio.run(_send_grpc(port, message, seconds, wan=transport == "grpc-wan"))
        else:
            _send_tcp(port, message, seconds)
        if not parent_end.poll(60):
            raise RuntimeError(f"the {transport} receiver did not report")
        messages, elapsed = parent_end.recv()
    finally:
        receiver.join(10)
        if receiver.is_alive():
            receiver.kill()
    return LinkResult(transport, size_bytes, messages, elapsed)


async def _send_grpc(port: int, message: bytes, seconds: float, wan: bool) -> None:
    async with rpc.insecure_channel(f"127.0.0.1:{port}", wan=wan) as channel:
        await channel.channel_ready()
        call = channel.stream_unary(_METHOD)()  # bytes in, bytes out: the message is already serialized
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(64):  # check the clock every 64 writes, not every write
                await call.write(message)
        await call.done_writing()
        await call


def _send_tcp(port: int, message: bytes, seconds: float) -> None:
    framed = _FRAME.pack(len(message)) + message
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(64):
                sock.sendall(framed)
        sock.sendall(_FRAME.pack(0))  # end of stream
        sock.recv(1)  # wait until the receiver has read everything


def _receive(transport: Transport, pipe: Connection) -> None:
    """Child process: serve one stream on a loopback port, then report (messages, seconds) on `pipe`."""
    if transport != "tcp":
        asyncio.run(_receive_grpc(pipe, wan=transport == "grpc-wan"))
    else:
        _receive_tcp(pipe)


async def _receive_grpc(pipe: Connection, wan: bool) -> None:
    finished: asyncio.Future[tuple[int, float]] = asyncio.get_running_loop().create_future()

    async def drain(request_iterator: object, context: grpc.aio.ServicerContext) -> bytes:
        messages, started = 0, None
        async for data in request_iterator:  # type: ignore[attr-defined]
            started = started or time.perf_counter()
            wire.Tensor.FromString(data)  # parsed, as a service parses what it receives
            messages += 1
        finished.set_result((messages, time.perf_counter() - (started or time.perf_counter())))
        return b""

    handler = grpc.method_handlers_generic_handler(
        "splitrl.bench.LinkBench", {"Drain": grpc.stream_unary_rpc_method_handler(drain)}
    )
    server = grpc.aio.server(options=rpc.server_options(wan=wan))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pipe.send(port)
    pipe.send(await finished)
    await server.stop(1)


def _receive_tcp(pipe: Connection) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        pipe.send(listener.getsockname()[1])
        connection, _ = listener.accept()
        with connection, connection.makefile("rb", buffering=1 << 20) as stream:
            messages, started = 0, None
            while True:
                (length,) = _FRAME.unpack(stream.read(_FRAME.size))
                if length == 0:
                    break
                started = started or time.perf_counter()
                if len(stream.read(length)) != length:
                    raise ConnectionError("stream ended inside a message")
                messages += 1
            elapsed = time.perf_counter() - (started or time.perf_counter())
            connection.sendall(b"k")
    pipe.send((messages, elapsed))
