"""splitrl.core.onnx_forward and inference's Policy acting through it: the same outputs as torch's network, with
whichever weights a session was built from."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from splitrl.core.models import ActorCritic, ActorCriticHead
from splitrl.core.onnx_forward import ForwardGraph, UnsupportedLayer
from splitrl.core.spec import ActionSpec, ModelConfig
from splitrl.inference.policy import Policy

DISCRETE = ActionSpec("discrete", 5)
CONTINUOUS = ActionSpec("continuous", 3, (-1.0, 0.0, 0.0), (1.0, 1.0, 1.0))
#: Every shape the encoder takes: the research's (no bottleneck), a ReLU bottleneck, a LayerNorm one.
MODELS = [ModelConfig(), ModelConfig(2, 36, 16, "relu"), ModelConfig(4, 48, 32, "layernorm")]
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def perturbed(network: nn.Module, seed: int) -> nn.Module:
    """`network` with every parameter moved, so no two biases are equal (initial ones are all zero)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return network.eval()


def rows_for(network: nn.Module, count: int = 4) -> torch.Tensor:
    if isinstance(network, ActorCritic):
        return torch.randint(0, 256, (count, *network.encoder.input_shape), dtype=torch.uint8)
    return torch.randn(count, network.width).to(torch.bfloat16)  # activations arrive as bf16 in the split modes


def torch_outputs(network: nn.Module, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities or Gaussian means, values) from torch's own forward pass."""
    with torch.no_grad():
        distribution, value = network(rows)
    if hasattr(distribution, "logits"):
        return distribution.logits, value
    return distribution.base_dist.loc, value


@pytest.mark.parametrize("model", MODELS, ids=["4096-wide", "relu-bottleneck", "layernorm-bottleneck"])
@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS], ids=["discrete", "continuous"])
def test_an_actor_critic_acts_as_torch_does(model: ModelConfig, spec: ActionSpec):
    network = perturbed(ActorCritic(model, spec), seed=1)
    rows = rows_for(network)
    outputs = ForwardGraph(network, threads=1).session(network.state_dict()).run(rows)
    expected_params, expected_value = torch_outputs(network, rows)
    params = outputs.logits_or_mean.log_softmax(-1) if spec.kind == "discrete" else outputs.logits_or_mean
    torch.testing.assert_close(params, expected_params, **TOLERANCE)
    torch.testing.assert_close(outputs.value, expected_value, **TOLERANCE)


def test_a_head_alone_acts_on_bf16_activations_as_torch_does():
    network = perturbed(ActorCriticHead(64, DISCRETE), seed=2)
    rows = rows_for(network, count=3)
    outputs = ForwardGraph(network, threads=2).session(network.state_dict()).run(rows)
    expected_logits, expected_value = torch_outputs(network, rows)
    torch.testing.assert_close(outputs.logits_or_mean.log_softmax(-1), expected_logits, **TOLERANCE)
    torch.testing.assert_close(outputs.value, expected_value, **TOLERANCE)


def test_a_session_acts_with_the_weights_it_was_built_from_not_those_the_graph_was_written_with():
    written_with = perturbed(ActorCritic(MODELS[1], DISCRETE), seed=3)
    other = perturbed(ActorCritic(MODELS[1], DISCRETE), seed=4)
    graph = ForwardGraph(written_with, threads=1)
    rows = rows_for(other, count=5)
    outputs = graph.session(other.state_dict()).run(rows)
    expected_logits, expected_value = torch_outputs(other, rows)
    torch.testing.assert_close(outputs.logits_or_mean.log_softmax(-1), expected_logits, **TOLERANCE)
    torch.testing.assert_close(outputs.value, expected_value, **TOLERANCE)
    assert not torch.allclose(outputs.value, torch_outputs(written_with, rows)[1], **TOLERANCE)


def test_missing_weights_threads_below_one_and_other_layers_are_refused_by_name():
    network = ActorCritic(MODELS[1], DISCRETE)
    graph = ForwardGraph(network, threads=1)
    incomplete = {name: value for name, value in network.state_dict().items() if name != "head.critic.bias"}
    with pytest.raises(KeyError, match=r"head\.critic\.bias"):
        graph.session(incomplete)
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        ForwardGraph(network, threads=0)
    network.head.trunk[1] = nn.Tanh()
    with pytest.raises(UnsupportedLayer, match=r"head\.trunk\.1: Tanh"):
        ForwardGraph(network, threads=1)
    with pytest.raises(UnsupportedLayer, match="not Linear"):
        ForwardGraph(nn.Linear(2, 2), threads=1)


@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS], ids=["discrete", "continuous"])
def test_a_policy_acting_in_onnxruntime_decides_as_one_acting_in_torch_across_a_weights_swap(spec: ActionSpec):
    in_torch, in_ort = (Policy("cloud", MODELS[1], spec, seed=7, runtime=name) for name in ("torch", "onnxruntime"))
    assert in_ort.acting_in == "torch"  # until its first session is prepared and loaded (inference: once serving)
    in_ort.load(in_ort.prepare(in_ort.weights_now()[0]), version=0)
    assert (in_torch.acting_in, in_ort.acting_in) == ("torch", "onnxruntime")
    new_weights = perturbed(ActorCritic(MODELS[1], spec), seed=8).state_dict()
    for version in (0, 1):
        rows = rows_for(in_torch.network, count=6)
        expected, decided = in_torch.act(rows), in_ort.act(rows)
        torch.testing.assert_close(decided.actions, expected.actions, **TOLERANCE)
        torch.testing.assert_close(decided.log_probs, expected.log_probs, **TOLERANCE)
        torch.testing.assert_close(decided.values, expected.values, **TOLERANCE)
        assert decided.policy_version == expected.policy_version == version
        for policy in (in_torch, in_ort):
            policy.load(policy.prepare(new_weights), version=1)
    assert in_ort.acting_in == "onnxruntime"


def test_weights_onnxruntime_cannot_take_are_acted_with_in_torch(caplog: pytest.LogCaptureFixture):
    policy = Policy("cloud", MODELS[1], DISCRETE, seed=0, runtime="onnxruntime")
    policy.network.head.trunk[1] = nn.Tanh()  # a layer ForwardGraph does not write
    rows = rows_for(policy.network)
    prepared = policy.prepare(policy.weights_now()[0])
    assert prepared.session is None
    assert "torch acts with them" in caplog.text
    policy.load(prepared, version=1)
    assert policy.acting_in == "torch"
    torch.testing.assert_close(policy.act(rows).values, torch_outputs(policy.network, rows)[1])


def test_an_unknown_runtime_and_threads_below_one_are_refused_by_name():
    with pytest.raises(ValueError, match="runtime must be 'onnxruntime' or 'torch', got 'tensorrt'"):
        Policy("cloud", MODELS[1], DISCRETE, seed=0, runtime="tensorrt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        Policy("cloud", MODELS[1], DISCRETE, seed=0, runtime="onnxruntime", threads=0)
