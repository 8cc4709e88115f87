"""Running one service: gRPC server, /metrics endpoint, readiness, graceful shutdown.

A service implements the small `Service` protocol; `ServiceHost` owns
everything around it, the same way for all five services.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest

from splitrl.core import authz, ports, rpc, security
from splitrl.core.config import ServerSettings
from splitrl.core.metrics import Metrics
from splitrl.core.state_files import EXIT_CANNOT_WRITE, cannot_write, write_atomic

log = logging.getLogger(__name__)

#: Seconds beyond shutdown_grace_s that a stopping service process gets to flush (replay's last snapshot,
#: checkpoints) before it is ended anyway: SIGTERM always ends the process within grace + this margin.
SHUTDOWN_MARGIN_S = 5.0
#: Seconds a stopping service waits, once its server has stopped, for calls that ended to finish unwinding.
CALL_UNWIND_S = 2.0


class Service(Protocol):
    """What a service provides to its host."""

    #: Fully qualified gRPC service names it serves (for health and reflection).
    service_names: Sequence[str]
    #: Whether edges dial this server across the WAN (inference, learner): its links then get the WAN's flow
    #: control (rpc.WAN_FLOW_CONTROL).
    serves_wan: bool

    def register(self, server: grpc.aio.Server) -> None:
        """Add servicers to the (not yet started) server."""

    async def start(self) -> None:
        """Start background work (clients, loops). Called after the server is listening."""

    async def stop(self) -> None:
        """Stop background work and flush what must not be lost."""

    def finished(self) -> asyncio.Event | None:
        """An event set when the service has completed its job on its own (None: runs until stopped)."""

    def failure(self) -> BaseException | None:
        """Why the service's own work failed, if it did (the process then exits with status 1, or with
        state_files.EXIT_CANNOT_WRITE if the disk refused a write)."""


#: Seconds between repeated cancellations of a background loop that did not end (see BackgroundLoop.cancel).
CANCEL_RETRY_S = 0.5


class BackgroundLoop:
    """The one long-running coroutine a service runs beside its server (the env loop, the training loop).

    `done` is set however the loop ends; `failure` records the exception if it ended by one
    (cancellation is a stop, not a failure). Services expose both through `finished()` / `failure()`.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = asyncio.Event()
        self.failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, work: Callable[[], Awaitable[None]]) -> None:
        self._task = asyncio.create_task(self._guarded(work), name=self.name)

    async def cancel(self) -> None:
        """Stop the loop if it is still running and wait until it has.

        The cancellation is repeated until the task ends: on Python 3.11 `asyncio.wait_for` swallows a
        cancellation that arrives as its inner future completes, and a redial loop would then run on.
        """
        while self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=CANCEL_RETRY_S)

    async def _guarded(self, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self.failure = error
            log.exception("%s failed", self.name)
        finally:
            self.done.set()


class LoopService(abc.ABC):
    """A service whose work is one BackgroundLoop running `run()` beside its server (environment, learner):
    it starts the loop, and is finished, or failed, when the loop is. Subclasses set `self.loop` and stop it."""

    loop: BackgroundLoop

    @abc.abstractmethod
    async def run(self) -> None:
        """The service's whole work; returning ends it (finished), raising fails it."""

    def finished(self) -> asyncio.Event:
        return self.loop.done

    def failure(self) -> BaseException | None:
        return self.loop.failure

    async def start(self) -> None:
        self.loop.start(self.run)


@dataclass
class ServiceHost:
    """A started service. `grpc_port` / `metrics_port` are the bound ports (useful when 0 was asked for)."""

    service: Service
    settings: ServerSettings
    metrics: Metrics
    server: grpc.aio.Server
    grpc_port: int
    metrics_port: int
    _http: object = field(repr=False)
    _health: object = field(repr=False)
    _calls: rpc.CallTasks = field(repr=False)
    #: Re-reads the deny list (authz.RoleInterceptor.watch) while serving; None without one.
    _deny_list_watch: asyncio.Task[None] | None = field(repr=False)
    #: What the host is doing, for the shutdown deadline's log line when something hangs.
    stage: str = "serving"
    #: A write the shutdown could not make (the final metrics file): the process then exits EXIT_CANNOT_WRITE.
    write_error: OSError | None = None

    @classmethod
    async def start(cls, service: Service, settings: ServerSettings, metrics: Metrics) -> ServiceHost:
        transport = security.load(settings)  # before anything starts: bad TLS settings fail here, clearly
        roles = _role_interceptor(settings, transport.mode, metrics)
        server, health_servicer, calls = await rpc.create_server(
            metrics,
            service.service_names,
            transport.token,
            wan=service.serves_wan,
            roles=roles,
            serve_reflection=settings.reflection,
        )
        service.register(server)
        grpc_port = ports.bind_grpc(server, settings.host, settings.port, security.server_credentials(settings))
        await server.start()
        try:
            http = ports.serve_metrics(settings.host, settings.metrics_port, metrics.registry)
        except ports.PortUnavailable:
            await server.stop(None)
            raise
        metrics_port = http.server_port
        watcher = None
        if roles is not None and settings.deny_list_file is not None:
            watcher = asyncio.create_task(roles.watch(settings.deny_list_poll_s), name="deny list")
        await service.start()
        await rpc.set_serving(health_servicer, service.service_names, serving=True)
        host = cls(service, settings, metrics, server, grpc_port, metrics_port, http, health_servicer, calls, watcher)
        if settings.port_file is not None:  # atomic: a reader never sees half a file
            ports_json = json.dumps({"grpc": grpc_port, "metrics": metrics_port, "pid": os.getpid()}).encode()
            write_atomic(settings.port_file, lambda file: file.write(ports_json), durable=False)
        log.info(
            "serving %s on %s:%d (%s%s), metrics on :%d",
            ",".join(service.service_names) or "(health only)",
            settings.host,
            grpc_port,
            transport.mode,
            ", bearer token" if transport.token else "",
            metrics_port,
        )
        return host

    async def stop(self) -> None:
        """Report NOT_SERVING, drain in-flight calls (background work still serves them), then stop that work."""
        self.stage = "draining in-flight calls"
        if self._deny_list_watch is not None:
            self._deny_list_watch.cancel()
        await self._health.enter_graceful_shutdown()  # type: ignore[attr-defined]
        await self.server.stop(self.settings.shutdown_grace_s)
        self.stage = "letting ended calls unwind"
        unfinished = await self._calls.wait(CALL_UNWIND_S)
        if unfinished:
            log.warning("%d ended call(s) still unwinding after %.1fs; stopping anyway", unfinished, CALL_UNWIND_S)
        self.stage = f"{type(self.service).__name__}.stop (flushing its work)"
        await self.service.stop()
        unserved = self.metrics.unexported_in_use()
        if unserved:  # a slip in metrics.SERVICE_FAMILIES: these were counted, never served
            log.warning("metric families updated but not exported by this service: %s", ", ".join(unserved))
        self.stage = "writing final metrics"
        if self.settings.final_metrics_file is not None:
            text = generate_latest(self.metrics.registry)
            try:  # whole or not at all: a reader falls back to the last scrape of a missing one
                write_atomic(self.settings.final_metrics_file, lambda file: file.write(text), durable=False)
            except OSError as error:  # the counters are lost, the rest of the shutdown is not
                log.error("cannot write the final metrics to %s: %s", self.settings.final_metrics_file, error)
                self.write_error = error
        self.stage = "closing /metrics"
        self._http.shutdown()  # type: ignore[attr-defined]
        self._http.server_close()  # type: ignore[attr-defined]
        self.stage = "exiting (waiting for worker threads)"


def _role_interceptor(settings: ServerSettings, mode: str, metrics: Metrics) -> authz.RoleInterceptor | None:
    """Roles are enforced under mtls, the one mode in which a caller is known; otherwise this says so loudly."""
    deny_list = authz.deny_list_for(settings.deny_list_file, mode)
    if deny_list is not None:
        return authz.RoleInterceptor(metrics, deny_list)
    log.warning(
        "NO AUTHORISATION (--tls %s): without client certificates any peer that reaches this port may call any "
        "of its RPCs; use --tls mtls with `splitrl certs` certificates",
        mode,
    )
    return None


class ShutdownDeadline:
    """Ends the process with status 1 if it is still alive `limit_s` after shutdown began, whatever hangs.

    A daemon timer thread, so it fires even when the event loop is blocked or the interpreter is
    joining a stuck worker thread at exit; it logs the host's stage, so the log says what did not finish.
    """

    def __init__(self, limit_s: float, stage: Callable[[], str]) -> None:
        self.limit_s, self._stage = limit_s, stage
        self._timer = threading.Timer(limit_s, self._expire)
        self._timer.daemon = True

    def arm(self) -> None:
        self._timer.start()

    def _expire(self) -> None:
        log.error("shutdown did not finish within %.1fs; still %s; exiting now", self.limit_s, self._stage())
        logging.shutdown()  # flush the line above: os._exit skips every handler
        os._exit(1)


def configure_process(settings: ServerSettings) -> None:
    """Process-wide set-up every service entry point does first: logging, CPU niceness and torch threads.

    torch is set up only where it is loaded: a service's module imports it before this runs, and the
    environment service, which never runs a network, does not load it at all (a small edge)."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lower_priority(settings.nice)  # early: threads started later inherit their creator's niceness
    # No NAME_created series beside each counter, histogram and summary: nothing reads them, and they were 8-17%
    # of every /metrics text that each scrape writes and every reader parses.
    prometheus_client.disable_created_metrics()
    torch = sys.modules.get("torch")
    if torch is None:
        return
    torch.set_num_threads(settings.torch_threads)
    with contextlib.suppress(RuntimeError):  # only settable before any parallel work ran
        torch.set_num_interop_threads(1)


def run_service(build: Callable[[Metrics], Service], settings: ServerSettings, name: str | None = None) -> int:
    """A service process's whole life: set up, serve until signalled or finished, shut down; the exit status.
    `name`: the service's (metrics.SERVICE_FAMILIES: the families its /metrics serves; None: all)."""
    configure_process(settings)
    # What this process was told, wherever it came from (flags, SPLITRL_* variables, a recipe): one line.
    log.info("settings (those not at their defaults): %s", settings.model_dump_json(exclude_defaults=True))
    return asyncio.run(serve_until_signalled(build, settings, name, deadline=True))


async def serve_until_signalled(
    build: Callable[[Metrics], Service],
    settings: ServerSettings,
    name: str | None = None,
    *,
    deadline: bool = False,
) -> int:
    """Build the service, run it until SIGTERM/SIGINT or until it finishes by itself, then stop it.

    Returns 0, or 1 if the service reports a failure of its own work, or EXIT_CANNOT_WRITE if a write to disk
    failed (its work's, or the shutdown's: a checkpoint, the final metrics), logged in one line. With
    `deadline` (a service process, not a test sharing its process) the process is ended, status 1, if stopping
    takes longer than shutdown_grace_s + SHUTDOWN_MARGIN_S (ShutdownDeadline). `name`: as in run_service.
    """
    metrics = Metrics(CollectorRegistry(), name)
    service = build(metrics)
    host = await ServiceHost.start(service, settings, metrics)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    waiters = [asyncio.create_task(stop.wait())]
    finished = service.finished()
    if finished is not None:
        waiters.append(asyncio.create_task(finished.wait()))
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
    log.info("shutting down (grace %.1fs)", settings.shutdown_grace_s)
    if deadline:
        ShutdownDeadline(settings.shutdown_grace_s + SHUTDOWN_MARGIN_S, lambda: host.stage).arm()
    try:
        await host.stop()
    except OSError as error:
        if not cannot_write(error):
            raise
        log.error("cannot write while shutting down (%s): %s", host.stage, error)
        return EXIT_CANNOT_WRITE
    failure = service.failure()
    if host.write_error is not None or (failure is not None and cannot_write(failure)):
        return EXIT_CANNOT_WRITE
    return 0 if failure is None else 1


AUTOGROUP = Path("/proc/self/autogroup")


def lower_priority(nice: int) -> None:
    """Run this process at CPU niceness `nice` (0-19) or above; 0 leaves it as it is. Linux keeps a niceness
    per thread: every thread running now is set (imports start some), and threads started later inherit it.

    With Linux's autogroup a niceness counts only against the processes of its own session, and `splitrl up`
    starts each service as a session of its own: a service that leads its session also sets that session's
    niceness (AUTOGROUP), which is what weighs it against the other services. A service that does not lead
    its session (started from a shell) leaves the shell's session as it is. Raising niceness needs no privilege.
    """
    if nice <= 0:
        return
    for thread_id in _thread_ids():
        with contextlib.suppress(ProcessLookupError):  # a thread that has ended meanwhile
            if nice > os.getpriority(os.PRIO_PROCESS, thread_id):
                os.setpriority(os.PRIO_PROCESS, thread_id, nice)
    if os.getsid(0) != os.getpid():
        return
    current = session_niceness()
    if current is None or nice <= current:
        return
    try:
        AUTOGROUP.write_text(f"{nice}\n")
    except OSError as error:
        log.debug("session niceness left at %d (%s): %s", current, AUTOGROUP, error)


def session_niceness() -> int | None:
    """The niceness of this process's autogroup (its session's CPU group), or None where none applies.

    AUTOGROUP reads "/autogroup-N nice K". It is absent on kernels without autogroup, and empty for a
    process that its launcher put in a cgroup of its own (a CI runner, a container): the kernel then
    weighs that cgroup, not the session, and there is no session niceness to read or set.
    """
    try:
        _, word, value = AUTOGROUP.read_text().split()  # ValueError: not three fields (empty, say)
        return int(value) if word == "nice" else None
    except (OSError, ValueError):
        return None


def _thread_ids() -> list[int]:
    """This process's threads (Linux's /proc/self/task), or 0 (the calling thread) where there is no /proc."""
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        return [0]
