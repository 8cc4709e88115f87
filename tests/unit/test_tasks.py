"""core.tasks.first_done: the short wait's task is returned when it finished and cancelled when it did not."""

from __future__ import annotations

import asyncio

from splitrl.core.tasks import first_done


def _others() -> set[asyncio.Task[object]]:
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


async def test_a_finished_wait_is_returned_with_its_result_and_the_watched_task_runs_on():
    watched = asyncio.ensure_future(asyncio.Event().wait())
    queue: asyncio.Queue[int] = asyncio.Queue()
    queue.put_nowait(7)
    got = await first_done(watched, queue.get())
    assert got is not None and got.result() == 7
    assert not watched.done()
    watched.cancel()


async def test_a_wait_outrun_by_the_watched_task_is_cancelled_and_takes_nothing():
    watched = asyncio.ensure_future(asyncio.sleep(0))
    queue: asyncio.Queue[int] = asyncio.Queue()
    assert await first_done(watched, queue.get()) is None
    await asyncio.sleep(0)  # the cancellation runs
    assert not _others()
    queue.put_nowait(1)
    assert queue.qsize() == 1  # no cancelled getter took it


async def test_cancelling_the_wait_cancels_its_task_too():
    watched = asyncio.ensure_future(asyncio.Event().wait())
    waiting = asyncio.create_task(first_done(watched, asyncio.Event().wait()))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await asyncio.sleep(0)
    assert _others() == {watched}
    watched.cancel()
