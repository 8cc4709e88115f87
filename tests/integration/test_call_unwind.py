"""A stopping service lets calls that ended finish unwinding before its event loop closes.

gRPC's `Server.stop` returns once its core holds no live call; a handler whose peer has just gone can still
be running in Python then. If the loop closes first, asyncio cancels gRPC's task for that call and gRPC prints
"Exception not handled by _handle_exceptions" with a CancelledError traceback (the docs' one-by-one services
example, docs/how-to/services.md, can hit it). rpc.CallTasks notes each call's task; ServiceHost.stop waits for them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from splitrl.core import rpc
from splitrl.core.config import ServerSettings
from splitrl.core.metrics import Metrics
from splitrl.core.service import ServiceHost

REPO = Path(__file__).resolve().parents[2]
#: How long the test handler takes to unwind once gRPC cancels it (seconds): well under CALL_UNWIND_S.
UNWIND_S = 0.3


class SlowToUnwind:
    """A service with one stream method whose handler, cancelled when its client goes away, takes UNWIND_S
    to finish (a learner's Train call flushing its edge's state, say). `events` records the order of things."""

    service_names = ("test.Slow",)
    serves_wan = False

    def __init__(self) -> None:
        self.events: list[str] = []
        self.handler_started = asyncio.Event()

    def register(self, server: grpc.aio.Server) -> None:
        handler = grpc.stream_stream_rpc_method_handler(self._hold)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Slow", {"Hold": handler}),))

    async def _hold(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        self.handler_started.set()
        try:
            await asyncio.Event().wait()  # until gRPC cancels the call: its client went away
        except asyncio.CancelledError:
            await asyncio.sleep(UNWIND_S)
            self.events.append("handler unwound")
            raise

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.events.append("service stopped")

    def finished(self) -> asyncio.Event | None:
        return None

    def failure(self) -> BaseException | None:
        return None


async def test_a_call_whose_client_went_away_finishes_unwinding_before_the_service_stops():
    service = SlowToUnwind()
    settings = ServerSettings(tls="plaintext", shutdown_grace_s=5.0)
    host = await ServiceHost.start(service, settings, Metrics(CollectorRegistry()))  # type: ignore[arg-type]
    async with rpc.insecure_channel(f"127.0.0.1:{host.grpc_port}") as channel:
        call = channel.stream_stream("/test.Slow/Hold")()
        await call.write(b"x")
        await asyncio.wait_for(service.handler_started.wait(), timeout=10)
        call.cancel()
    await host.stop()
    assert service.events == ["handler unwound", "service stopped"]


RACE = textwrap.dedent(
    """
    import asyncio, sys
    import grpc
    from splitrl.core import rpc
    from splitrl.core.metrics import Metrics
    from prometheus_client import CollectorRegistry

    async def main(wait_for_calls):
        release = asyncio.get_running_loop().create_future()

        async def hold(requests, context):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await release  # still unwinding when the server has stopped
                raise

        server, _, calls = await rpc.create_server(Metrics(CollectorRegistry()), ())
        handler = grpc.stream_stream_rpc_method_handler(hold)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Slow", {"Hold": handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with rpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream("/test.Slow/Hold")()
            await call.write(b"x")
            await asyncio.sleep(0.2)
            call.cancel()
            await server.stop(5)
        release.set_result(None)  # the handler ends in the loop's next turn...
        if wait_for_calls:
            assert await calls.wait(2.0) == 0
        # ...and without the wait, that turn is the loop's last: asyncio.run then cancels gRPC's task for it

    asyncio.run(main(sys.argv[1] == "wait"))
    """
)


@pytest.mark.parametrize("wait_for_calls", [True, False], ids=["waited-for", "control-not-waited-for"])
def test_a_process_that_waits_for_its_calls_prints_no_cancelled_traceback(wait_for_calls):
    """The control shows the race is real with this gRPC: the same process without the wait prints it."""
    result = subprocess.run(
        [sys.executable, "-c", RACE, "wait" if wait_for_calls else "no-wait"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    printed_the_traceback = "CancelledError" in result.stderr
    assert printed_the_traceback is not wait_for_calls, result.stderr
