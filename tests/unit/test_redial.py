"""The one rule for a lost peer (core.redial): refusals go to the caller, losses are counted and redialled."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from prometheus_client import CollectorRegistry

from splitrl.core.backoff import Backoff
from splitrl.core.metrics import Metrics
from splitrl.core.redial import REFUSAL_CODES, Redial, describe, is_refusal


def rpc_error(code: grpc.StatusCode, details: str = "because") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def redial(**options) -> tuple[Redial, Metrics]:
    metrics = Metrics(CollectorRegistry())
    return Redial("replay", Backoff(0.001, 0.002, rng=random.Random(0)), metrics, **options), metrics


def reconnects(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("splitrl_reconnects_total", {"peer": "replay"}) or 0.0


@pytest.mark.parametrize("code", sorted(REFUSAL_CODES, key=lambda c: c.name))
def test_a_refusal_goes_to_the_caller_uncounted(code):
    loop, metrics = redial()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        asyncio.run(loop.lost(rpc_error(code), "insert stream"))
    assert raised.value.code() == code and reconnects(metrics) == 0


@pytest.mark.parametrize(
    "error",
    [
        rpc_error(grpc.StatusCode.UNAVAILABLE),
        rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED),
        rpc_error(grpc.StatusCode.ABORTED, "an edge with this prefix is already connected"),
        rpc_error(grpc.StatusCode.CANCELLED),
        ConnectionError("replay ended the stream"),
        TimeoutError(),
        ValueError("an answer that does not decode"),
    ],
)
def test_anything_else_is_a_loss_counted_waited_and_redialled(error):
    loop, metrics = redial()
    delay = asyncio.run(loop.lost(error, "insert stream"))
    assert 0 <= delay <= 0.001 and reconnects(metrics) == 1 and loop.backoff.failures == 1
    assert not is_refusal(error)


def test_an_answer_starts_the_backoff_over():
    loop, _ = redial()
    for _ in range(3):
        asyncio.run(loop.lost(TimeoutError(), "insert stream"))
    assert loop.backoff.failures == 3
    loop.answered()
    assert loop.backoff.failures == 0


def test_a_refusal_can_be_raised_as_the_callers_own_error():
    loop, _ = redial(refused=lambda error: RuntimeError(f"replay refused: {error.details()}"))
    with pytest.raises(RuntimeError, match="replay refused: unknown table"):
        asyncio.run(loop.lost(rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "unknown table"), "insert stream"))


def test_the_publishers_deliberate_exception_retries_refusals():
    loop, metrics = redial(retry_refusals=True)
    asyncio.run(loop.lost(rpc_error(grpc.StatusCode.FAILED_PRECONDITION), "weights stream"))
    assert reconnects(metrics) == 1


def test_a_failure_is_described_by_its_status_and_reason():
    assert describe(rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")) == "UNAVAILABLE: connection refused"
    assert describe(TimeoutError()) == "TimeoutError()"
    assert describe(ConnectionError("reset")) == "reset"
