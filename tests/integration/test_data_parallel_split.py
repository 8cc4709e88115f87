"""Data-parallel learners in the split modes: every rank's encoder traffic goes through rank 0.

Two ranks as real processes (gloo over a real TCPStore). Rank 0 holds the edges' link, here a recording
stand-in for EdgeLinks; each rank trains on its own chunks, whose step ids are disjoint. The invariant of
learner.edge_relay: per minibatch the edges get one message holding every rank's rows for their step ids, in
rank order (each rank's trainer scaled its rows by 1/2: tests/unit/test_trainer.py); each rank gets back the
activations of its own ids; and the ranks' weights stay identical.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry

from splitrl.core.metrics import Metrics
from splitrl.core.models import cloud_network
from splitrl.core.spec import ActionSpec, ModelConfig
from splitrl.learner import service as learner_service
from splitrl.learner.batch import Batch
from splitrl.learner.distributed import DataParallel, weights_checksum
from splitrl.learner.edge_relay import EdgeRelay
from splitrl.learner.settings import LearnerSettings
from splitrl.learner.trainer import Trainer
from tests.chunks import training_batch
from tests.integration.ranks import run_ranks

CHUNKS, HORIZON, WIDTH = 2, 8, 16
SPEC = ActionSpec("discrete", 3)
MODEL = ModelConfig(2, 36, WIDTH, "relu")
MINIBATCHES, EPOCHS = 2, 2
#: Step ids the recording edge no longer holds: missing rows, which no gradient row may follow down.
FORGOTTEN = 5


def batch(rank: int) -> Batch:
    """Rank r's chunks: step ids 1000 r + i, inputs (activations stored at rollout) all 0."""
    return training_batch(
        torch.zeros(CHUNKS, HORIZON + 1, WIDTH, dtype=torch.bfloat16), seed=rank, first_step_id=1000 * rank
    )


def activation_of(step_ids: torch.Tensor) -> torch.Tensor:
    """What the recording edge answers for each id: a row that names it (so a rank can tell its own rows)."""
    return (step_ids.float() / 1000).unsqueeze(1).expand(-1, WIDTH).clone()


class RecordingEdges:
    """Rank 0's stand-in for EdgeLinks: every fetch answers activation_of(id), ids divisible by FORGOTTEN
    missing; records every message the edges would get."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[int], torch.Tensor | None]] = []

    def fetch_activations(self, step_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        present = step_ids % FORGOTTEN != 0
        activations = activation_of(step_ids) * present.unsqueeze(1)
        if len(step_ids):  # as EdgeLinks: no row, no message
            self.messages.append(("fetch", step_ids.tolist(), None))
        return activations, present, step_ids[present].tolist()

    def return_gradients(self, ticket: list[int], gradients: torch.Tensor, learning_rate_scale: float) -> None:
        if ticket:
            self.messages.append(("return", ticket, gradients.clone()))

    def push_gradients(
        self,
        step_ids: torch.Tensor,
        encoder_versions: torch.Tensor,
        gradients: torch.Tensor,
        learning_rate_scale: float,
    ) -> None:
        if len(step_ids):
            self.messages.append(("push", step_ids.tolist(), gradients.clone()))


class RecordingRelay(EdgeRelay):
    """The relay, recording what this rank's trainer handed it and got from it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.handed: list[tuple[list[int], torch.Tensor]] = []
        self.fetched: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []
        self._asked: list[int] = []

    def fetch_activations(self, step_ids):
        activations, present, ticket = super().fetch_activations(step_ids)
        self.fetched.append((step_ids.tolist(), activations.clone(), present.clone()))
        self._asked = step_ids.tolist()
        return activations, present, ticket

    def return_gradients(self, ticket, gradients, learning_rate_scale):
        self.handed.append((self._asked, gradients.clone()))
        super().return_gradients(ticket, gradients, learning_rate_scale)

    def push_gradients(self, step_ids, encoder_versions, gradients, learning_rate_scale):
        self.handed.append((step_ids.tolist(), gradients.clone()))
        super().push_gradients(step_ids, encoder_versions, gradients, learning_rate_scale)


def rank_main(rank: int, endpoint: str, mode: str, fraction: float) -> tuple[Any, ...]:
    torch.manual_seed(0)
    settings = LearnerSettings(
        mode=mode,
        tls="plaintext",
        epochs=EPOCHS,
        minibatches=MINIBATCHES,
        chunks_per_update=2,
        world_size=2,
        rank=rank,
        encoder_fraction=fraction,
    )
    parallel = DataParallel(rank, 2, endpoint, timeout_s=60)
    edges = RecordingEdges() if rank == 0 else None
    relay = RecordingRelay(parallel, edges)
    learner = Trainer(cloud_network(mode, MODEL, SPEC), settings, relay, parallel)
    parallel.sync_state(learner.network, learner.optimizer, 0)
    stats = learner.update(batch(rank), version=0)
    messages = [] if edges is None else edges.messages
    parallel.close()
    return stats.optimizer_steps, weights_checksum(learner.network), relay.handed, relay.fetched, messages


def run_two_ranks(mode: str, fraction: float = 1.0) -> dict[int, tuple[Any, ...]]:
    return run_ranks(rank_main, mode, fraction)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fraction", [1.0, 0.25])
