"""Training-phase WAN traffic of each mode, counted on the `learner-encoder` link after a short real run.

The prediction is the research's (docs/design.md §1): the naive split moves
activations up and gradients down for every sample of every epoch,
2 directions x epochs x width bf16 numbers per sample, or a sampled `encoder_fraction`
of them; split-accumulate moves gradients down for `encoder_fraction` of them only
(0.25 unless set); cloud moves nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from splitrl.core import scrape
from splitrl.learner.settings import ACCUMULATE_ENCODER_FRACTION
from tests.integration.stack import Stack

WIDTH = 4096
UNROLL = 8
LEARNER = {
    "chunks_per_update": 4,
    "epochs": 3,
    "minibatches": 2,
    "max_updates": 2,
}
TRAINED_SAMPLES = LEARNER["max_updates"] * LEARNER["chunks_per_update"] * UNROLL
#: Bytes the talk's naive split moves per trained sample: activations up + gradients down, every epoch, bf16.
SPLIT_BYTES_PER_SAMPLE = 2 * LEARNER["epochs"] * WIDTH * 2


async def split_stack(*, width: int = WIDTH, learner: dict | None = None, **edge: Any) -> Stack:
    """A split stack of 2 envs whose learner trains `learner` (LEARNER: 2 updates) and stops; `edge`: the
    edge-encoder's settings."""
    return await Stack.start(
        "split", num_envs=2, steps=0, unroll_length=UNROLL, width=width, learner=learner or LEARNER, edge=edge
    )


@pytest.fixture(params=["cloud", "split", "split-accumulate"])
async def trained(request):
    mode = request.param
    stack = await Stack.start(mode, num_envs=2, steps=0, unroll_length=UNROLL, width=WIDTH, learner=LEARNER)
    try:
        await stack.wait_learner_done()
        await asyncio.sleep(0.5)  # split-accumulate: the last pushed gradients reach the edge and are acked
        yield mode, stack.scrape()
    finally:
        await stack.stop()


def training_wan_bytes(texts: dict[str, str]) -> int:
    links = scrape.link_counts(texts.values())
    return sum(b for (link, phase), b in scrape.sent_bytes(links).items() if link == "learner-encoder")


def test_training_traffic_matches_the_mode(trained):
    mode, texts = trained
    sent = training_wan_bytes(texts)
    if mode == "cloud":
        assert sent == 0
        return
    predicted_split = TRAINED_SAMPLES * SPLIT_BYTES_PER_SAMPLE
    if mode == "split":
        assert sent == pytest.approx(predicted_split, rel=0.05), f"{sent} B vs predicted {predicted_split} B"
    else:
        assert 0 < sent <= ACCUMULATE_ENCODER_FRACTION * predicted_split, f"{sent} B vs {predicted_split} B"
        assert scrape.total([texts["edge-encoder"]], "splitrl_encoder_updates_total") > 0


def test_training_link_counts_agree_on_both_ends(trained):
    mode, texts = trained
    links = scrape.link_counts(texts.values())
    if mode == "cloud":
        assert "learner-encoder" not in links
        return
    for payload, ends in links["learner-encoder"]["training"].items():
        assert ends.get("sent") == ends.get("received"), f"{payload}: {ends}"
    edge = texts["edge-encoder"]
    assert scrape.total([edge], "splitrl_encoder_version") > 0  # the edge's encoder trained
    assert scrape.total([edge], "splitrl_unknown_step_ids_total") == 0  # the store held every step asked for


async def test_steps_the_edge_no_longer_holds_are_counted_and_training_goes_on():
    # A store of 8 steps cannot hold a 4-chunk x 8-step batch: most ids are evicted before the learner asks.
    stack = await split_stack(width=256, observation_store_size=8)
    try:
        await stack.wait_learner_done()
        texts = stack.scrape()
        edge = texts["edge-encoder"]
        assert scrape.total([edge], "splitrl_unknown_step_ids_total") > 0
        assert scrape.total([edge], "splitrl_observation_store_size") <= 8
        assert stack.hosts["edge-encoder"].service.failure() is None
    finally:
        await stack.stop()


