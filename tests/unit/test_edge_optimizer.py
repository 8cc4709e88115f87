"""The edge's Adam (edge_encoder.optimizer.LeanAdam): torch.optim.Adam's steps and checkpoints, without the import
of torch._dynamo and sympy that torch.optim brings into the edge process."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from splitrl.core.models import Encoder
from splitrl.edge_encoder.optimizer import LeanAdam
from splitrl.edge_encoder.training import backward_through


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.Flatten(), nn.LayerNorm(64), nn.Linear(64, 5))


def backward(network: nn.Module, step: int) -> None:
    """Gradients from a loss that differs per step; at odd steps the last layer gets none (its state must not
    step then, as in torch.optim.Adam)."""
    inputs = torch.randn(3, 2, 6, 6, generator=torch.Generator().manual_seed(step))
    loss = network(inputs).pow(2).mean() * (step + 1)
    loss.backward()
    if step % 2:
        network[3].weight.grad = None


def train(network: nn.Module, optimizer: torch.optim.Adam | LeanAdam, steps: range) -> None:
    for step in steps:
        optimizer.zero_grad()
        backward(network, step)
        optimizer.param_groups[0]["lr"] = 1e-2 / (step + 1)  # the learner's schedule changes it per step
        optimizer.step()


def through_a_file(state_dict: dict) -> dict:
    """As a checkpoint carries it: serialized, so reader and writer share no tensor (torch.optim.Adam's
    load_state_dict keeps the tensors it is given)."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def assert_same(left: nn.Module, right: nn.Module) -> None:
    for (name, a), b in zip(left.state_dict().items(), right.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_its_steps_are_torch_adams_bit_for_bit():
    reference, lean = model(), model()
    train(reference, torch.optim.Adam(reference.parameters(), lr=1e-2, eps=1e-5), range(6))
    train(lean, LeanAdam(lean.parameters(), lr=1e-2, eps=1e-5), range(6))
    assert_same(reference, lean)
    assert not torch.equal(model().state_dict()["0.weight"], lean.state_dict()["0.weight"])  # it did train


@pytest.mark.parametrize("saved_by", ["torch", "lean"])
def test_a_checkpoint_of_either_continues_in_the_other_bit_for_bit(saved_by):
    """Old checkpoints (torch.optim.Adam's) resume on a new edge; a new one still loads into torch.optim.Adam."""
    first, second = model(), model()
    torch_adam = torch.optim.Adam(first.parameters(), lr=1e-2, eps=1e-5)
    lean_adam = LeanAdam(second.parameters(), lr=1e-2, eps=1e-5)
    writer, reader = (torch_adam, lean_adam) if saved_by == "torch" else (lean_adam, torch_adam)
    writer_net, reader_net = (first, second) if saved_by == "torch" else (second, first)
    train(writer_net, writer, range(3))
    reader_net.load_state_dict(writer_net.state_dict())
    reader.load_state_dict(through_a_file(writer.state_dict()))
    assert reader.state_dict()["state"][0]["step"] == 3
    train(writer_net, writer, range(3, 7))
    train(reader_net, reader, range(3, 7))
    assert_same(writer_net, reader_net)


def test_a_loaded_state_shares_no_tensor_with_its_source():
    network = model()
    optimizer = LeanAdam(network.parameters(), lr=1e-2)
    train(network, optimizer, range(1))
    saved = optimizer.state_dict()
    before = {key: value.clone() for key, value in saved["state"][0].items()}
    fresh = LeanAdam(model().parameters(), lr=1e-2)
    fresh.load_state_dict(saved)
    train(network, optimizer, range(1, 2))  # moves the source's step and moments in place
    for key, value in before.items():
        assert not torch.equal(optimizer.state[0][key], value), f"{key} did not move: the check proves nothing"
        assert torch.equal(fresh.state[0][key], value), key


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": -1.0}, "lr must be >= 0, got -1.0"),
        ({"lr": math.nan}, "lr must be >= 0, got nan"),
        ({"lr": 1e-3, "eps": -1e-8}, "eps must be >= 0, got -1e-08"),
        ({"lr": 1e-3, "betas": (0.9, 1.0)}, r"betas must be two numbers in \[0, 1\), got \(0.9, 1.0\)"),
        ({"lr": 1e-3, "betas": (0.9,)}, r"betas must be two numbers in \[0, 1\), got \(0.9,\)"),
    ],
)
def test_bad_hyperparameters_are_refused_with_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LeanAdam(model().parameters(), **kwargs)


def test_no_parameters_are_refused():
    with pytest.raises(ValueError, match="at least one parameter, got none"):
        LeanAdam([], lr=1e-3)


