"""Vector envs the environment service steps: in its own process, or in a worker process of their own.

`--env-workers` puts each env group in a worker process, so stepping (CarRacing: mostly rendering) runs on
another core while the service's process does its networking and other groups' steps. A worker builds
exactly the vector env `make_vector_env` builds, so seeds, frames and rewards are the same either way.

The worker answers one command at a time over a pipe (reset, step, close); results travel pickled (a
vector step of 8 96x96 frames is ~74 KB). The service awaits a worker's step without blocking its event
loop: the loop watches the pipe. A worker that dies ends the service's loop with EOFError, and the service is
restarted as any crashed service is. Nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import signal
from multiprocessing.connection import Connection
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from splitrl.core.envs import make_vector_env, skip_unused_pygame_modules
from splitrl.core.usage import NO_USAGE, ProcessUsage, process_usage

#: (frames, rewards, terminated, truncated, info) of one vector step, as gymnasium returns it.
Step = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class GroupEnvs(Protocol):
    """What the environment service needs of one group's vector env."""

    num_envs: int

    @property
    def single_action_space(self) -> gym.Space[Any]: ...

    def reset(self, seed: int) -> tuple[np.ndarray, dict[str, Any]]: ...

    def usage(self) -> ProcessUsage:
        """What the process stepping these envs has used, when it is not the caller's (NO_USAGE when it is)."""
        ...

    async def step(self, actions: np.ndarray) -> Step: ...

    def close(self) -> None: ...


def group_envs(
    env_id: str, env_kwargs: dict[str, Any], num_envs: int, frame_size: int, action_repeat: int, worker: bool
) -> GroupEnvs:
    """One group's `num_envs` envs, stepped in a worker process if `worker`, else in this one."""
    if worker:
        return WorkerVectorEnv(env_id, env_kwargs, num_envs, frame_size, action_repeat)
    return LocalVectorEnv(make_vector_env(env_id, env_kwargs, num_envs, frame_size, action_repeat))


class LocalVectorEnv:
    """A vector env stepped in this process (a step holds the event loop while the envs step)."""

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        self.envs = envs
        self.num_envs = envs.num_envs

    @property
    def single_action_space(self) -> gym.Space[Any]:
        return self.envs.single_action_space

    def reset(self, seed: int) -> tuple[np.ndarray, dict[str, Any]]:
        return self.envs.reset(seed=seed)

    def usage(self) -> ProcessUsage:
        return NO_USAGE

    async def step(self, actions: np.ndarray) -> Step:
        return self.envs.step(actions)  # type: ignore[return-value]

    def close(self) -> None:
        self.envs.close()


class WorkerVectorEnv:
    """A vector env stepped in a worker process ("spawn": a fresh interpreter, nothing inherited from the
    service's gRPC threads). Construction does not wait for the worker; the first call that needs it does."""

    def __init__(
        self, env_id: str, env_kwargs: dict[str, Any], num_envs: int, frame_size: int, action_repeat: int
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(
            target=_serve,
            args=(child, env_id, env_kwargs, num_envs, frame_size, action_repeat),
            name=f"env worker ({num_envs} x {env_id})",
            daemon=True,  # never outlives the service
        )
        self._process.start()
        child.close()
        self.num_envs = num_envs
        self._space: gym.Space[Any] | None = None
        self._last_usage = NO_USAGE
        self._closed = False
        #: Set while a command's answer is owed. A caller that stops waiting (cancelled) leaves the answer in
        #: the pipe and the envs a step further than it knows: the env is unusable after that, and says so.
        self._owed = False

    @property
    def single_action_space(self) -> gym.Space[Any]:
        if self._space is None:
            self._space = self._answer()
        return self._space

    def reset(self, seed: int) -> tuple[np.ndarray, dict[str, Any]]:
        self._send("reset", seed)
        return self._answer()  # type: ignore[no-any-return]

    async def step(self, actions: np.ndarray) -> Step:
        self._send("step", actions)
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()
        fd = self._connection.fileno()
        loop.add_reader(fd, _resolve, readable)
        try:
            await readable
        finally:
            loop.remove_reader(fd)
        return self._answer()  # type: ignore[no-any-return]

    def usage(self) -> ProcessUsage:
        """The worker's usage, from /proc; once it has been closed, as last seen.

        Safe from another thread (Prometheus collects on its own): it reads /proc only, never waits on the
        process."""
        pid = self._process.pid
        if not self._closed and pid is not None:
            self._last_usage = process_usage(pid) or self._last_usage
        return self._last_usage

    def close(self) -> None:
        """Stop the worker: ask it to, then close the pipe (a worker blocked on an answer nobody reads gets a
        broken pipe and exits), then wait briefly, then kill."""
        self.usage()  # the last reading, kept for the service's final metrics
        self._closed = True
        if not self._owed:
            with contextlib.suppress(OSError):  # the worker is already gone
                self._connection.send(("close", None))
        self._connection.close()
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)

    def _send(self, command: str, argument: Any) -> None:
        _ = self.single_action_space  # the worker's first answer is its action space
        if self._owed:
            raise RuntimeError(f"{self._process.name}: a caller stopped waiting for an answer; the envs moved on")
        self._connection.send((command, argument))
        self._owed = True

    def _answer(self) -> Any:
        """The worker's next answer; EOFError if it died, its error (as RuntimeError) if the command failed."""
        status, value = self._connection.recv()
        self._owed = False
        if status == "error":
            raise RuntimeError(f"{self._process.name} failed: {value}")
        return value


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _serve(
    connection: Connection, env_id: str, env_kwargs: dict[str, Any], num_envs: int, frame_size: int, repeat: int
) -> None:
    """The worker's loop: build the envs, send their action space, then answer commands until close or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the service shuts it down
    skip_unused_pygame_modules(env_id)  # the worker's process steps only these envs
    try:
        envs = make_vector_env(env_id, env_kwargs, num_envs, frame_size, repeat)
    except Exception as error:
        connection.send(("error", f"building the envs: {error!r}"))
        return
    try:
        connection.send(("ok", envs.single_action_space))
        while True:
            command, argument = connection.recv()
            if command == "close":
                return
            try:
                result = envs.reset(seed=argument) if command == "reset" else envs.step(argument)
            except Exception as error:
                connection.send(("error", repr(error)))
                continue
            connection.send(("ok", result))
    except (EOFError, BrokenPipeError):
        return  # the service is gone
    finally:
        envs.close()
