"""Pretraining the split edge's encoder on the edge alone: the decoder, the random policy, the frames, the file."""

from __future__ import annotations

import itertools
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from splitrl.core import checkpoint
from splitrl.core.args import validate_settings
from splitrl.core.framestack import stack_rows
from splitrl.core.spec import ModelConfig
from splitrl.edge_encoder.pretrain import Decoder, RandomPolicy, collect_stacks, pretrain, split_held_out
from splitrl.edge_encoder.pretrained import PretrainResult, load_pretrained, quality, save_pretrained
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.run.plan import recipe_values
from splitrl.run.settings import PretrainSettings

CATCH = ModelConfig(frame_stack=4, frame_size=36, width=32, bottleneck="layernorm")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "model",
    [
        ModelConfig(4, 96, 32, "layernorm"),  # CarRacing's split
        ModelConfig(4, 36, 256, "relu"),  # Catch's
        ModelConfig(4, 36, 64, "relu"),  # width == the conv stack's output: the encoder has no Linear
        ModelConfig(1, 98, 32, "layernorm"),  # the first convolution drops 2 rows: output_padding restores them
        ModelConfig(2, 64, 16, "relu"),  # the second drops one
        ModelConfig(4, 50, 32, "layernorm"),  # both do
    ],
)
def test_decoder_gives_back_stacks_of_the_encoders_input_shape(model):
    stacks = torch.randint(0, 256, (3, model.frame_stack, model.frame_size, model.frame_size), dtype=torch.uint8)
    reconstruction = Decoder(model)(model.encoder()(stacks))
    assert reconstruction.shape == stacks.shape
    assert reconstruction.dtype == torch.float32
    assert reconstruction.min() >= 0 and reconstruction.max() <= 1  # frames / 255


def test_random_policy_draws_discrete_actions_by_weight_and_holds_them():
    never_changes = RandomPolicy(gym.spaces.Discrete(5), 0.0, [0, 0, 0, 1, 0], np.random.default_rng(0))
    assert {never_changes() for _ in range(50)} == {3}
    uniform = RandomPolicy(gym.spaces.Discrete(3), 0.0, None, np.random.default_rng(0))
    counts = np.bincount([uniform() for _ in range(3000)], minlength=3)
    assert (counts > 900).all(), counts
    holding = RandomPolicy(gym.spaces.Discrete(5), 0.9, None, np.random.default_rng(0))
    actions = [holding() for _ in range(2000)]
    changes = sum(a != b for a, b in itertools.pairwise(actions))
    assert 100 < changes < 200  # a new draw on ~10% of steps, which repeats the old action a fifth of the time


def test_random_policy_draws_continuous_actions_within_the_bounds():
    space = gym.spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 0.5]), dtype=np.float32)
    policy = RandomPolicy(space, 0.0, None, np.random.default_rng(0))
    actions = np.stack([policy() for _ in range(500)])
    assert actions.dtype == np.float32
    assert (actions >= space.low).all() and (actions <= space.high).all()
    assert actions[:, 0].min() < -0.8 and actions[:, 1].max() > 0.4


@pytest.mark.parametrize(
    ("space", "hold", "weights", "message"),
    [
        (gym.spaces.Discrete(5), 0.5, [1.0, 2.0], r"must be 5 non-negative numbers.*got \[1.0, 2.0\]"),
        (gym.spaces.Discrete(2), 0.5, [1.0, -1.0], r"non-negative.*got \[1.0, -1.0\]"),
        (gym.spaces.Discrete(2), 0.5, [0.0, 0.0], r"not all 0"),
        (gym.spaces.Box(-1, 1, (2,)), 0.5, [1.0, 1.0], r"are for discrete actions"),
        (gym.spaces.Discrete(2), 1.0, None, r"hold must be in \[0, 1\), got 1.0"),
        (gym.spaces.MultiBinary(3), 0.5, None, r"not supported"),
    ],
)
def test_random_policy_refuses_what_it_cannot_draw(space, hold, weights, message):
    with pytest.raises(ValueError, match=message):
        RandomPolicy(space, hold, weights, np.random.default_rng(0))


def catch_rows(steps: int) -> list:
    policy = RandomPolicy(gym.spaces.Discrete(3), 0.5, None, np.random.default_rng(0))
    return collect_stacks("splitrl/Catch-v0", {}, CATCH, 1, steps, lambda _: policy, seed=3)


def test_collected_stacks_are_the_edges_stacks_and_restart_with_each_episode():
    rows = catch_rows(30)  # Catch's episodes are 11 agent steps: 30 steps cross two episode ends
    assert len(rows) == 31
    assert all(len(row) == CATCH.frame_stack for row in rows)
    stacks = stack_rows(rows)
    assert stacks.shape == (31, 4, 36, 36) and stacks.dtype == torch.uint8
    starts = [i for i, row in enumerate(rows) if all(frame is row[0] for frame in row)]
    assert starts == [0, 11, 22], starts  # an episode's first frame fills its first stack (core.framestack)
    for i in range(1, 11):  # within an episode each stack is the last one moved on by one frame
        assert rows[i][:-1] == rows[i - 1][1:]


