"""splitrl.core.models: encoder widths, head distributions, ActionSpec checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from splitrl.core.envs import CATCH_ID, make_env
from splitrl.core.framestack import FrameStacker
from splitrl.core.models import ActorCritic, ActorCriticHead, Encoder, unit_range
from splitrl.core.spec import ActionSpec, ModelConfig

B = 2


def stacks(frame_stack: int = 4, frame_size: int = 96) -> torch.Tensor:
    return torch.randint(0, 256, (B, frame_stack, frame_size, frame_size), dtype=torch.uint8)


def linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def test_encoder_on_4x96x96_gives_4096_numbers_without_a_linear_layer():
    encoder = Encoder(frame_stack=4, frame_size=96, width=4096)
    out = encoder(stacks())
    assert out.shape == (B, 4096)
    assert out.dtype == torch.float32
    assert linears(encoder) == []


def test_encoder_outputs_are_non_negative():
    assert bool((Encoder()(stacks()) >= 0).all())


def test_other_width_adds_a_bottleneck():
    encoder = Encoder(frame_stack=4, frame_size=96, width=256)
    assert encoder(stacks()).shape == (B, 256)
    [bottleneck] = linears(encoder)
    assert (bottleneck.in_features, bottleneck.out_features) == (4096, 256)


def test_other_frame_size_adds_a_bottleneck_to_the_requested_width():
    encoder = Encoder(frame_stack=2, frame_size=84, width=4096)
    assert encoder(stacks(frame_stack=2, frame_size=84)).shape == (B, 4096)
    [bottleneck] = linears(encoder)
    assert bottleneck.in_features == 64 * 7 * 7


def test_unit_range_is_the_frames_over_255_within_an_ulp_in_their_own_layout():
    every_byte = torch.arange(256, dtype=torch.uint8)
    scaled = unit_range(every_byte)
    assert scaled.dtype == torch.float32
    assert scaled[0] == 0 and scaled[255] == 1
    ulp = torch.nextafter(every_byte / 255.0, torch.tensor(2.0)) - every_byte / 255.0
    assert bool(((scaled - every_byte / 255.0).abs() <= ulp).all())
    channels_last = stacks().contiguous(memory_format=torch.channels_last)
    assert unit_range(channels_last).is_contiguous(memory_format=torch.channels_last)
    already_float = every_byte.float()
    assert unit_range(already_float) is not already_float and already_float[255] == 255  # the caller's, untouched


def test_encoder_reads_its_frames_in_unit_range():
    encoder = Encoder(width=4096)
    frames = stacks()
    assert torch.equal(encoder(frames), encoder.net(unit_range(frames)))


def test_with_channels_last_weights_the_frames_reach_the_first_convolution_channels_last_with_the_same_numbers():
    """The learner's layout (learner.network.learner_network): frames are reordered while still uint8, and the
    outputs and gradients are those of the float frames reordered by the convolution itself."""
    encoder = Encoder(width=4096).to(memory_format=torch.channels_last)
    frames = stacks()
    layouts: list[bool] = []
    first_conv = encoder.net[0][0]
    hook = first_conv.register_forward_pre_hook(
        lambda _, inputs: layouts.append(inputs[0].is_contiguous(memory_format=torch.channels_last))
    )
    outputs = encoder(frames)
    outputs.square().sum().backward()
    gradients = [p.grad.clone() for p in encoder.parameters()]
    hook.remove()
    encoder.zero_grad()
    expected = encoder.net(unit_range(frames))
    expected.square().sum().backward()
    assert layouts == [True]
    assert torch.equal(outputs, expected)
    assert all(torch.equal(g, p.grad) for g, p in zip(gradients, encoder.parameters(), strict=True))


def test_with_contiguous_weights_the_frames_keep_their_layout():
    """Inference and the edge act on a few rows, where channels-last is slower: their encoders keep the layout
    the frames come in."""
    encoder = Encoder(width=4096)
    layouts: list[bool] = []
    encoder.net[0][0].register_forward_pre_hook(lambda _, inputs: layouts.append(inputs[0].is_contiguous()))
    encoder(stacks())
    assert layouts == [True]


def catch_stacks(steps: int) -> torch.Tensor:
    """uint8 [steps, 4, 36, 36]: Catch played by a fixed action cycle, stacked as the edge stacks (mostly black)."""
    env = make_env(CATCH_ID, {}, frame_size=36, action_repeat=1)
    stacker = FrameStacker(1, 4, 36, 36)
    observation, _ = env.reset(seed=0)
    stacks, episode_start = [], True
    for step in range(steps):
        stacks.append(stacker.push(torch.as_tensor(observation)[None], torch.tensor([episode_start]))[0])
        observation, _, terminated, truncated, _ = env.step(step % 3)
        if episode_start := terminated or truncated:
            observation, _ = env.reset()
    return torch.stack(stacks)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_fresh_encoders_features_follow_its_input_on_dark_frames(seed):
    """With torch's default init the biases dominated: over these frames each feature varied by ~5% of its
    mean magnitude, so the head had nothing to act on until the encoder trained. Orthogonal, zero-bias: ~110%."""
    torch.manual_seed(seed)
    with torch.no_grad():
        features = Encoder(frame_stack=4, frame_size=36, width=256)(catch_stacks(200))
    assert float(features.std(dim=0).mean() / features.abs().mean()) > 0.5


def test_every_layer_starts_orthogonal_with_zero_biases_at_its_gain():
    network = ActorCritic(ModelConfig(frame_stack=4, frame_size=96, width=256), ActionSpec("discrete", 5))
    modules = [*network.encoder.net.modules(), *network.head.trunk.modules()]
    hidden = [m for m in modules if isinstance(m, nn.Conv2d | nn.Linear)]
    assert len(hidden) == 5  # 3 convolutions, the bottleneck, the trunk
    gains = [(layer, 2**0.5) for layer in hidden] + [(network.head.actor, 0.01), (network.head.critic, 1.0)]
    for layer, gain in gains:
        weight = layer.weight.detach().flatten(1)
        rows, columns = weight.shape
        gram = weight @ weight.T if rows <= columns else weight.T @ weight
        assert torch.allclose(gram, gain**2 * torch.eye(min(rows, columns)), atol=1e-4), layer
        assert layer.bias is not None and not layer.bias.any(), layer


def test_discrete_head_returns_a_categorical_and_values():
    head = ActorCriticHead(32, ActionSpec("discrete", 3))
    distribution, values = head(torch.randn(B, 32))
    assert isinstance(distribution, Categorical)
    assert distribution.probs.shape == (B, 3)
    actions = distribution.sample()
    assert actions.shape == (B,)
    assert distribution.log_prob(actions).shape == (B,)
    assert values.shape == (B,)


def test_continuous_head_returns_an_independent_normal():
    head = ActorCriticHead(32, ActionSpec("continuous", 3, (-1.0,) * 3, (1.0,) * 3))
    distribution, values = head(torch.randn(B, 32))
    assert isinstance(distribution, Independent)
    assert isinstance(distribution.base_dist, Normal)
    assert distribution.batch_shape == (B,)
    assert distribution.event_shape == (3,)
    actions = distribution.sample()
    assert actions.shape == (B, 3)
    assert distribution.log_prob(actions).shape == (B,)
    assert values.shape == (B,)
    assert torch.allclose(distribution.base_dist.scale, torch.full((B, 3), torch.tensor(-0.5).exp().item()))


def test_head_accepts_bfloat16_activations():
    head = ActorCriticHead(16, ActionSpec("discrete", 2))
    distribution, values = head(torch.randn(B, 16).to(torch.bfloat16))
    assert values.dtype == torch.float32
    assert distribution.probs.shape == (B, 2)


@pytest.mark.parametrize(
    "spec", [ActionSpec("discrete", 3), ActionSpec("continuous", 3, (-1.0,) * 3, (1.0,) * 3)], ids=lambda s: s.kind
)
def test_under_bfloat16_autocast_the_output_layers_stay_float32(spec):
    torch.manual_seed(0)
    model = ActorCritic(ModelConfig(frame_stack=4, frame_size=96, width=4096), spec)
    frames = stacks()
    expected_distribution, expected_values = model(frames)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the learner's --train-precision bfloat16
        distribution, values = model(frames)
        hidden = model.head.trunk(model.encoder(frames))
    assert hidden.dtype == torch.bfloat16  # the trunk and encoder did run in bfloat16 ...
    assert torch.equal(values, model.head.critic(hidden.float()).squeeze(-1))  # ... the critic in float32
    outputs, expected = _policy_outputs(distribution), _policy_outputs(expected_distribution)
    assert outputs.dtype == values.dtype == torch.float32  # ... the outputs did not
    # What separates the two is the features' rounding (bfloat16 keeps 8 significant bits, ~0.4% each).
    assert (outputs - expected).abs().max() <= 0.02 * expected.abs().max()
    assert (values - expected_values).abs().max() <= 0.02 * expected_values.abs().max()
    assert not torch.equal(values, expected_values)


def _policy_outputs(distribution: Distribution) -> torch.Tensor:
    """A discrete policy's logits, a continuous one's means."""
    return distribution.logits if isinstance(distribution, Categorical) else distribution.base_dist.loc


def test_actor_critic_runs_encoder_then_head():
    model = ActorCritic(ModelConfig(frame_stack=4, frame_size=96, width=4096), ActionSpec("discrete", 3))
    frames = stacks()
    distribution, values = model(frames)
    expected_distribution, expected_values = model.head(model.encoder(frames))
    assert torch.allclose(distribution.logits, expected_distribution.logits)
    assert torch.allclose(values, expected_values)


def test_action_shape():
    assert ActionSpec("discrete", 5).action_shape == ()
    assert ActionSpec("continuous", 2, (0.0, 0.0), (1.0, 1.0)).action_shape == (2,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "discrete", "size": 0}, "size must be >= 1, got 0"),
        ({"kind": "continuous", "size": -1}, "got -1"),
        ({"kind": "continuous", "size": 2}, "needs 2 low/high bounds"),
        ({"kind": "continuous", "size": 2, "low": (0.0,), "high": (1.0, 1.0)}, "needs 2 low/high bounds"),
        ({"kind": "continuous", "size": 1, "low": (0.0,), "high": ()}, "needs 1 low/high bounds"),
    ],
)
def test_action_spec_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ActionSpec(**kwargs)


def test_action_spec_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        ActionSpec("Discrete", 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("width", [32, 4096])
def test_a_layernorm_bottleneck_bounds_activations_whatever_the_weights(width):
    torch.manual_seed(0)
    encoder = Encoder(4, 96, width, bottleneck="layernorm")
    with torch.no_grad():
        for parameter in encoder.parameters():
            parameter.mul_(1000.0)  # an encoder trained into huge activations
        activations = encoder(torch.randint(0, 256, (8, 4, 96, 96), dtype=torch.uint8))
    assert activations.shape == (8, width)
    assert activations.abs().max() <= (width - 1) ** 0.5 + 1e-3
    assert torch.allclose(activations.mean(dim=1), torch.zeros(8), atol=1e-4)


def test_an_unknown_bottleneck_is_refused():
    with pytest.raises(ValueError, match="'tanh'"):
        Encoder(4, 96, 32, bottleneck="tanh")  # type: ignore[arg-type]
