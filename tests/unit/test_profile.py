"""bench.profile: py-spy's raw stacks read as per-service shares; a real process sampled by py-spy."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from splitrl.bench.profile import parse_raw, py_spy, record

RAW = """\
<module> (main.py:1);run (asyncio/base_events.py:640);EpollSelector.select (selectors.py:468) 50
<module> (main.py:1);Rollout (splitrl/edge_encoder/service.py:142);_conv_forward (torch/nn/modules/conv.py:560) 30
<module> (main.py:1);Rollout (splitrl/edge_encoder/service.py:150);_conv_forward (torch/nn/modules/conv.py:561) 10
Thread.run (threading.py:982) 10
not a stack line
"""


def test_raw_stacks_become_waiting_share_and_busiest_functions_by_self_time():
    profile = parse_raw(RAW)
    assert profile.samples == 100
    assert profile.waiting_share == pytest.approx(0.6)  # select 50 + an idle thread 10
    assert profile.top == [("_conv_forward (torch/nn/modules/conv.py)", pytest.approx(0.4))]  # lines merged


def test_an_empty_profile_has_no_shares():
    assert parse_raw("").samples == 0 and parse_raw("").top == []


@pytest.mark.skipif(py_spy() is None, reason="py-spy is not installed")
def test_a_busy_process_is_sampled_in_its_busy_function(tmp_path):
    busy = textwrap.dedent(
        """
        import time
        def spin_the_wheel():
            end = time.monotonic() + 20
            while time.monotonic() < end:
                sum(range(1000))
        spin_the_wheel()
        """
    )
    process = subprocess.Popen([sys.executable, "-c", busy])
    try:
        profiles = record({"busy": process.pid}, 2, tmp_path)
    finally:
        process.kill()
        process.wait()
    if "busy" not in profiles:
        pytest.skip(f"py-spy could not sample here: {(tmp_path / 'profile-busy.log').read_text()[-300:]}")
    profile = profiles["busy"]
    assert profile.samples > 50  # 2 s at 100 Hz, less what a loaded machine skips
    assert profile.top and "spin_the_wheel" in profile.top[0][0]
    assert (tmp_path / "profile-busy.txt").exists()
