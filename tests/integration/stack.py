"""Starting real splitrl services in this process, on ephemeral loopback ports.

Each service gets its own metrics registry and its own /metrics HTTP port,
exactly as in separate processes; only the event loop is shared.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from splitrl.core import scrape
from splitrl.core.metrics import Metrics
from splitrl.core.service import ServiceHost
from splitrl.edge_encoder.service import EdgeEncoderService
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.environment.service import EnvironmentService
from splitrl.environment.settings import EnvironmentSettings
from splitrl.inference.service import InferenceService
from splitrl.inference.settings import InferenceSettings
from splitrl.learner.service import LearnerService
from splitrl.learner.settings import LearnerSettings
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings

FAST_ENV = "splitrl/Catch-v0"


async def start(service_cls: Any, settings: Any) -> ServiceHost:
    metrics = Metrics(CollectorRegistry())
    return await ServiceHost.start(service_cls(settings, metrics), settings, metrics)


def address(host: ServiceHost) -> str:
    return f"127.0.0.1:{host.grpc_port}"


@dataclass
class Stack:
    """The rollout services (and optionally the learner), started in dial order."""

    hosts: dict[str, ServiceHost] = field(default_factory=dict)

    @classmethod
    async def start(
        cls,
        mode: str,
        codec: str = "frame",
        *,
        num_envs: int = 2,
        steps: int = 0,
        unroll_length: int = 16,
        width: int = 4096,
        env: str = FAST_ENV,
        env_kwargs: dict | None = None,
        learner: dict | None = None,
        edge: dict | None = None,
        replay: dict | None = None,
        environment: dict | None = None,
    ) -> Stack:
        """Start replay, inference, [a learner with `learner` settings], edge-encoder, environment."""
        # Plaintext, explicitly: tests dial these services with rpc.insecure_channel (test_security covers TLS).
        shared: dict[str, Any] = {"env": env, "env_kwargs": env_kwargs or {}, "width": width, "tls": "plaintext"}
        stack = cls()
        try:
            stack.hosts["replay"] = await start(ReplayService, ReplaySettings(tls="plaintext", **(replay or {})))
            stack.hosts["inference"] = await start(
                InferenceService,
                InferenceSettings(
                    **shared,
                    mode=mode,
                    codec=codec,
                    replay_address=address(stack.hosts["replay"]),
                    unroll_length=unroll_length,
                ),
            )
            if learner is not None:
                stack.hosts["learner"] = await start(
                    LearnerService,
                    LearnerSettings(
                        **shared,
                        mode=mode,
                        replay_address=address(stack.hosts["replay"]),
                        inference_address=address(stack.hosts["inference"]),
                        **learner,
                    ),
                )
            learner_address = address(stack.hosts["learner"]) if "learner" in stack.hosts else "127.0.0.1:1"
            stack.hosts["edge-encoder"] = await start(
                EdgeEncoderService,
                EdgeEncoderSettings(
                    **shared,
                    mode=mode,
                    codec=codec,
                    inference_address=address(stack.hosts["inference"]),
                    learner_address=learner_address,
                    **(edge or {}),
                ),
            )
            stack.hosts["environment"] = await start(
                EnvironmentService,
                EnvironmentSettings(
                    **shared,
                    num_envs=num_envs,
                    max_steps=steps,
                    encoder_address=address(stack.hosts["edge-encoder"]),
                    **(environment or {}),
                ),
            )
        except BaseException:
            await stack.stop()  # nothing half-started outlives a failed start
            raise
        return stack

    @property
    def environment(self) -> EnvironmentService:
        return self.hosts["environment"].service  # type: ignore[return-value]

    @property
    def inference(self) -> InferenceService:
        return self.hosts["inference"].service  # type: ignore[return-value]

    async def wait_done(self, timeout_s: float = 120.0) -> None:
        """Wait for the environment's max_steps, then for replay to acknowledge every chunk."""
        finished = self.environment.finished()
        await asyncio.wait_for(finished.wait(), timeout_s)
        assert self.environment.failure() is None, self.environment.failure()
        deadline = time.monotonic() + timeout_s
        while self.inference.writer.acknowledged < int(self.inference.metrics.trajectories._value.get()):
            assert time.monotonic() < deadline, "replay did not acknowledge every chunk"
            await asyncio.sleep(0.02)

    async def wait_learner_done(self, timeout_s: float = 180.0) -> None:
        """Wait for the learner to reach its max_updates; fail the test with its error if it failed instead."""
        learner = self.hosts["learner"].service
        await asyncio.wait_for(learner.finished().wait(), timeout_s)
        assert learner.failure() is None, learner.failure()

    def scrape(self) -> dict[str, str]:
        """Every service's /metrics, fetched over HTTP."""
        return {name: scrape.fetch(host.metrics_port) for name, host in self.hosts.items()}

    async def stop(self) -> None:
        for name in ("environment", "edge-encoder", "learner", "inference", "replay"):
            if name in self.hosts:
                await self.hosts[name].stop()
