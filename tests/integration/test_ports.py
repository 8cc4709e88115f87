"""A service told to listen where it cannot (a port another process holds, an address not of this machine)
stops at start-up with a message naming the address, the operating system's reason and the flag to change;
`splitrl serve` prints it without a traceback and exits 1."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from splitrl.core.metrics import Metrics
from splitrl.core.ports import PortUnavailable
from splitrl.core.service import ServiceHost
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from tests.ports import free_port


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another socket listens on for the test's length."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


async def start_replay(**settings) -> ServiceHost:
    replay_settings = ReplaySettings(tls="plaintext", **settings)
    metrics = Metrics(CollectorRegistry())
    return await ServiceHost.start(ReplayService(replay_settings, metrics), replay_settings, metrics)


async def test_a_grpc_port_in_use_is_named_with_the_reason_and_the_flag(held_port):
    with pytest.raises(PortUnavailable) as error:
        await start_replay(port=held_port)
    message = str(error.value)
    assert f"cannot serve gRPC on 127.0.0.1:{held_port}: Address already in use" in message, message
    assert "--port" in message and "another process" in message


async def test_a_metrics_port_in_use_is_named_and_the_grpc_port_is_let_go(held_port):
    grpc_port = free_port()
    with pytest.raises(PortUnavailable) as error:
        await start_replay(port=grpc_port, metrics_port=held_port)
    message = str(error.value)
    assert f"cannot serve /metrics on 127.0.0.1:{held_port}: Address already in use" in message, message
    assert "--metrics-port" in message
    host = await start_replay(port=grpc_port)  # the server that had bound it stopped: the port is free again
    await host.stop()


async def test_an_address_not_of_this_machine_points_at_host():
    with pytest.raises(PortUnavailable) as error:
        await start_replay(host="192.0.2.1")  # TEST-NET-1: never a local address, nothing is sent to it
    message = str(error.value)
    assert "cannot serve gRPC on 192.0.2.1:0: Cannot assign requested address" in message, message
    assert "--host" in message


async def test_an_ipv6_host_is_served_bracketed_or_bare_and_named_bracketed() -> None:
    holder = socket.socket(socket.AF_INET6)
    try:
        holder.bind(("::1", 0))
    except OSError:
        holder.close()
        pytest.skip("no IPv6 loopback here")
    with holder:
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortUnavailable, match=rf"cannot serve gRPC on \[::1\]:{port}: Address already in use"):
            await start_replay(host="::1", port=port)
    for host in ("::1", "[::1]"):
        started = await start_replay(host=host)
        await started.stop()


def test_splitrl_serve_says_so_and_exits_1_without_a_traceback(held_port):
    result = subprocess.run(
        [sys.executable, "-m", "splitrl.cli.main", "serve", "replay", "--tls", "plaintext", "--port", str(held_port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert f"splitrl serve replay: cannot serve gRPC on 127.0.0.1:{held_port}: Address already in use" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
