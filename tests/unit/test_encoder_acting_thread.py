"""The edge acts on one thread while it trains on another (edge_encoder.training's lock): acting never waits for a
training pass, and never sees an optimizer step half done."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from splitrl.core import wire
from splitrl.core.step_ids import pack_step_ids
from splitrl.edge_encoder.training import EncoderTrainer
from splitrl.v1 import training_pb2
from tests.unit.test_encoder_training import WIDTH, as_rows, make_trainer, stacks

#: Every wait in these tests is bounded: a lock that blocks where it should not fails the test, it does not hang it.
WAIT_S = 10.0


def gradients_for(step_ids: list[int]) -> training_pb2.EncoderGradients:
    return training_pb2.EncoderGradients(
        request_id=1,
        steps=pack_step_ids(step_ids),
        gradients=wire.encode(torch.ones(len(step_ids), WIDTH), wire.DType.DTYPE_BFLOAT16),
    )


def test_acting_runs_while_a_training_pass_is_in_progress():
    trainer, _ = make_trainer()
    trainer.store.put([1, 2], as_rows(stacks(2)))
    in_training_pass, acted = threading.Event(), threading.Event()

    def hold_the_training_pass(module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
        if torch.is_grad_enabled():  # training's pass, not acting's
            in_training_pass.set()
            acted.wait(WAIT_S)

    trainer.encoder.register_forward_hook(hold_the_training_pass)
    with ThreadPoolExecutor(1) as training:
        applied = training.submit(trainer.apply, gradients_for([1, 2]))
        assert in_training_pass.wait(WAIT_S)
        activations, version = trainer.act([3, 4], as_rows(stacks(2, seed=1)), stacks(2, seed=1))
        acted.set()  # reached only if acting did not wait for the pass
        assert applied.result(WAIT_S).encoder_version == 1
    assert version == 0 and activations.shape == (2, WIDTH)
    assert len(trainer.store) == 4


def slow_step(trainer: EncoderTrainer) -> None:
    """Make the optimizer step one parameter at a time with a pause between: without the lock, acting during it
    would read some layers stepped and some not."""
    step = trainer.optimizer.step
    parameters = list(trainer.encoder.parameters())

    def stepped_slowly() -> None:
        saved = [p.detach().clone() for p in parameters]
        step()
        stepped = [p.detach().clone() for p in parameters]
        with torch.no_grad():
            for p, old in zip(parameters, saved, strict=True):
                p.copy_(old)
            for p, new in zip(parameters, stepped, strict=True):
                p.copy_(new)
                time.sleep(0.002)

    trainer.optimizer.step = stepped_slowly  # type: ignore[method-assign]


def test_acting_during_an_optimizer_step_sees_the_weights_before_or_after_it_with_their_version():
    trainer, _ = make_trainer()
    observed = stacks(3, seed=2)
    trainer.store.put([1, 2], as_rows(stacks(2)))
    before = trainer.encode(observed)
    slow_step(trainer)
    results: list[tuple[torch.Tensor, int]] = []
    with ThreadPoolExecutor(1) as training:
        applied = training.submit(trainer.apply, gradients_for([1, 2]))
        deadline = time.monotonic() + WAIT_S
        while not applied.done() and time.monotonic() < deadline:
            results.append(trainer.act([10, 11, 12], as_rows(observed), observed))
        applied.result(WAIT_S)
    after = trainer.encode(observed)
    assert not torch.equal(before, after) and results
    for activations, version in results:
        assert torch.equal(activations, before if version == 0 else after), version
