"""Service processes of a local run: start one, wait until it serves, stop them all, keep them alive.

`splitrl up` and `splitrl bench framing` start every service as its own
process (`splitrl serve NAME` with the flags of its planned settings,
splitrl.run.plan), logging to RUN_DIR/logs/NAME.log. A child dies with its
parent (PR_SET_PDEATHSIG). `Supervisor` restarts a service that dies mid-run,
as compose and Kubernetes restart a crashed container.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from splitrl.core import scrape
from splitrl.core.args import env_name, settings_argv
from splitrl.core.backoff import Backoff
from splitrl.core.config import ServerSettings
from splitrl.core.state_files import EXIT_CANNOT_WRITE, EXIT_CORRUPT_STATE
from splitrl.run.plan import amended, service_of


@dataclass
class Child:
    """One service process; `ports` ({"grpc": N, "metrics": N, "pid": N}) are read from `port_file` once it serves."""

    name: str
    process: subprocess.Popen[bytes]
    port_file: Path
    ports: dict[str, int] = field(default_factory=dict)


def serving_addresses(children: Mapping[str, Child], hosts: Mapping[str, str] | None = None) -> dict[str, str]:
    """host:port of each started service, for `plan` (hosts: where each is dialled, 127.0.0.1 unless given)."""
    hosts = hosts or {}
    return {name: f"{hosts.get(name, '127.0.0.1')}:{child.ports['grpc']}" for name, child in children.items()}


def _die_with_parent() -> None:
    """Runs in the child before exec: ask the kernel for SIGTERM when the parent dies (Linux only)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def spawn(
    name: str, settings: ServerSettings, run_dir: Path, prefix: Sequence[str] = (), append_log: bool = False
) -> Child:
    """Start instance `name` (a service, or a replica of one: run.plan.instance_names) as its own process with
    `settings` (a port_file is required); it is stopped with the others even if it never becomes ready.

    `prefix` goes before the command, e.g. ("ip", "netns", "exec", NS), which execs in place (same pid).
    `append_log`: a restart adds to the service's log instead of replacing it.
    """
    port_file = settings.port_file
    if port_file is None:
        raise ValueError(f"{name}: a spawned service needs a port_file to say it serves")
    command = [*prefix, sys.executable, "-m", "splitrl.cli.main", "serve", service_of(name), *settings_argv(settings)]
    port_file.unlink(missing_ok=True)  # a reused run dir must not hand out old ports
    log = (run_dir / "logs" / f"{name}.log").open("ab" if append_log else "wb")
    process = subprocess.Popen(
        command,
        # Every setting is in the flags; a recipe named in the parent's environment is the parent's to read.
        env={key: value for key, value in os.environ.items() if key != env_name("config")},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    return Child(name, process, port_file)


class RunStopped(RuntimeError):
    """Why a run ended before its steps were taken; `reason` is a short name for summary.json's `end`."""

    reason = "stopped"


class StartFailed(RunStopped):
    """A service exited, or did not serve in time, before the run began."""

    reason = "start failed"


def last_log_lines(run_dir: Path, name: str, count: int = 8) -> str:
    """The end of service `name`'s log, indented, for an error message."""
    try:
        lines = (run_dir / "logs" / f"{name}.log").read_text(errors="replace").splitlines()[-count:]
    except OSError:
        return ""
    return "".join(f"\n    {line}" for line in lines)


def wait_ready(child: Child, run_dir: Path, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait for the service's port file; StartFailed (with the log's last lines) if it exits or takes longer
    than `timeout_s`. `sleep` is the pause between looks (a StopSignal's, to give way to Ctrl-C)."""
    log = run_dir / "logs" / f"{child.name}.log"
    deadline = time.monotonic() + timeout_s
    while not child.port_file.exists():
        if child.process.poll() is not None:
            raise StartFailed(
                f"{child.name} exited with code {child.process.returncode} while starting; the end of {log}:"
                + last_log_lines(run_dir, child.name)
            )
        if time.monotonic() > deadline:
            raise StartFailed(f"{child.name} did not start serving within {timeout_s:.0f}s; see {log}")
        sleep(0.05)
    child.ports = json.loads(child.port_file.read_text())


def stop_child(child: Child, timeout_s: float) -> None:
    """SIGTERM, and SIGKILL if it has not exited after `timeout_s`; a stopped child (SIGSTOP) is continued so
    that it can act on the SIGTERM."""
    if child.process.poll() is None:
        child.process.send_signal(signal.SIGTERM)
        child.process.send_signal(signal.SIGCONT)
        try:
            child.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def stop_all(children: dict[str, Child]) -> None:
    """Stop every started service, upstream first (the reverse of the order they started in), so each drains
    into the next."""
    for name in reversed(list(children)):
        stop_child(children[name], timeout_s=15.0)


class GaveUp(RunStopped):
    """A service kept dying (more often than the run allows restarts), or exited in a way a restart cannot mend:
    it could not write to disk (EXIT_CANNOT_WRITE), or refused its state files (EXIT_CORRUPT_STATE)."""

    def __init__(self, message: str, reason: str = "crash loop") -> None:
        super().__init__(message)
        self.reason = reason


def disk_space(path: Path) -> str:
    """The free space of `path`'s filesystem, in words."""
    try:
        stat = os.statvfs(path)
    except OSError as error:
        return f"its free space is unknown ({error})"
    return f"{stat.f_bavail * stat.f_frsize:,} of {stat.f_blocks * stat.f_frsize:,} bytes free"


class Supervisor:
    """A run's service processes (`instances`, in start order), restarted with the same flags and ports when one
    dies mid-run (peers redial the same address), as compose and Kubernetes restart a crashed container.

    A death is any exit while the run goes on, except the environment exiting 0 (its step budget is done).
    Each restart waits a jittered backoff (core.backoff), is logged to stderr and to the service's log, and is
    counted in `restarts`; a service that dies more than `max_restarts` times raises GaveUp with its log's last
    lines. Counters die with a process: adding `retired_texts()` (each dead incarnation's last scraped /metrics)
    to `live_texts()` keeps run totals counting what it did (up to one scrape interval is lost).
    """

    def __init__(
        self,
        run_dir: Path,
        instances: Sequence[str],
        settings_for: Callable[[str], ServerSettings | None],
        *,
        max_restarts: int,
        start_timeout_s: float,
        backoff: Callable[[], Backoff] = lambda: Backoff(0.5, 5.0),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`settings_for(name)`: the service's settings now (ports are pinned here after the first start); None
        only for the environment, when it has no steps left to take. `sleep`: every wait (a start's readiness,
        a restart's backoff) goes through it; a StopSignal's raises KeyboardInterrupt there on Ctrl-C."""
        self.run_dir, self.instances, self.settings_for = run_dir, tuple(instances), settings_for
        self.max_restarts, self.start_timeout_s, self._sleep = max_restarts, start_timeout_s, sleep
        self.children: dict[str, Child] = {}
        self.restarts: dict[str, int] = {}
        self._ports: dict[str, dict[str, int]] = {}
        self._backoffs = {name: backoff() for name in self.instances}
        self._last_text: dict[str, str] = {}
        self._retired: dict[str, list[str]] = {name: [] for name in self.instances}
        self._finished: set[str] = set()
        #: Services whose /metrics did not answer at the last `live_texts`: alive, perhaps, but stuck.
        self.silent: set[str] = set()

    def start_all(self) -> None:
        """Start every service in order, each once the one it dials serves (StartFailed if one cannot)."""
        for name in self.instances:
            settings = self.settings_for(name)
            if settings is None:
                raise StartFailed(f"{name}: nothing to start it for")
            self._start(name, settings, append_log=False)

    def _start(self, name: str, settings: ServerSettings, append_log: bool) -> None:
        if name in self._ports:  # same address as before: peers redial it
            settings = amended(settings, port=self._ports[name]["grpc"], metrics_port=self._ports[name]["metrics"])
        self.children[name] = child = spawn(name, settings, self.run_dir, append_log=append_log)
        wait_ready(child, self.run_dir, self.start_timeout_s, self._sleep)
        self._ports[name] = child.ports

    def environment_done(self) -> bool:
        return self.children["environment"].process.poll() == 0 or "environment" in self._finished

    def live_texts(self) -> list[str]:
        """/metrics of every live service (gauges are only meaningful here; counters add `retired_texts`)."""
        texts = []
        self.silent = set()
        for name, child in self.children.items():
            try:
                self._last_text[name] = scrape.fetch(child.ports["metrics"])
            except (OSError, KeyError):
                self.silent.add(name)
                continue  # shutting down, or never served; the next update will do
            texts.append(self._last_text[name])
        return texts

    def last_texts(self) -> dict[str, str]:
        """The last /metrics scraped from each live service: its counters when its final metrics file is missing."""
        return dict(self._last_text)

    def retired_texts(self, name: str | None = None) -> list[str]:
        """The last /metrics scraped from each dead incarnation (of `name`, or of every service)."""
        return self._retired.get(name, []) if name else [text for texts in self._retired.values() for text in texts]

    def watch(self) -> None:
        """Restart each service that died since the last call; GaveUp past `max_restarts` for one service."""
        for name, child in list(self.children.items()):
            code = child.process.poll()
            if code is None or name in self._finished or (name == "environment" and code == 0):
                continue
            self._restart(name, code)

    def _restart(self, name: str, code: int) -> None:
        count = self.restarts.get(name, 0)
        log = self.run_dir / "logs" / f"{name}.log"
        if code == EXIT_CANNOT_WRITE:  # a restart would meet the same disk
            raise GaveUp(
                f"{name} exited with code {code}: it could not write its files (disk full, read-only or failing; "
                f"{self.run_dir}'s filesystem has {disk_space(self.run_dir)}). The end of {log}:"
                + last_log_lines(self.run_dir, name),
                reason="cannot write",
            )
        if code == EXIT_CORRUPT_STATE:  # a restart would meet the same files
            raise GaveUp(
                f"{name} exited with code {code}: it refused its state files, none of which passed its checks. "
                f"The end of {log}:" + last_log_lines(self.run_dir, name),
                reason="corrupt state",
            )
        if count >= self.max_restarts:
            raise GaveUp(
                f"{name} exited with code {code} after {count} restarts (--max-restarts {self.max_restarts}); "
                f"gave up. The end of {log}:" + last_log_lines(self.run_dir, name)
            )
        if name in self._last_text:
            self._retired[name].append(self._last_text.pop(name))
        settings = self.settings_for(name)
        if settings is None:  # the environment died with no steps left to take: the run is done
            self._finished.add(name)
            return
        self.restarts[name] = count + 1
        delay = self._backoffs[name].next_delay()
        note = f"{name} exited with code {code}; restart {count + 1} of {self.max_restarts} in {delay:.1f} s"
        print(f"splitrl up: {note}", file=sys.stderr, flush=True)
        try:
            with log.open("a") as file:
                file.write(f"---- splitrl up: {note}\n")
        except OSError as error:  # the note is only a note: the restart goes on
            print(f"splitrl up: cannot note the restart in {log}: {error}", file=sys.stderr, flush=True)
        self._sleep(delay)
        try:
            self._start(name, settings, append_log=True)
        except StartFailed:
            stop_child(self.children[name], timeout_s=5.0)  # the next watch() counts this as one more death
