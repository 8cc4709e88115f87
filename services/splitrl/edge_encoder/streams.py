"""What the edge-encoder keeps per stream: each environment stream's lockstep state and frame stacks, and the Act
stream to inference that serves it now (replaced, with a new run id, whenever it breaks)."""

from __future__ import annotations

from typing import NamedTuple

import grpc
import torch

from splitrl.core import wire
from splitrl.core.framestack import FrameStacker
from splitrl.core.lockstep import Carried, LockstepStream, RewardBook, StepIdCursor
from splitrl.core.replicas import Lease, Replicas
from splitrl.core.video import VideoStreamEncoder
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.v1 import rollout_pb2


class Outgoing(NamedTuple):
    """One env step on its way to inference: the ActRequest but for its per-stream fields, and their values."""

    request: rollout_pb2.ActRequest
    frames: torch.Tensor  # uint8 [N, S, S], the newest frame of each env (encoded per stream in video mode)
    first_step_id: int
    encoder_version: int
    rewards: list[float]  # one per env, float32 values


class ActStream:
    """The Act stream that serves one environment stream now; replaced (new run id) whenever it breaks."""

    def __init__(self, env_run_id: str, replicas: Replicas) -> None:
        self.env_run_id = env_run_id
        self.replicas = replicas
        self.run_id = ""
        self.call: grpc.aio.StreamStreamCall | None = None
        self.lease: Lease | None = None  # the inference replica `call` is open on
        self.video: VideoStreamEncoder | None = None  # cloud h264 or --video-shadow: this call's encoders, one per env
        self.opened = 0  # Act streams opened so far for this environment stream
        self.new_call_state()

    def new_call_state(self) -> None:
        """What each end of an Act stream keeps (core.lockstep) starts over with each call."""
        self.answered = 0  # ActRequests answered on `call`
        self.step_ids, self.encoder_version, self.policy_version = StepIdCursor(), Carried(), Carried()
        self.rewards = RewardBook()

    def close(self) -> str:
        """Cancel the current call, if any; returns its run id."""
        if self.call is not None:
            self.call.cancel()
            self.call = None
        if self.lease is not None:
            self.replicas.release(self.lease)
            self.lease = None
        self.video = None  # its encoders served that call only
        return self.run_id


class EnvStream:
    """One environment stream: its lockstep state (core.lockstep) and its frame stacks."""

    def __init__(self, settings: EdgeEncoderSettings) -> None:
        self.settings = settings
        self.lockstep = LockstepStream("EnvStep")
        self.stacker: FrameStacker

    @property
    def num_envs(self) -> int | None:
        return self.lockstep.num_envs

    def accept(self, step: rollout_pb2.EnvStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Validate `step`; return its frames uint8 [N, S, S] and which rows start an episode, bool [N]."""
        size = self.settings.frame_size
        frames = wire.decode(step.frames, expect_dtype=wire.DTYPE_UINT8, expect_shape=[self.num_envs, size, size])
        first = self.num_envs is None
        episode_start = self.lockstep.accept(step, frames.shape[0], ("rewards", "terminated", "truncated"))
        if first:
            self.stacker = FrameStacker(frames.shape[0], self.settings.frame_stack, size, size)
        return frames, episode_start
