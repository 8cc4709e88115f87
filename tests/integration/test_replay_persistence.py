"""Nothing acknowledged is lost: a real replay process with --data-dir, SIGKILLed or SIGTERMed, restarted.

Each test runs `splitrl serve replay` as a subprocess on a loopback port and talks to it over gRPC.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from splitrl.core import scrape
from splitrl.core.args import to_argv
from splitrl.core.service import SHUTDOWN_MARGIN_S
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import replay_pb2, replay_pb2_grpc
from tests.chunks import tiny_chunk

#: Plaintext where the settings know TLS (loopback only; the TLS tests live elsewhere).
TLS: dict[str, Any] = {"tls": "plaintext"} if "tls" in ReplaySettings.model_fields else {}
START_TIMEOUT_S = 30.0


def chunk(marker: int) -> replay_pb2.Trajectory:
    return tiny_chunk(8, marker=marker, features=64)


class ReplayProcess:
    """`splitrl serve replay` in a subprocess; `start` waits for its port file."""

    def __init__(self, tmp_path: Path, data_dir: Path, port: int = 0, **flags: Any) -> None:
        self.port_file = tmp_path / "replay.ports.json"
        self.port_file.unlink(missing_ok=True)
        self.log = tmp_path / "replay.log"
        flags = {"port": port, "port_file": self.port_file, "data_dir": data_dir, "fsync": "never", **TLS, **flags}
        command = [sys.executable, "-m", "splitrl.cli.main", "serve", "replay", *to_argv(flags)]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.port_file.exists():
            assert self.process.poll() is None, f"replay exited {self.process.returncode}: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"replay did not start: {self.log.read_text()}"
            time.sleep(0.05)
        ports = json.loads(self.port_file.read_text())
        self.port, self.metrics_port = ports["grpc"], ports["metrics"]

    def stop(self, signum: int) -> int:
        self.process.send_signal(signum)
        return self.process.wait(timeout=60)

    def kill_if_running(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def processes():
    started: list[ReplayProcess] = []
    yield started
    for process in started:
        process.kill_if_running()


async def insert_all(stub: replay_pb2_grpc.ReplayStub, requests: list[replay_pb2.InsertRequest]) -> list:
    """Stream `requests` pipelined; return their acknowledgements (raises the stream's error)."""
    call = stub.Insert()
    for request in requests:
        await call.write(request)
    acks = [await asyncio.wait_for(call.read(), 10) for _ in requests]
    await call.done_writing()
    return acks


def request(sequence: int, writer: str = "inference-1") -> replay_pb2.InsertRequest:
    return replay_pb2.InsertRequest(table="rollouts", sequence=sequence, writer_id=writer, trajectory=chunk(sequence))


async def table_info(stub: replay_pb2_grpc.ReplayStub) -> replay_pb2.TableInfo:
    return (await stub.Info(replay_pb2.InfoRequest(), timeout=5)).tables[0]


async def test_sigkill_loses_no_acknowledged_insert_and_resends_are_deduplicated(tmp_path, processes):
    data = tmp_path / "data"
    first = ReplayProcess(tmp_path, data, max_size=1000)
    processes.append(first)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{first.port}") as channel:
        stub = replay_pb2_grpc.ReplayStub(channel)
        acks = await insert_all(stub, [request(s) for s in range(200)])
        assert [a.key for a in acks] == list(range(200))
        sampled = await stub.Sample(replay_pb2.SampleRequest(table="rollouts", num_items=30), timeout=5)
        assert [item.key for item in sampled.items] == list(range(30))  # fifo: handed out once, gone
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL

    second = ReplayProcess(tmp_path, data, port=first.port, max_size=1000)  # same port: writers just redial
    processes.append(second)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{second.port}") as channel:
        stub = replay_pb2_grpc.ReplayStub(channel)
        info = await table_info(stub)
        assert (info.inserts, info.samples, info.size) == (200, 30, 170)
        # The writer lost its last 5 acks: it re-sends 195..199, then goes on with 200.
        acks = await insert_all(stub, [request(s) for s in range(195, 201)])
        assert [(a.key, a.duplicate) for a in acks] == [(k, True) for k in range(195, 200)] + [(200, False)]
        # A new writer (a restarted inference) starts at 0.
        (ack,) = await insert_all(stub, [request(0, writer="inference-2")])
        assert (ack.key, ack.duplicate) == (201, False)
        # A sequence that skips ahead is refused, clearly; replay keeps serving.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await insert_all(stub, [request(205)])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "skips ahead" in refused.value.details() and "201" in refused.value.details()
        (ack,) = await insert_all(stub, [request(201)])
        assert (ack.key, ack.duplicate) == (202, False)
        info = await table_info(stub)
        assert (info.inserts, info.size) == (203, 173)
        sampled = await stub.Sample(replay_pb2.SampleRequest(table="rollouts", num_items=1), timeout=5)
        assert sampled.items[0].key == 30  # fifo order survived the restart
        assert sampled.items[0].trajectory == chunk(30)
    text = scrape.fetch(second.metrics_port)
    assert 'splitrl_replay_acknowledged_items{table="rollouts"} 203.0' in text
    assert 'splitrl_replay_duplicate_inserts_total{table="rollouts"} 5.0' in text
    assert 'splitrl_rejected_requests_total{code="INVALID_ARGUMENT",method="Insert"} 1.0' in text
    assert second.stop(signal.SIGTERM) == 0


async def test_sigterm_mid_load_exits_in_time_and_restores_every_ack(tmp_path, processes):
    data, grace = tmp_path / "data", 1.0
    first = ReplayProcess(tmp_path, data, max_size=100_000, fsync="always", shutdown_grace_s=grace)
    processes.append(first)
    acked: list[int] = []

    async def load(stub: replay_pb2_grpc.ReplayStub) -> None:
        call = stub.Insert()
        try:
            for sequence in range(100_000):  # bounded; SIGTERM ends it long before
                await call.write(request(sequence))
                acked.append((await call.read()).key)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, AttributeError):
            return  # the server went away mid-stream: what was acknowledged is in `acked`

    async with grpc.aio.insecure_channel(f"127.0.0.1:{first.port}") as channel:
        loader = asyncio.ensure_future(load(replay_pb2_grpc.ReplayStub(channel)))
        deadline = time.monotonic() + 20
        while len(acked) < 100:
            assert time.monotonic() < deadline and not loader.done(), "no load reached replay"
            await asyncio.sleep(0.02)
        stopping = time.monotonic()
        first.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(first.process.wait, 60)
        took = time.monotonic() - stopping
        await asyncio.wait_for(loader, 10)
    assert code == 0, first.log.read_text()
    assert took < grace + SHUTDOWN_MARGIN_S, f"SIGTERM took {took:.1f}s"
    assert acked == list(range(len(acked)))
    assert not list(data.glob("log-*.wal")), "a graceful stop leaves a snapshot that covers the whole log"

    second = ReplayProcess(tmp_path, data, max_size=100_000)
    processes.append(second)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{second.port}") as channel:
        info = await table_info(replay_pb2_grpc.ReplayStub(channel))
    assert info.inserts >= len(acked)  # every ack restored (one more may have been stored, its ack lost)
    assert info.size == info.inserts
    assert second.stop(signal.SIGTERM) == 0


HANGING_SERVICE = """
import time, sys
from splitrl.core.config import ServerSettings
from splitrl.core.service import run_service

class Hangs:
    service_names = ()
    serves_wan = False
    def register(self, server): pass
    async def start(self): pass
    async def stop(self): time.sleep(3600)  # blocks the event loop itself: only a thread can end this
    def finished(self): return None
    def failure(self): return None

settings = ServerSettings(port_file=sys.argv[1], shutdown_grace_s=0.5, **TLS)
sys.exit(run_service(lambda metrics: Hangs(), settings))
"""


def test_a_hanging_stop_still_ends_the_process_within_the_deadline(tmp_path):
    port_file = tmp_path / "ports.json"
    script = f"TLS = {TLS!r}\n" + HANGING_SERVICE
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(port_file)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read().decode()
            time.sleep(0.05)
        stopping = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        took = time.monotonic() - stopping
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = process.stdout.read().decode()
    assert code == 1, output
    assert 0.5 + SHUTDOWN_MARGIN_S - 0.5 < took < 0.5 + SHUTDOWN_MARGIN_S + 3, took
    assert "shutdown did not finish within 5.5s; still Hangs.stop (flushing its work)" in output