def test_split_accumulate_ranks_push_through_rank_0_one_message_per_minibatch(fraction: float):
    got = run_two_ranks("split-accumulate", fraction)
    (steps_0, sum_0, handed_0, _, messages), (steps_1, sum_1, handed_1, _, none) = got[0], got[1]
    assert steps_0 == steps_1 == EPOCHS * MINIBATCHES and sum_0 == sum_1 and none == []
    # Every rank hands its part every minibatch (a collective), even an empty one; the edges get one push per
    # minibatch that drew any row (one encoder step), rank 0's rows then rank 1's.
    assert len(handed_0) == len(handed_1) == EPOCHS * MINIBATCHES
    expected = [
        (ids_0 + ids_1, torch.cat([part_0, part_1]))
        for (ids_0, part_0), (ids_1, part_1) in zip(handed_0, handed_1, strict=True)
        if ids_0 or ids_1
    ]
    assert [kind for kind, _, _ in messages] == ["push"] * len(expected)
    for (_, ids, gradients), (expected_ids, expected_gradients) in zip(messages, expected, strict=True):
        assert ids == expected_ids and torch.allclose(gradients, expected_gradients)
    rows_1 = [i for ids, _ in handed_1 for i in ids]
    assert all(i >= 1000 for i in rows_1) and all(i < 1000 for ids, _ in handed_0 for i in ids)
    if fraction == 1.0:
        assert len(rows_1) == EPOCHS * CHUNKS * HORIZON  # every row of rank 1, once an epoch


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_split_ranks_fetch_and_return_through_rank_0_and_get_their_own_rows(fraction: float):
    got = run_two_ranks("split", fraction)
    (steps_0, sum_0, handed_0, fetched_0, messages), (steps_1, sum_1, handed_1, fetched_1, _) = got[0], got[1]
    assert steps_0 == steps_1 == EPOCHS * MINIBATCHES and sum_0 == sum_1
    # Per minibatch: one fetch of both ranks' ids, then one return for the rows the edge still had.
    assert [kind for kind, _, _ in messages] == ["fetch", "return"] * (EPOCHS * MINIBATCHES)
    for minibatch in range(EPOCHS * MINIBATCHES):
        (_, asked, _), (_, returned_ids, gradients) = messages[2 * minibatch], messages[2 * minibatch + 1]
        (ids_0, rows_0, present_0), (ids_1, rows_1, present_1) = fetched_0[minibatch], fetched_1[minibatch]
        assert asked == ids_0 + ids_1
        for ids, rows, present in ((ids_0, rows_0, present_0), (ids_1, rows_1, present_1)):
            held = torch.tensor(ids) % FORGOTTEN != 0
            assert torch.equal(present, held)  # each rank got its own rows back, in its order
            assert torch.equal(rows[held], activation_of(torch.tensor(ids))[held])
        assert returned_ids == [i for i in asked if i % FORGOTTEN != 0]
        both = torch.cat([handed_0[minibatch][1], handed_1[minibatch][1]])
        assert torch.allclose(gradients, both)
        assert torch.count_nonzero(both[torch.tensor(asked) % FORGOTTEN == 0]) == 0  # missing rows get nothing


def test_only_rank_0_holds_the_edges():
    class Rank:
        def __init__(self, rank: int) -> None:
            self.rank, self.world_size = rank, 2

    with pytest.raises(ValueError, match="rank 1: the edges dial rank 0"):
        EdgeRelay(Rank(1), RecordingEdges())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank 0: the edges dial rank 0"):
        EdgeRelay(Rank(0), None)  # type: ignore[arg-type]


#: The group's collective timeout in the wait test, and when rank 0's only edge dials in: well past it.
GROUP_TIMEOUT_S, EDGE_ARRIVES_S = 3.0, 8.0


class LateEdge:
    """Rank 0's edges as LearnerService._wait_for_an_edge reads them: none until EDGE_ARRIVES_S, then one."""

    def __init__(self) -> None:
        self.arrival = time.monotonic() + EDGE_ARRIVES_S
        self.connected = asyncio.Event()

    @property
    def edge_count(self) -> int:
        return int(time.monotonic() >= self.arrival)


def waiting_rank_main(rank: int, endpoint: str) -> float:
    learner_service.EDGE_WAIT_LOG_S = 0.5  # rank 0 reports to the group every 0.5 s, well inside its timeout
    settings = LearnerSettings(mode="split-accumulate", tls="plaintext", world_size=2, rank=rank, chunks_per_update=2)
    service = learner_service.LearnerService(settings, Metrics(CollectorRegistry()))
    service.parallel = DataParallel(rank, 2, endpoint, timeout_s=GROUP_TIMEOUT_S)
    if rank == 0:
        service.edges = LateEdge()  # type: ignore[assignment]
    started = time.monotonic()
    asyncio.run(service._wait_for_an_edge())
    waited = time.monotonic() - started
    service.parallel.close()
    return waited


@pytest.mark.timeout(120)
def test_ranks_wait_for_rank_0s_first_edge_together_past_the_group_timeout():
    """Only rank 0 sees edges; the others wait with it, a broadcast at a time, so none fails in a collective
    while no edge has dialled in for longer than the group's timeout, and all start training together."""
    waited = run_ranks(waiting_rank_main, timeout_s=90)
    assert waited[0] >= EDGE_ARRIVES_S - 1 > 2 * GROUP_TIMEOUT_S
    assert abs(waited[1] - waited[0]) < GROUP_TIMEOUT_S  # rank 1 left the wait when rank 0 did
