"""Attacks on a running `splitrl up` (mutual TLS, its own CA), for the end-to-end tests: an edge device's
certificate tries the cloud's calls, and authorised peers send poisonous content. `attack` makes every attempt
and returns how each ended; EXPECTED is how each must end (docs/security.md)."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import time
from pathlib import Path

import grpc
import torch

from splitrl.core import rpc, weights
from splitrl.core.config import TransportSettings
from splitrl.core.envs import action_spec_of
from splitrl.core.models import cloud_network
from splitrl.inference.settings import InferenceSettings
from splitrl.run.plan import recipe_share
from splitrl.v1 import replay_pb2, replay_pb2_grpc, weights_pb2, weights_pb2_grpc
from tests.chunks import chunk_of

WAIT_S = 120.0  # for the services to serve


def wait_for(paths: list[Path], process: subprocess.Popen) -> None:
    deadline = time.monotonic() + WAIT_S
    while not all(path.exists() for path in paths):
        assert process.poll() is None, f"splitrl up exited early with {process.returncode}"
        assert time.monotonic() < deadline, f"not there after {WAIT_S:.0f} s: {[p for p in paths if not p.exists()]}"
        time.sleep(0.5)


def as_holder(tls: Path, holder: str) -> TransportSettings:
    return TransportSettings(
        tls="mtls",
        tls_cert_file=tls / f"{holder}.pem",
        tls_key_file=tls / f"{holder}-key.pem",
        tls_ca_file=tls / "ca.pem",
    )


async def outcome(call) -> grpc.StatusCode:
    """The status a streaming call ends with after its first message, or OK if it was answered."""
    try:
        await asyncio.wait_for(call.read(), 10)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as error:
        return error.code()
    finally:
        call.cancel()


async def attack(run_dir: Path, recipe: Path) -> dict[str, grpc.StatusCode]:
    """Every attempt against the run in `run_dir` (started from `recipe`), by name: how each call ended."""
    tls = run_dir / "tls"
    port = {name: json.loads((run_dir / f"{name}.ports.json").read_text())["grpc"] for name in ("replay", "inference")}
    share = recipe_share(recipe, "inference")
    inference = InferenceSettings(tls="plaintext", **share)
    network = cloud_network(
        inference.mode, inference.network_config(), action_spec_of(inference.env, inference.env_kwargs)
    )
    good = network.state_dict()
    poisoned_chunk = chunk_of(torch.zeros(3, inference.width, dtype=torch.bfloat16))
    poisoned_chunk.rewards = torch.tensor([0.0, math.nan])
    out_of_space = chunk_of(torch.zeros(3, inference.width, dtype=torch.bfloat16))
    out_of_space.actions = torch.tensor([0, 7])
    results: dict[str, grpc.StatusCode] = {}

    async def insert(holder: str, trajectory: replay_pb2.Trajectory) -> grpc.StatusCode:
        async with rpc.dial(f"127.0.0.1:{port['replay']}", as_holder(tls, holder)) as channel:
            call = replay_pb2_grpc.ReplayStub(channel).Insert()
            await call.write(replay_pb2.InsertRequest(table="rollouts", trajectory=trajectory))
            return await outcome(call)

    async def publish(holder: str, message: weights_pb2.Weights) -> grpc.StatusCode:
        async with rpc.dial(f"127.0.0.1:{port['inference']}", as_holder(tls, holder)) as channel:
            call = weights_pb2_grpc.PolicyUpdatesStub(channel).Publish()
            await call.write(message)
            return await outcome(call)

    async def sample(holder: str) -> grpc.StatusCode:
        async with rpc.dial(f"127.0.0.1:{port['replay']}", as_holder(tls, holder)) as channel:
            try:
                await replay_pb2_grpc.ReplayStub(channel).Sample(replay_pb2.SampleRequest(table="rollouts"), timeout=10)
                return grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                return error.code()

    # An edge device's certificate (the environment's) tries the cloud-side calls.
    results["edge inserts into replay"] = await insert("environment", poisoned_chunk.to_proto())
    results["edge publishes weights"] = await publish("environment", weights.to_proto(10**6, good))
    results["edge samples replay"] = await sample("environment")
    results["edge-encoder publishes weights"] = await publish("edge-encoder", weights.to_proto(10**6, good))
    # Authorised peers, gone wrong: inference's certificate with poisonous chunks, the learner's with weights.
    results["NaN rewards inserted"] = await insert("inference", poisoned_chunk.to_proto())
    results["actions outside the space inserted"] = await insert("inference", out_of_space.to_proto())
    huge = {name: torch.full_like(value, 1e30) for name, value in good.items()}
    results["weights of 1e30 published"] = await publish("learner", weights.to_proto(1, huge))
    results["version 2**64-1 published"] = await publish("learner", weights.to_proto(2**64 - 1, good))
    return results


#: How each attempt of `attack` must end.
EXPECTED = {
    "edge inserts into replay": grpc.StatusCode.PERMISSION_DENIED,
    "edge publishes weights": grpc.StatusCode.PERMISSION_DENIED,
    "edge samples replay": grpc.StatusCode.PERMISSION_DENIED,
    "edge-encoder publishes weights": grpc.StatusCode.PERMISSION_DENIED,
    "NaN rewards inserted": grpc.StatusCode.INVALID_ARGUMENT,
    "actions outside the space inserted": grpc.StatusCode.INVALID_ARGUMENT,
    "weights of 1e30 published": grpc.StatusCode.INVALID_ARGUMENT,
    "version 2**64-1 published": grpc.StatusCode.INVALID_ARGUMENT,
}