async def test_learner_sends_priorities_to_a_prioritized_table():
    learner = {**LEARNER, "importance_beta": 0.4, "priority_updates": True}
    # max_times_sampled 4: a chunk sampled in an update is still there when its new priority arrives.
    replay = {"selector": "prioritized", "max_times_sampled": 4, "priority_exponent": 0.6}
    stack = await Stack.start("cloud", num_envs=2, steps=0, unroll_length=UNROLL, learner=learner, replay=replay)
    try:
        await stack.wait_learner_done()
        texts = stack.scrape()
        updated = [
            value
            for name, labels, value in scrape.samples(texts["replay"])
            if name == "splitrl_replay_priority_updates_total" and labels.get("outcome") == "applied"
        ]
        assert sum(updated) > 0
    finally:
        await stack.stop()


async def test_quantized_codecs_halve_the_naive_split_training_traffic_and_still_train_the_encoder():
    # int8 activations up and fp8 gradients down: one byte per number instead of bf16's two.
    learner = {**LEARNER, "gradient_codec": "fp8"}
    stack = await split_stack(learner=learner, activation_codec="int8")
    try:
        await stack.wait_learner_done()
        texts = stack.scrape()
        sent = training_wan_bytes(texts)
        predicted = TRAINED_SAMPLES * SPLIT_BYTES_PER_SAMPLE / 2
        assert sent == pytest.approx(predicted, rel=0.05), f"{sent} B vs predicted {predicted} B"
        assert scrape.total([texts["edge-encoder"]], "splitrl_encoder_version") > 0
        assert scrape.total([texts["learner"]], "splitrl_rejected_requests_total") == 0
    finally:
        await stack.stop()


async def test_an_encoder_fraction_cuts_the_naive_split_training_traffic_by_that_share():
    # 2 updates x 3 epochs x 32 rows = 192 draws at 0.5: the share sent is 0.5 +- 0.036 (one sd).
    stack = await split_stack(learner={**LEARNER, "encoder_fraction": 0.5})
    try:
        await stack.wait_learner_done()
        texts = stack.scrape()
        share = training_wan_bytes(texts) / (TRAINED_SAMPLES * SPLIT_BYTES_PER_SAMPLE)
        assert 0.35 < share < 0.65, f"sent {share:.2f} of the naive split's training bytes at encoder_fraction 0.5"
        assert scrape.total([texts["edge-encoder"]], "splitrl_encoder_version") > 0
    finally:
        await stack.stop()


async def test_an_edge_training_a_few_rows_per_pass_moves_the_same_bytes_and_steps_on_every_minibatch():
    # --encoder-rows-per-pass: the edge keeps no graph between activations and gradients; the wire is unchanged.
    stack = await split_stack(encoder_rows_per_pass=3)
    try:
        await stack.wait_learner_done()
        steps = LEARNER["max_updates"] * LEARNER["epochs"] * LEARNER["minibatches"]
        for _ in range(50):  # the last gradients may still be on their way to the edge
            texts = stack.scrape()
            if scrape.total([texts["edge-encoder"]], "splitrl_encoder_version") == steps:
                break
            await asyncio.sleep(0.1)
        assert scrape.total([texts["edge-encoder"]], "splitrl_encoder_version") == steps
        sent = training_wan_bytes(texts)
        predicted = TRAINED_SAMPLES * SPLIT_BYTES_PER_SAMPLE
        assert sent == pytest.approx(predicted, rel=0.05), f"{sent} B vs predicted {predicted} B"
        assert scrape.total([texts["edge-encoder"]], "splitrl_unknown_step_ids_total") == 0
    finally:
        await stack.stop()
