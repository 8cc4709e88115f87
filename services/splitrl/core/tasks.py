"""One asyncio shape the services share: a stream's long-lived task raced against one short wait per loop turn."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def first_done(watched: asyncio.Future[Any], coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T] | None:
    """Run `coroutine` as a task until it or `watched` is done (`watched` is left as it is).

    Returns the task if it finished (its result or error is the caller's to read), else None; a task that did
    not finish is cancelled, also when this wait is itself cancelled, so a stopped loop leaves nothing behind
    waiting on a queue or an event. When both are done the task is returned: the caller decides which counts.
    """
    task = asyncio.ensure_future(coroutine)
    try:
        await asyncio.wait({task, watched}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    return task if task.done() else None
