"""Ctrl-C and SIGTERM for a process that supervises others: a flag read at safe points, never an exception
thrown wherever the main thread happens to be.

Python's default SIGINT handler raises KeyboardInterrupt at the next bytecode, which can be inside a library's
critical section (TensorBoard's event-writer queue, a half-written file) and leave a lock held or a counter
wrong, so that the clean-up that follows hangs. `StopSignal` only records the signal; the supervising loop
calls `check()` (or `sleep()`) where stopping is safe, and those raise KeyboardInterrupt there.
"""

from __future__ import annotations

import signal
import time
from types import FrameType, TracebackType
from typing import Any

#: Longest a `StopSignal.sleep` goes without looking at the flag (seconds): the delay a Ctrl-C can see.
POLL_S = 0.05


class StopSignal:
    """While entered, SIGINT and SIGTERM set `received` (the signal number) instead of raising.

    Must be entered on the main thread (only it may install handlers). On exit the previous handlers come back;
    a signal that came in meanwhile stays recorded, and more signals (a second Ctrl-C during clean-up) change
    nothing, so clean-up that runs inside the block is never cut short.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        # Set explicitly, whatever came before: a shell starts background jobs with SIGINT ignored, and Ctrl-C
        # (or a supervisor's SIGINT) must still stop the run cleanly.
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._record)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum

    def check(self) -> None:
        """KeyboardInterrupt if a stop signal has come in (a safe point to stop at); otherwise nothing."""
        if self.received is not None:
            raise KeyboardInterrupt(f"signal {signal.Signals(self.received).name}")

    def sleep(self, seconds: float) -> None:
        """time.sleep(seconds) that ends at once, with KeyboardInterrupt, when a stop signal comes in."""
        deadline = time.monotonic() + seconds
        self.check()
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(POLL_S, left))
            self.check()
