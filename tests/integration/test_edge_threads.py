"""A split edge in a real stack acts on its acting thread and trains on its training thread (edge_encoder.service):
an env's step never queues behind a training step."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from splitrl.edge_encoder.training import EncoderTrainer
from tests.integration.stack import Stack

pytestmark = pytest.mark.asyncio

LEARNER = {"chunks_per_update": 2, "epochs": 1, "minibatches": 2, "max_updates": 2}


def recording(method: Any, threads: set[str]) -> Any:
    def recorded(self: EncoderTrainer, *args: Any, **kwargs: Any) -> Any:
        threads.add(threading.current_thread().name.rsplit("_", 1)[0])  # "acting_0" -> "acting"
        return method(self, *args, **kwargs)

    return recorded


@pytest.mark.parametrize("mode", ["split", "split-accumulate"])
async def test_a_split_edge_acts_and_trains_on_threads_of_their_own(mode, monkeypatch: pytest.MonkeyPatch):
    acting: set[str] = set()
    training: set[str] = set()
    monkeypatch.setattr(EncoderTrainer, "act", recording(EncoderTrainer.act, acting))
    monkeypatch.setattr(EncoderTrainer, "apply", recording(EncoderTrainer.apply, training))
    monkeypatch.setattr(EncoderTrainer, "activations", recording(EncoderTrainer.activations, training))
    stack = await Stack.start(mode, num_envs=2, steps=0, unroll_length=8, width=64, learner=LEARNER)
    try:
        await stack.wait_learner_done()
    finally:
        await stack.stop()
    assert acting == {"acting"}
    assert training == {"training"}
