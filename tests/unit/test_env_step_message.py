"""The EnvStep the environment sends: episode-end flags only on steps where an episode ended."""

from __future__ import annotations

import numpy as np

from splitrl.environment.service import _Pending


def test_a_step_where_no_episode_ended_carries_no_flags_and_one_that_ended_carries_all():
    pending = _Pending(np.zeros((3, 8, 8), np.uint8), num_envs=3)
    quiet = pending.message(0)
    assert (list(quiet.terminated), list(quiet.truncated), list(quiet.rewards)) == ([], [], [0.0, 0.0, 0.0])

    no_end = np.zeros(3, bool)
    pending.advance(np.ones((3, 8, 8), np.uint8), np.array([1.0, -1.0, 0.5]), np.array([False, True, False]), no_end)
    ended = pending.message(1)
    assert list(ended.terminated) == [False, True, False] and list(ended.truncated) == []
    assert list(ended.rewards) == [1.0, -1.0, 0.5]
