"""The one rule for a lost peer, kept by every loop that dials one (six: environment -> edge-encoder,
edge-encoder -> inference and -> learner, inference -> replay, learner -> replay and -> inference).

A call or stream that fails was either **refused** or **lost**:
- refused: the peer answered with a status in `REFUSAL_CODES`. It will not serve this caller or this request
  (a bad value, another mode, codec or width, a missing certificate), so dialling again cannot help: the
  error goes to the caller, which fails with the peer's reason instead of retrying it forever.
- lost: anything else (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, a reset or cancelled stream, no answer in
  time, an answer that does not decode). The loop counts it in `splitrl_reconnects_total{peer}`, waits its
  backoff (core.backoff: exponential, full jitter), logs why, and dials again. The backoff starts over once
  the peer answers (`answered`).

A peer that means "not now" answers ABORTED or UNAVAILABLE, never a refusal code. One deliberate exception,
made explicit by `retry_refusals`: the learner's weights publisher skips a version inference refused and
keeps publishing newer ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from splitrl.core.backoff import Backoff
from splitrl.core.metrics import Metrics

log = logging.getLogger(__name__)

#: Statuses by which a peer refuses this caller or its request: redialling cannot help, so they are passed on.
REFUSAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
#: What a failed call or stream raises. ValueError: the peer answered something that does not decode
#: (wire.WireError included); a fresh stream starts over. InvalidStateError: a write on a finished call.
FAILURES: tuple[type[BaseException], ...] = (
    grpc.aio.AioRpcError,
    ConnectionError,
    TimeoutError,
    ValueError,
    asyncio.InvalidStateError,
)


def is_refusal(error: BaseException) -> bool:
    return isinstance(error, grpc.aio.AioRpcError) and error.code() in REFUSAL_CODES


def describe(error: BaseException) -> str:
    """A failure in a log line: the status and the peer's reason, or the exception."""
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return repr(error) if isinstance(error, TimeoutError) or not str(error) else str(error)


class Redial:
    """One dialling loop's side of the rule: `lost` after each failure, `answered` once the peer answers."""

    def __init__(
        self,
        peer: str,
        backoff: Backoff,
        metrics: Metrics,
        *,
        retry_refusals: bool = False,
        refused: Callable[[grpc.aio.AioRpcError], BaseException] | None = None,
    ) -> None:
        """`peer`: the reconnects label (e.g. "replay"). `refused(error)`: the exception a refusal is raised
        as (default: the error itself). `retry_refusals`: treat refusals as losses (the publisher only)."""
        self.peer, self.backoff, self.metrics = peer, backoff, metrics
        self.retry_refusals, self.refused = retry_refusals, refused

    async def lost(self, error: BaseException, what: str) -> float:
        """Raise a refusal; otherwise count the loss, wait the backoff, log it; returns the wait (s).

        `what` names the connection in the log line, e.g. "rollout stream 1f2e to edge-encoder".
        """
        if is_refusal(error) and not self.retry_refusals:
            assert isinstance(error, grpc.aio.AioRpcError)
            raise (self.refused(error) if self.refused else error) from None
        self.metrics.reconnects.labels(peer=self.peer).inc()
        delay = await self.backoff.sleep()
        log.warning("%s lost (%s); dialled again after %.2fs", what, describe(error), delay)
        return delay

    def answered(self) -> None:
        """The peer answered on this connection: the next loss waits the shortest backoff again."""
        self.backoff.reset()
