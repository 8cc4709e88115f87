"""The five services by name: where each one's class and settings class live, importable one at a time.

Nothing here imports a service: `splitrl serve NAME` loads only NAME's modules, so each process holds what it
needs (the environment: no torch, no other service's settings) and starts fast.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple


class Served(NamedTuple):
    """One service: its class and its settings class (each "package.module:Class") and a help line."""

    service: str
    settings: str
    help: str


#: The services that run on the edge device, beside the environment (the others run in the cloud).
EDGE_SERVICES = ("environment", "edge-encoder")

#: Every service, in the order a run starts them (each one's dependencies first).
SERVICES: dict[str, Served] = {
    "replay": Served(
        "splitrl.replay.service:ReplayService",
        "splitrl.replay.settings:ReplaySettings",
        "Store trajectory chunks; serve samples.",
    ),
    "inference": Served(
        "splitrl.inference.service:InferenceService",
        "splitrl.inference.settings:InferenceSettings",
        "Batch edge streams, act, write trajectories to replay.",
    ),
    "learner": Served(
        "splitrl.learner.service:LearnerService",
        "splitrl.learner.settings:LearnerSettings",
        "Train the policy with PPO; publish weights to inference.",
    ),
    "edge-encoder": Served(
        "splitrl.edge_encoder.service:EdgeEncoderService",
        "splitrl.edge_encoder.settings:EdgeEncoderSettings",
        "Stack frames, encode (split), dial inference.",
    ),
    "environment": Served(
        "splitrl.environment.service:EnvironmentService",
        "splitrl.environment.settings:EnvironmentSettings",
        "Step gymnasium envs; stream frames to the edge-encoder.",
    ),
}


def load(location: str) -> Any:
    """The object at `location`, "package.module:Name" (imports the module)."""
    module, name = location.split(":")
    return getattr(importlib.import_module(module), name)
