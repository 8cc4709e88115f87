"""A service's CPU niceness (--nice; splitrl up's --learner-nice): each check runs in a child process, since a
niceness once raised cannot be lowered again without privileges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from splitrl.run.plan import plan
from splitrl.run.settings import RunSettings

AUTOGROUP = Path("/proc/self/autogroup")

# Sets the process up as a service does; reports its niceness, threads' started before and after, its session's.
PROBE = """
import json, os, sys, threading
from splitrl.core.config import ServerSettings
from splitrl.core.service import configure_process
seen, go = {}, threading.Event()
def before():  # a thread already running when the process sets its niceness
    go.wait(); seen.update(before=os.getpriority(os.PRIO_PROCESS, 0))
early = threading.Thread(target=before); early.start()
configure_process(ServerSettings(nice=int(sys.argv[1])))
go.set(); early.join()
thread = threading.Thread(target=lambda: seen.update(after=os.getpriority(os.PRIO_PROCESS, 0)))
thread.start(); thread.join()
try:
    autogroup = open("/proc/self/autogroup").read().split()[-1]
except OSError:
    autogroup = None
print(json.dumps({"process": os.getpriority(os.PRIO_PROCESS, 0), "autogroup": autogroup, **seen}))
"""


def probe(nice: int, *, own_session: bool, started_at: int = 0) -> dict[str, int | str | None]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(nice)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        start_new_session=own_session,
        preexec_fn=(lambda: os.nice(started_at)) if started_at else None,
    )
    return json.loads(result.stdout)


def own_autogroup_nice() -> str | None:
    try:
        return AUTOGROUP.read_text().split()[-1]
    except OSError:
        return None


def test_a_service_leading_its_session_gives_way_in_its_threads_and_its_session_group():
    seen = probe(7, own_session=True)
    assert seen["process"] == 7 and seen["before"] == 7 and seen["after"] == 7  # every thread, then and later
    if own_autogroup_nice() is not None:  # kernels with autogroup: the group is what weighs against others
        assert seen["autogroup"] == "7"


def test_a_service_started_from_a_shell_leaves_the_shells_session_as_it_is():
    before = own_autogroup_nice()
    seen = probe(5, own_session=False)
    assert seen["process"] == 5
    assert seen["autogroup"] == before and own_autogroup_nice() == before


def test_niceness_is_only_ever_raised_and_zero_changes_nothing():
    assert probe(3, own_session=True, started_at=12)["process"] == 12  # started niced more: keeps its own
    assert probe(0, own_session=True, started_at=2)["process"] == 2


def test_up_sets_the_learners_niceness_and_no_one_elses(tmp_path):
    run = RunSettings(env="splitrl/Catch-v0", mode="cloud", learner_nice=9, learners=2, run_dir=tmp_path)
    planned = plan(run, tmp_path)
    assert {name: settings.nice for name, settings in planned.items()} == {
        name: 9 if name.startswith("learner") else 0 for name in planned
    }


@pytest.mark.parametrize("bad", [-1, 20])
def test_a_niceness_outside_0_to_19_is_refused_quoting_it(bad):
    with pytest.raises(ValueError, match="learner_nice") as refused:
        RunSettings(learner_nice=bad)
    assert f"input_value={bad}" in str(refused.value)