def test_pretraining_reconstructs_held_out_catch_frames_better_than_their_mean():
    torch.manual_seed(0)
    encoder = CATCH.encoder()
    before = [p.detach().clone() for p in encoder.parameters()]
    # ~10 s on one thread: Catch's frames are black but for a 3 x 3 ball and a paddle, and the autoencoder
    # first learns their mean (0.94 of its error at 300 steps); 0.74 at 600 steps (seed 0)
    result = pretrain(encoder, CATCH, catch_rows(600), 600, 32, 1e-3, torch.Generator().manual_seed(0))
    assert (result.steps, result.stacks, result.held_out) == (600, 601, 60)
    assert result.held_out_mse < 0.85 * result.mean_predictor_mse, result
    assert any(not torch.equal(a, b) for a, b in zip(before, encoder.parameters(), strict=True))
    assert not encoder.training  # handed back in eval mode, as the edge runs it


def test_held_out_stacks_share_no_frame_with_training_stacks():
    rows = catch_rows(100)
    training, held_out = split_held_out(rows, CATCH.frame_stack)
    assert held_out == rows[-10:] and training == rows[: 101 - 10 - 3]
    training_frames = {id(frame) for row in training for frame in row}
    assert not training_frames & {id(frame) for row in held_out for frame in row}
    with pytest.raises(ValueError, match="more than 4 frame stacks, got 1"):
        pretrain(CATCH.encoder(), CATCH, rows[:1], 1, 1, 1e-3, torch.Generator())


def test_quality_is_the_share_of_the_mean_predictors_error_removed():
    assert quality(RESULT) == pytest.approx(0.75)
    assert np.isnan(quality(PretrainResult(1, 10, 1, 0.0, 0.0, 1.0)))


RESULT = PretrainResult(steps=3, stacks=10, held_out=1, held_out_mse=0.01, mean_predictor_mse=0.04, seconds=1.0)


def test_a_pretrained_file_loads_only_into_the_shapes_and_env_it_was_made_for(tmp_path):
    encoder = CATCH.encoder()
    path = tmp_path / "encoder.pt"
    save_pretrained(path, encoder, CATCH, "splitrl/Catch-v0", RESULT)
    loaded = load_pretrained(path, CATCH, "splitrl/Catch-v0")
    assert all(torch.equal(loaded[name], value) for name, value in encoder.state_dict().items())
    wider = ModelConfig(4, 36, 64, "layernorm")
    with pytest.raises(ValueError, match=r"holds an encoder for .*'width': 32.*this run's is .*'width': 64"):
        load_pretrained(path, wider, "splitrl/Catch-v0")
    with pytest.raises(ValueError, match=r"pretrained on 'splitrl/Catch-v0', but this run's env is 'CarRacing-v3'"):
        load_pretrained(path, CATCH, "CarRacing-v3")
    with pytest.raises(FileNotFoundError, match="splitrl pretrain-encoder"):
        load_pretrained(tmp_path / "missing.pt", CATCH, "splitrl/Catch-v0")
    checkpoint.save({"version": 3, "encoder": encoder.state_dict()}, tmp_path / "edge.pt")  # an edge checkpoint
    with pytest.raises(ValueError, match="not a pretrained encoder file"):
        load_pretrained(tmp_path / "edge.pt", CATCH, "splitrl/Catch-v0")
    for name, content in [("empty.pt", b""), ("text.pt", b"weights: none\n"), ("cut.pt", path.read_bytes()[:500])]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=rf"{name} is not a pretrained encoder file: \w+"):
            load_pretrained(tmp_path / name, CATCH, "splitrl/Catch-v0")


def test_pretrain_settings_take_a_recipes_env_shapes_and_seed_and_comma_weights():
    values = recipe_values(REPO / "configs" / "carracing.yaml", PretrainSettings)
    assert values == {
        "env": "CarRacing-v3",
        "env_kwargs": {"continuous": False},
        "action_repeat": 4,
        "frame_size": 96,
        "frame_stack": 4,
        "width": 4096,
    }
    settings = validate_settings(PretrainSettings, {**values, "random_action_weights": "1, 2,2,4,1"})
    assert settings.random_action_weights == [1.0, 2.0, 2.0, 4.0, 1.0]
    with pytest.raises(ValueError, match=r"--random-action-hold.*got 1"):
        validate_settings(PretrainSettings, {"random_action_hold": 1})


def test_encoder_init_is_refused_in_cloud_mode(tmp_path):
    settings = validate_settings(EdgeEncoderSettings, {"mode": "split", "encoder_init": str(tmp_path / "encoder.pt")})
    assert settings.encoder_init == tmp_path / "encoder.pt"  # read when the edge starts without a checkpoint
    with pytest.raises(ValueError, match=r"encoder_init=.*mode='cloud' has none on the edge"):
        validate_settings(EdgeEncoderSettings, {"mode": "cloud", "encoder_init": str(tmp_path / "encoder.pt")})
