"""The edge acts on one thread while it trains on another (edge_encoder.training's lock): acting never waits for a
training pass, never sees an optimizer step half done, and what both threads touch is touched under the lock."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from splitrl.core import wire
from splitrl.core.step_ids import pack_step_ids
from splitrl.edge_encoder.training import EncoderTrainer
from splitrl.v1 import training_pb2
from tests.unit.test_encoder_training import WIDTH, accumulate_gradients, as_rows, make_trainer, stacks

#: Every wait in these tests is bounded: a lock that blocks where it should not fails the test, it does not hang it.
WAIT_S = 10.0


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
        applied = training.submit(trainer.apply, accumulate_gradients(None))
        assert in_training_pass.wait(WAIT_S)
        activations, version = trainer.act([3, 4], as_rows(stacks(2, seed=1)), stacks(2, seed=1))
        acted.set()  # reached only if acting did not wait for the pass
        assert applied.result(WAIT_S).encoder_version == 1
    assert version == 0 and activations.shape == (2, WIDTH)
    assert len(trainer.store) == 4


def slow_step(trainer: EncoderTrainer, stepping: threading.Event) -> None:
    """Make the optimizer step set `stepping`, then write the stepped weights one parameter at a time with a pause
    between: without the lock, acting during it would read some layers stepped and some not."""
    step = trainer.optimizer.step
    parameters = list(trainer.encoder.parameters())

    def stepped_slowly() -> None:
        stepping.set()
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
    stepping = threading.Event()
    slow_step(trainer, stepping)
    results: list[tuple[torch.Tensor, int]] = []
    with ThreadPoolExecutor(1) as training:
        applied = training.submit(trainer.apply, accumulate_gradients(None))
        deadline = time.monotonic() + WAIT_S
        while not stepping.is_set() and time.monotonic() < deadline:
            results.append(trainer.act([10, 11, 12], as_rows(observed), observed))
        assert stepping.is_set()
        results.append(trainer.act([10, 11, 12], as_rows(observed), observed))  # begun during the step
        applied.result(WAIT_S)
    after = trainer.encode(observed)
    assert not torch.equal(before, after)
    assert results[-1][1] == 1
    for activations, version in results:
        assert torch.equal(activations, before if version == 0 else after), version


class LockSpy(EncoderTrainer):
    """Records, for every write of `version`, whether the trainer's lock was held."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "version" and "_shared" in self.__dict__:
            self.__dict__.setdefault("version_writes_locked", []).append(self._shared.locked())
        super().__setattr__(name, value)


def test_everything_acting_shares_with_training_is_touched_under_the_lock():
    trainer, _ = make_trainer()
    spy = LockSpy.__new__(LockSpy)
    spy.__dict__.update(trainer.__dict__)
    touched: list[tuple[str, bool]] = []

    def under_lock(name: str, method: Any) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            touched.append((name, spy._shared.locked()))
            return method(*args, **kwargs)

        return recorded

    spy.optimizer.step = under_lock("optimizer.step", spy.optimizer.step)  # type: ignore[method-assign]
    spy.store.put = under_lock("store.put", spy.store.put)  # type: ignore[method-assign]
    spy.store.lookup = under_lock("store.lookup", spy.store.lookup)  # type: ignore[method-assign]
    spy.act([1, 2, 3], as_rows(stacks(3)), stacks(3))
    spy.apply(accumulate_gradients(None))  # split-accumulate: a lookup and a step
    spy.activations(training_pb2.ActivationRequest(request_id=2, steps=pack_step_ids([3])))  # split
    spy.apply(training_pb2.EncoderGradients(request_id=2, gradients=wire.encode_float(torch.ones(1, WIDTH), "bf16")))
    assert {name for name, _ in touched} == {"optimizer.step", "store.put", "store.lookup"}
    assert all(locked for _, locked in touched), touched
    assert spy.version == 2 and spy.__dict__["version_writes_locked"] == [True, True]
