"""The protos are the contract: an edge written from protos/splitrl/v1 alone talks to the real services.

Stubs and a descriptor set (comments included) are generated fresh from the .proto files; a client in a fresh
interpreter that cannot import splitrl (tests/integration/conformance_client.py) plays an environment on the
edge-encoder's Rollout stream and an edge-encoder on inference's Act stream, a few hundred steps, provokes
refusals, and reads what inference wrote to replay. Every Tensor it receives must have a dtype and shape its
field's comment documents (`dtype [dims]`), so a comment that names another dtype than the services send fails.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from grpc_tools import protoc

from splitrl.edge_encoder.service import EdgeEncoderService
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.inference.service import InferenceService
from splitrl.inference.settings import InferenceSettings
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from tests.integration.stack import FAST_ENV, address, start

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
CLIENT = Path(__file__).with_name("conformance_client.py")
WIDTH = 64


def generate(out: Path) -> tuple[Path, Path]:
    """Python stubs and a FileDescriptorSet with source info (the comments) from the .proto files, into `out`."""
    stubs, descriptors = out / "stubs", out / "contract.pb"
    stubs.mkdir()
    include = Path(protoc.__file__).parent / "_proto"
    protos = [str(p.relative_to(PROTOS)) for p in sorted(PROTOS.rglob("*.proto"))]
    args = [
        "grpc_tools.protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={stubs}",
        f"--grpc_python_out={stubs}",
        f"--descriptor_set_out={descriptors}",
        "--include_source_info",
        *protos,
    ]
    assert protoc.main(args) == 0, "protoc failed"
    return stubs, descriptors


@pytest.mark.parametrize(
    ("mode", "env_kwargs", "actions", "steps"),
    [
        ("cloud", {}, "discrete:3", (300, 150)),  # (Rollout steps, Act steps)
        ("cloud", {"continuous": True}, "continuous:1", (100, 100)),
        ("split", {}, "discrete:3", (100, 100)),
    ],
    ids=["cloud-discrete", "cloud-continuous", "split-discrete"],
)
async def test_an_edge_written_from_the_protos_alone_conforms(tmp_path, mode, env_kwargs, actions, steps):
    stubs, descriptors = generate(tmp_path)
    common = {"tls": "plaintext", "env": FAST_ENV, "env_kwargs": env_kwargs, "mode": mode, "width": WIDTH}
    replay = await start(ReplayService, ReplaySettings(tls="plaintext"))
    inference = await start(InferenceService, InferenceSettings(**common, replay_address=address(replay)))
    edge_settings = EdgeEncoderSettings(**common, inference_address=address(inference), learner_address="127.0.0.1:1")
    edge = await start(EdgeEncoderService, edge_settings)  # no learner: the split's training link is refused
    try:
        command = [
            sys.executable,
            "-I",  # no PYTHONPATH, no script directory on sys.path: splitrl is out of reach
            str(CLIENT),
            str(stubs),
            str(descriptors),
            f"--edge={address(edge)}",
            f"--inference={address(inference)}",
            f"--replay={address(replay)}",
            f"--actions={actions}",
            f"--codec={'frame' if mode == 'cloud' else 'activation'}",
            f"--width={WIDTH}",
            f"--rollout-steps={steps[0]}",
            f"--act-steps={steps[1]}",
        ]
        # The services run on this process's event loop: the client runs beside it, not blocking it.
        process = await asyncio.create_subprocess_exec(
            *command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, err.decode()[-4000:]
    finally:
        for host in (edge, inference, replay):
            await host.stop()
    summary = json.loads(out)
    assert (summary["rollout"]["steps"], summary["act"]["steps"]) == steps
    assert set(summary["refusals"]) == {
        "Act: observations of the wrong shape",
        "Act: a codec inference does not serve",
        "Rollout: a frame tensor whose bytes do not match its shape",
    }
    assert summary["replay"]["items"] >= 10 and summary["replay"]["rewards_checked"] >= 100
    fields = ["observations", "actions", "rewards", "step_ids"] + (["observation_index"] if mode == "cloud" else [])
    trajectory = {f"Trajectory.{name}" for name in fields}
    assert {"EnvAction.actions", "ActResponse.actions"} | trajectory <= set(summary["checked"])
