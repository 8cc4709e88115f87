"""Starting real splitrl services in this process, on ephemeral loopback ports, from a run's plan.

Each service gets its own metrics registry and its own /metrics HTTP port,
exactly as in separate processes; only the event loop is shared.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from splitrl.core import scrape
from splitrl.core.config import Mode, ObservationCodec
from splitrl.core.metrics import Metrics
from splitrl.core.service import ServiceHost
from splitrl.edge_encoder.service import EdgeEncoderService
from splitrl.environment.service import EnvironmentService
from splitrl.inference.service import InferenceService
from splitrl.learner.service import LearnerService
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.run.plan import amended, instance_names, plan, service_of
from splitrl.run.settings import RunSettings

FAST_ENV = "splitrl/Catch-v0"


#: Each service's class by its name (run.registry.SERVICES), in dial order.
SERVICE_CLASSES: dict[str, Any] = {
    "replay": ReplayService,
    "inference": InferenceService,
    "learner": LearnerService,
    "edge-encoder": EdgeEncoderService,
    "environment": EnvironmentService,
}
#: Each service class's name: its Metrics exports that service's families, as in `splitrl serve NAME`.
SERVICE_NAMES: dict[Any, str] = {service_cls: name for name, service_cls in SERVICE_CLASSES.items()}


async def start(service_cls: Any, settings: Any) -> ServiceHost:
    metrics = Metrics(CollectorRegistry(), SERVICE_NAMES.get(service_cls))
    return await ServiceHost.start(service_cls(settings, metrics), settings, metrics)


def address(host: ServiceHost) -> str:
    return f"127.0.0.1:{host.grpc_port}"


@dataclass
class Stack:
    """The rollout services (and optionally the learner), started in dial order from one plan of a run."""

    hosts: dict[str, ServiceHost] = field(default_factory=dict)
    run_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="splitrl-stack-")))

    @classmethod
    async def start(
        cls,
        mode: Mode,
        codec: ObservationCodec = "frame",
        *,
        num_envs: int = 2,
        steps: int = 0,
        unroll_length: int = 16,
        width: int = 4096,
        env: str = FAST_ENV,
        env_kwargs: dict | None = None,
        learner: dict | None = None,
        inference: dict | None = None,
        edge: dict | None = None,
        replay: dict | None = None,
        environment: dict | None = None,
        inference_replicas: int = 1,
        replay_shards: int = 1,
    ) -> Stack:
        """Start replay (and its shards replay-1, ...), inference (and its replicas inference-1, ...), [a learner
        amended with `learner`], edge-encoder, environment; inference's settings amended with `inference`.

        Every service's settings come from `splitrl.run.plan` (as in `splitrl up`), amended with the given
        dicts; `steps` 0 runs the envs until stopped. Plaintext, explicitly: tests dial these services with
        rpc.insecure_channel (test_security covers TLS).
        """
        run = RunSettings(
            mode=mode,
            codec=codec,
            num_envs=num_envs,
            unroll_length=unroll_length,
            width=width,
            env=env,
            env_kwargs=env_kwargs or {},
            steps=max(steps, 1),
            replay_max_size=ReplaySettings.model_fields["max_size"].default,
            tls="plaintext",
            inference_replicas=inference_replicas,
            replay_shards=replay_shards,
        )
        overrides = {
            "replay": replay or {},
            "inference": inference or {},
            "learner": learner or {},
            "edge-encoder": edge or {},
            "environment": {"max_steps": steps, **(environment or {})},
        }
        stack = cls()
        try:
            for name in instance_names(run):
                service = service_of(name)
                if service == "learner" and learner is None:
                    continue
                addresses = {peer: address(host) for peer, host in stack.hosts.items()}
                addresses.setdefault("learner", "127.0.0.1:1")  # no learner: the edge's training link is refused
                planned = plan(run, stack.run_dir, addresses)[name]
                stack.hosts[name] = await start(SERVICE_CLASSES[service], amended(planned, **overrides[service]))
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

    @property
    def inference_replicas(self) -> list[InferenceService]:
        """Every inference instance (inference, inference-1, ...)."""
        return [host.service for name, host in self.hosts.items() if service_of(name) == "inference"]  # type: ignore[misc]

    async def wait_done(self, timeout_s: float = 120.0) -> None:
        """Wait for the environment's max_steps, then for replay to acknowledge every chunk."""
        finished = self.environment.finished()
        await asyncio.wait_for(finished.wait(), timeout_s)
        assert self.environment.failure() is None, self.environment.failure()
        deadline = time.monotonic() + timeout_s
        for inference in self.inference_replicas:
            while inference.writer.acknowledged < int(inference.metrics.trajectories._value.get()):
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
        """Stop every service; then fail if one updated a family its /metrics does not serve."""
        for host in reversed(self.hosts.values()):
            await host.stop()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        unserved = {name: host.metrics.unexported_in_use() for name, host in self.hosts.items()}
        assert not any(unserved.values()), f"updated, not exported (metrics.SERVICE_FAMILIES): {unserved}"
