"""What `splitrl eval` counts per episode besides its return: whether the time limit cut it, and against what
score gymnasium's registry calls the env solved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from splitrl.core import checkpoint, precision, wire
from splitrl.core.envs import CATCH_ID, action_spec_of
from splitrl.core.models import cloud_network
from splitrl.run.evaluate import Agent, _reward_threshold, play_episode
from splitrl.run.settings import RunSettings


class _StayActor:
    version = 0

    def start_episode(self) -> None:
        pass

    def act(self, frame: np.ndarray, deterministic: bool) -> Any:
        return 1


def test_an_episode_the_time_limit_cuts_is_told_from_one_that_ends() -> None:
    ended = gym.make(CATCH_ID, grid=6)  # the ball lands after grid - 1 steps: the episode terminates
    assert play_episode(ended, _StayActor(), seed=0, deterministic=True, recorder=None)[1:] == (5, False)
    cut = gym.make(CATCH_ID, grid=6, max_episode_steps=3)
    episode_return, steps, out_of_time = play_episode(cut, _StayActor(), seed=0, deterministic=True, recorder=None)
    assert (episode_return, steps, out_of_time) == (0.0, 3, True)


def test_the_reward_threshold_is_the_registrys() -> None:
    assert _reward_threshold("CarRacing-v3") == 900.0
    assert _reward_threshold("splitrl/CarRacingThrottle-v0") == 900.0
    assert _reward_threshold(CATCH_ID) is None


class _SamplingActor:
    """Draws uniformly among Catch's three actions with torch's generator, as a sampling policy does."""

    version = 0

    def __init__(self) -> None:
        self.actions: list[int] = []

    def start_episode(self) -> None:
        pass

    def act(self, frame: np.ndarray, deterministic: bool) -> Any:
        self.actions.append(int(torch.multinomial(torch.ones(3), 1)))
        return self.actions[-1]


def test_a_sampling_policy_draws_the_same_actions_on_the_same_episode() -> None:
    env = gym.make(CATCH_ID, grid=12)
    first, again, other = _SamplingActor(), _SamplingActor(), _SamplingActor()
    play_episode(env, first, seed=7, deterministic=False, recorder=None)
    torch.rand(5)  # whatever ran in between
    play_episode(env, again, seed=7, deterministic=False, recorder=None)
    play_episode(env, other, seed=8, deterministic=False, recorder=None)
    assert first.actions == again.actions and len(first.actions) == 11
    assert other.actions != first.actions


@pytest.mark.parametrize("encoder_precision", ["float32", "bfloat16"])
def test_a_split_agent_runs_its_encoder_in_the_precision_the_edge_acted_in(tmp_path: Path, encoder_precision):
    sizes = {"width": 32, "frame_size": 36, "activation_codec": "bf16"}
    run = RunSettings(env=CATCH_ID, mode="split", encoder_precision=encoder_precision, **sizes)
    spec = action_spec_of(run.env, run.env_kwargs)
    torch.manual_seed(0)
    encoder, head = run.network_config().encoder().eval(), cloud_network("split", run.network_config(), spec).eval()
    checkpoint.save({"version": 3, "network": head.state_dict()}, tmp_path / "checkpoints" / "learner.pt")
    checkpoint.save({"encoder": encoder.state_dict()}, tmp_path / "checkpoints" / "edge-encoder" / "encoder.pt")
    frame = np.random.default_rng(0).integers(0, 256, (36, 36), dtype=np.uint8)
    agent = Agent(tmp_path, run, spec)
    agent.start_episode()
    played = agent.probabilities(frame)

    def probabilities_in(encoder_pass: str) -> np.ndarray:
        stacks = torch.from_numpy(frame)[None, None].expand(1, run.frame_stack, 36, 36)  # the first frame, repeated
        with torch.no_grad():
            activations = precision.forward_in(encoder_pass, encoder, stacks)  # type: ignore[arg-type]
            sent = wire.decode_float(wire.encode_float(activations, "bf16"))
            return head(sent)[0].probs[0].numpy()

    assert np.array_equal(played, probabilities_in(encoder_precision))
    other = "float32" if encoder_precision == "bfloat16" else "bfloat16"
    assert not np.array_equal(played, probabilities_in(other))
