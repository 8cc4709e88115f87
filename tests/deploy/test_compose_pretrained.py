"""split-accumulate with an encoder pretrained on the edge, under docker-compose.yml for real, as the compose
guide (docs/how-to/compose.md) runs it:
`docker compose run --rm --no-deps edge-encoder pretrain-encoder --out` into the edge's checkpoint volume, then
`up` with SPLITRL_ENCODER_INIT naming that file.

Catch at 36 x 36 (compose's default recipe) with a width-32 layernorm encoder, pretrained for a few Adam steps
only: what is checked is the deployment (the file made in one container, read by the next, kept frozen, no
gradient on the WAN), not that it learns (docs/results/learning.md is that benchmark).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.compose_stack import Stack, running_stack, wait_for

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(900)]

PROJECT = "splitrl-deploytest-pretrained"
SERVICES = ["replay", "inference", "learner", "edge-encoder", "environment", "prometheus"]
#: In the edge-encoder's checkpoint volume, so the serving container finds what the one-off container wrote.
INIT = "/var/lib/splitrl/checkpoints/encoder-init.pt"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    settings = {
        "SPLITRL_MODE": "split-accumulate",
        "SPLITRL_WIDTH": "32",
        "SPLITRL_BOTTLENECK": "layernorm",
        "SPLITRL_ENCODER_FRACTION": "0",
        "SPLITRL_ENCODER_INIT": INIT,
        "SPLITRL_ACTIVATION_CODEC": "int4+zstd",
        "SPLITRL_MAX_STEPS": "0",  # until stopped
        "SPLITRL_NUM_ENVS": "4",
        "SPLITRL_UNROLL_LENGTH": "16",
        "SPLITRL_CHUNKS_PER_UPDATE": "4",
        "SPLITRL_EPOCHS": "2",
    }
    # The one-off container takes the edge-encoder's variables (recipe, width, bottleneck, seed) as its settings.
    pretrain = ["run", "--rm", "--no-deps", "edge-encoder", "pretrain-encoder"]
    pretrain += ["--random-steps", "200", "--pretrain-steps", "10", "--out", INIT]
    with running_stack(PROJECT, SERVICES, settings, before_up=[pretrain]) as running:
        yield running


def test_the_edge_starts_from_the_file_the_one_off_container_wrote(stack: Stack) -> None:
    logs = stack.compose("logs", "--no-color", "edge-encoder").stdout
    assert f"encoder starts from {INIT}" in logs, logs[-3000:]


def test_split_accumulate_trains_the_head_and_sends_no_gradient_to_the_frozen_encoder(stack: Stack) -> None:
    wait_for("two learner updates", lambda: stack.value("sum(splitrl_learner_updates_total)") >= 2, stack)
    activations = 'sum(splitrl_link_bytes_total{link="encoder-inference",payload="activation"})'
    wait_for("activations scraped from the encoder-inference link", lambda: stack.value(activations) > 0, stack)
    # The learner's scrape that counted two updates also counts any gradient it sent for the first.
    assert stack.value('sum(splitrl_link_bytes_total{payload="gradient"})') == 0
    (version,) = stack.query('splitrl_encoder_version{job="edge-encoder"}')
    assert float(version["value"][1]) == 0, "the edge's encoder took an optimizer step"
