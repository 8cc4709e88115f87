"""Replay shards: inference replicas each write to one shard, the learner samples every shard and
routes each chunk's priority back to the shard that holds it; nothing acknowledged is lost across shards.
Real gRPC servers on loopback, from a run's plan with --inference-replicas 2 --replay-shards 2."""

from __future__ import annotations

from splitrl.core import scrape
from tests.integration.stack import Stack

SHARDS = ("replay", "replay-1")
#: 5 chunks per update over 2 shards: shares alternate 3 + 2 and 2 + 3, so over 5 updates the shards are drawn
#: from unequally (13 and 12): a priority sent to the wrong shard would show as a count that does not match.
LEARNER = {"chunks_per_update": 5, "epochs": 1, "minibatches": 1, "max_policy_lag": 50, "priority_updates": True}


def outcome(text: str, name: str) -> float:
    """splitrl_replay_priority_updates_total of one outcome (applied | unknown_key)."""
    return sum(
        value
        for family, labels, value in scrape.samples(text)
        if family == "splitrl_replay_priority_updates_total" and labels["outcome"] == name
    )


async def test_the_learner_trains_on_both_shards_and_each_priority_reaches_its_own_shard() -> None:
    stack = await Stack.start(
        "split",
        num_envs=4,
        steps=0,
        unroll_length=8,
        width=64,
        learner={**LEARNER, "max_updates": 5},
        replay={"selector": "prioritized"},
        environment={"env_groups": 2},
        inference_replicas=2,
        replay_shards=2,
    )
    try:
        await stack.wait_learner_done()
        texts = stack.scrape()
    finally:
        await stack.stop()
    for shard in SHARDS:
        assert scrape.total([texts[shard]], "splitrl_replay_inserts_total") > 0, shard  # its inference wrote
        assert scrape.total([texts[shard]], "splitrl_replay_samples_total") > 0, shard  # the learner drew
        # Each chunk drawn from this shard got its new priority from this shard, no other's.
        assert outcome(texts[shard], "applied") == scrape.total([texts[shard]], "splitrl_replay_samples_total"), shard
        assert outcome(texts[shard], "unknown_key") == 0, shard
    # Every chunk the learner trained on was drawn from a shard: both shards' samples add up to its draws.
    drawn = sum(scrape.total([texts[shard]], "splitrl_replay_samples_total") for shard in SHARDS)
    assert drawn == scrape.total([texts["learner"]], "splitrl_policy_lag_count")
    assert scrape.total([texts["learner"]], "splitrl_learner_updates_total") == 5
    assert sorted(scrape.total([texts[shard]], "splitrl_replay_samples_total") for shard in SHARDS) == [12, 13]


async def test_nothing_acknowledged_is_lost_across_shards() -> None:
    """Each inference replica's chunks are all acknowledged by its shard, and each shard stored exactly what
    its writers sent (no chunk went to two shards, none vanished)."""
    stack = await Stack.start(
        "split",
        num_envs=4,
        steps=800,
        unroll_length=8,
        width=64,
        environment={"env_groups": 4},
        inference_replicas=2,
        replay_shards=2,
    )
    try:
        await stack.wait_done()  # every replica's writer saw every chunk acknowledged
        texts = stack.scrape()
    finally:
        await stack.stop()
    written = {name: scrape.total([texts[name]], "splitrl_trajectories_total") for name in ("inference", "inference-1")}
    stored = {shard: scrape.total([texts[shard]], "splitrl_replay_inserts_total") for shard in SHARDS}
    assert min(written.values()) > 0, written
    assert stored == {"replay": written["inference"], "replay-1": written["inference-1"]}  # replica r -> shard r
