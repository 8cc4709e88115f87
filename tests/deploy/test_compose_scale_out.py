"""docker-compose.scale-out.yml for real: 2 inference replicas, 2 replay shards and 2 learner ranks in containers.

The base file's stack (tests/deploy/test_compose.py) with the override layered over it, as the scale-out guide runs it,
in split mode (configs/catch.yaml): the learner ranks relay their encoder traffic through rank 0, the only
learner the edge dials. Checked on what Prometheus scrapes from every instance.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.deploy.compose_stack import Stack, running_stack, wait_for

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(900)]

PROJECT = "splitrl-deploytest-scaled"
ADDED = ["replay-1", "inference-1", "learner-1"]
SERVICES = ["replay", "inference", "learner", "edge-encoder", "environment", "prometheus", *ADDED]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    settings = {
        "SPLITRL_MAX_STEPS": "0",  # until stopped
        "SPLITRL_NUM_ENVS": "4",  # in 2 env groups (the override): a stream per inference replica
        "SPLITRL_UNROLL_LENGTH": "16",
        "SPLITRL_CHUNKS_PER_UPDATE": "4",  # 2 per rank
        "SPLITRL_EPOCHS": "2",
    }
    with running_stack(PROJECT, SERVICES, settings, ["docker-compose.scale-out.yml"], ",".join(ADDED)) as running:
        yield running


def by_instance(stack: Stack, promql: str) -> dict[str, float]:
    return {s["metric"]["instance"].split(":")[0]: float(s["value"][1]) for s in stack.query(promql)}


def test_every_instance_is_scraped_under_its_services_job(stack: Stack) -> None:
    wait_for(
        "every instance's scrape target up",
        lambda: (
            {(s["metric"]["job"], s["metric"]["instance"]) for s in stack.query("up == 1")}
            >= {(name.split("-1")[0], f"{name}:9400") for name in ["replay", "inference", "learner", *ADDED]}
        ),
        stack,
    )


def test_both_replicas_act_both_shards_fill_and_both_ranks_train_identical_weights(stack: Stack) -> None:
    wait_for(
        "each inference replica acting on a stream",
        lambda: (
            by_instance(stack, 'sum by (instance) (splitrl_streams_open{job="inference"}) > 0').keys()
            == {"inference", "inference-1"}
        ),
        stack,
    )
    wait_for(
        "each replay shard holding inserts",
        lambda: (
            by_instance(stack, "sum by (instance) (splitrl_replay_inserts_total) > 0").keys() == {"replay", "replay-1"}
        ),
        stack,
    )

    def rank_checksums() -> dict[str, dict[int, str]]:
        """Per learner rank: the weights checksum it logged after each update (version -> checksum)."""
        logs = stack.compose("logs", "--no-color", "learner", "learner-1", timeout=60).stdout
        logged: dict[str, dict[int, str]] = {"learner": {}, "learner-1": {}}
        for line in logs.splitlines():
            found = re.search(r"^(learner(?:-1)?)-1\s*\|.* update (\d+): .*weights checksum (\S+)$", line)
            if found:
                logged[found[1]][int(found[2])] = found[3]
        return logged

    wait_for("both learner ranks past update 2", lambda: all(len(v) >= 2 for v in rank_checksums().values()), stack)
    logged = rank_checksums()
    common = sorted(set(logged["learner"]) & set(logged["learner-1"]))
    assert len(common) >= 2 and all(logged["learner"][v] == logged["learner-1"][v] for v in common), logged
    # The edge's encoder trains through rank 0 (split mode: fetch and return, one exchange per minibatch).
    wait_for("the edge's encoder to step", lambda: stack.value("sum(splitrl_encoder_updates_total)") > 0, stack)
    # Only rank 0 counts the group's updates.
    wait_for(
        "rank 0's update count scraped",
        lambda: by_instance(stack, "splitrl_learner_updates_total").get("learner", 0) >= 2,
        stack,
    )
    assert by_instance(stack, "splitrl_learner_updates_total").get("learner-1", 0) == 0


def test_no_instance_restarted_by_itself(stack: Stack) -> None:
    restarts = {service: stack.container(service).attrs["RestartCount"] for service in SERVICES}
    assert restarts == dict.fromkeys(SERVICES, 0), f"{restarts}\n{stack.logs()}"
