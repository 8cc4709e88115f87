"""StopSignal: Ctrl-C and SIGTERM become a flag read at safe points; waiting for a service gives way to it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from splitrl.run.launcher import Child, wait_ready
from splitrl.run.stop_signal import StopSignal


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_is_recorded_not_raised_until_a_safe_point(signum):
    with StopSignal() as stop:
        os.kill(os.getpid(), signum)
        time.sleep(0.01)  # handlers run between bytecodes: by now it has run, and raised nothing
        assert stop.received == signum
        with pytest.raises(KeyboardInterrupt, match=signal.Signals(signum).name):
            stop.check()


def test_a_second_signal_keeps_the_first():
    with StopSignal() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
    assert stop.received == signal.SIGTERM


def test_sleep_ends_early_on_a_signal():
    with StopSignal() as stop:
        signal.setitimer(signal.ITIMER_REAL, 0.1)  # SIGALRM is not ours: sleeping goes on through it
        previous_alarm = signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
        try:
            started = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                stop.sleep(30.0)
            assert time.monotonic() - started < 2.0
        finally:
            signal.signal(signal.SIGALRM, previous_alarm)


def test_sleep_without_a_signal_sleeps_its_time():
    with StopSignal() as stop:
        started = time.monotonic()
        stop.sleep(0.2)
        assert 0.2 <= time.monotonic() - started < 1.0
        assert stop.received is None


def test_the_previous_handlers_come_back():
    before = {signum: signal.getsignal(signum) for signum in StopSignal.SIGNALS}
    with StopSignal():
        assert all(signal.getsignal(signum) != before[signum] for signum in StopSignal.SIGNALS)
    assert {signum: signal.getsignal(signum) for signum in StopSignal.SIGNALS} == before


def test_waiting_for_a_service_gives_way_to_a_stop_signal(tmp_path):
    """A service that never serves: Ctrl-C ends the wait at once, not after the start timeout."""
    (tmp_path / "logs").mkdir()
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child = Child("replay", process, tmp_path / "replay.ports.json")
    try:
        with StopSignal() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            started = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                wait_ready(child, tmp_path, timeout_s=60.0, sleep=stop.sleep)
            assert time.monotonic() - started < 2.0
    finally:
        process.kill()
        process.wait()