def test_a_state_dict_for_other_parameters_is_refused_and_changes_nothing():
    network = model()
    optimizer = LeanAdam(network.parameters(), lr=1e-2)
    train(network, optimizer, range(2))
    before = optimizer.state_dict()
    smaller = torch.optim.Adam(nn.Linear(2, 2).parameters(), lr=1e-2)
    with pytest.raises(ValueError, match="is for 2 parameters; this LeanAdam has 6"):
        optimizer.load_state_dict(smaller.state_dict())
    amsgrad = torch.optim.Adam(model().parameters(), lr=1e-2, amsgrad=True)
    with pytest.raises(ValueError, match="LeanAdam has no amsgrad; the state_dict's group uses them"):
        optimizer.load_state_dict(amsgrad.state_dict())
    fused = {**before, "param_groups": [{**before["param_groups"][0], "fused": True, "weight_decay": 0.1}]}
    with pytest.raises(ValueError, match="LeanAdam has no weight_decay, fused;"):
        optimizer.load_state_dict(fused)
    stray = {**before, "state": {**before["state"], 9: before["state"][0]}}
    with pytest.raises(ValueError, match="state for parameter 9 is not Adam's over"):
        optimizer.load_state_dict(stray)
    partial = {**before, "state": {0: {"step": before["state"][0]["step"]}}}
    with pytest.raises(ValueError, match="state for parameter 0 is not Adam's over"):
        optimizer.load_state_dict(partial)
    two_groups = {"state": {}, "param_groups": [{"params": [0]}, {"params": [1]}]}
    with pytest.raises(ValueError, match="one parameter group, got 2"):
        optimizer.load_state_dict(two_groups)
    assert optimizer.state.keys() == before["state"].keys()
    assert optimizer.param_groups[0]["lr"] == before["param_groups"][0]["lr"] == 5e-3


def test_backpropagating_the_product_gives_backwards_gradients_exactly():
    """training.backward_through (the product's sum, which imports no sympy) against activations.backward(gradients)."""
    stacks = torch.randint(0, 256, (5, 4, 36, 36), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    gradients = torch.randn(5, 32, generator=torch.Generator().manual_seed(2))
    encoders = []
    for use_product in (False, True):
        torch.manual_seed(0)
        encoder = Encoder(4, 36, 32, "layernorm")
        activations = encoder(stacks)
        if use_product:
            backward_through(activations, gradients)
        else:
            activations.backward(gradients)
        encoders.append(encoder)
    for (name, reference), product in zip(encoders[0].named_parameters(), encoders[1].parameters(), strict=True):
        assert reference.grad is not None and reference.grad.abs().sum() > 0, name
        assert torch.equal(reference.grad, product.grad), name
    with pytest.raises(ValueError, match=r"gradients of shape \[5, 1\] for activations \[5, 32\]"):
        backward_through(encoders[1](stacks), gradients[:, :1])  # the product alone would broadcast it


def test_the_edges_training_imports_neither_dynamo_nor_sympy(tmp_path):
    """The point of LeanAdam (and of training.py's backward): a split edge that trains, checkpoints and restores
    its encoder loads no torch._dynamo, torch.fx symbolic shapes or sympy (~70 MB resident with them). Run in a
    fresh interpreter, since this test process may have imported them already."""
    script = textwrap.dedent(
        f"""
        import sys
        import torch
        from prometheus_client import CollectorRegistry
        from splitrl.core import wire
        from splitrl.core.metrics import Metrics
        from splitrl.core.models import Encoder
        from splitrl.core.step_ids import pack_step_ids
        from splitrl.edge_encoder.observation_store import ObservationStore
        from splitrl.edge_encoder.training import EncoderTrainer
        from splitrl.v1 import training_pb2

        def trainer(rows_per_pass):
            return EncoderTrainer(Encoder(4, 36, 32, "layernorm"), ObservationStore(10), Metrics(CollectorRegistry()),
                learning_rate=1e-3, max_grad_norm=0.5, rows_per_pass=rows_per_pass,
                checkpoint_path=__import__("pathlib").Path({str(tmp_path / "encoder.pt")!r}))
        for rows_per_pass in (0, 1):
            edge = trainer(rows_per_pass)
            frames = torch.randint(0, 256, (2, 4, 36, 36), dtype=torch.uint8)
            edge.store.put([1, 2], [tuple(stack.unbind()) for stack in frames])
            gradients = wire.encode(torch.ones(2, 32), wire.DTYPE_BFLOAT16)
            sent = edge.activations(training_pb2.ActivationRequest(request_id=1, steps=pack_step_ids([1, 2])))
            assert sent.activations.shape == [2, 32]
            edge.apply(training_pb2.EncoderGradients(request_id=1, gradients=gradients))  # split
            edge.apply(training_pb2.EncoderGradients(request_id=2, steps=pack_step_ids([1, 2]), gradients=gradients))
            edge.save_checkpoint()
        assert trainer(0).version == 4, "restored"
        loaded = [name for name in ("torch._dynamo", "torch.fx.experimental.symbolic_shapes", "sympy")
                  if name in sys.modules]
        print(loaded)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", f"the edge's training imported {result.stdout.strip()}"
