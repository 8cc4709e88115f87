"""A service's CPU niceness (--nice; splitrl up's --learner-nice): each check runs in a child process, since a
niceness once raised cannot be lowered again without privileges."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from splitrl.core import service
from splitrl.core.service import session_niceness
from splitrl.run.plan import plan
from splitrl.run.settings import RunSettings

# Sets the process up as a service does; reports its niceness, threads' started before and after, its session's.
PROBE = """
import json, os, sys, threading
from splitrl.core.config import ServerSettings
from splitrl.core.service import configure_process, session_niceness
seen, go = {}, threading.Event()
def before():  # a thread already running when the process sets its niceness
    go.wait(); seen.update(before=os.getpriority(os.PRIO_PROCESS, 0))
early = threading.Thread(target=before); early.start()
configure_process(ServerSettings(nice=int(sys.argv[1])))
go.set(); early.join()
thread = threading.Thread(target=lambda: seen.update(after=os.getpriority(os.PRIO_PROCESS, 0)))
thread.start(); thread.join()
print(json.dumps({"process": os.getpriority(os.PRIO_PROCESS, 0), "autogroup": session_niceness(), **seen}))
"""


def probe(nice: int, *, own_session: bool, started_at: int = 0) -> dict[str, int | None]:
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


def test_a_service_leading_its_session_gives_way_in_its_threads_and_its_session_group():
    seen = probe(7, own_session=True)
    assert seen["process"] == 7 and seen["before"] == 7 and seen["after"] == 7  # every thread, then and later
    if session_niceness() is not None:  # where autogroup applies, the group is what weighs against others
        assert seen["autogroup"] == 7


def test_a_service_started_from_a_shell_leaves_the_shells_session_as_it_is():
    before = session_niceness()
    seen = probe(5, own_session=False)
    assert seen["process"] == 5
    assert seen["autogroup"] == before and session_niceness() == before


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


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("/autogroup-12 nice 3\n", 3),
        ("", None),  # a process its launcher put in a cgroup of its own (seen in CI): no autogroup applies
        ("/autogroup-12 nice\n", None),
        ("/autogroup-12 nice three\n", None),
        ("something else entirely\n", None),
    ],
)
def test_the_session_niceness_is_read_where_autogroup_applies_and_is_none_elsewhere(tmp_path, monkeypatch, text, read):
    autogroup = tmp_path / "autogroup"
    autogroup.write_text(text)
    monkeypatch.setattr(service, "AUTOGROUP", autogroup)
    assert session_niceness() == read
    monkeypatch.setattr(service, "AUTOGROUP", tmp_path / "absent")  # a kernel without autogroup
    assert session_niceness() is None


def test_a_session_leader_without_an_autogroup_still_sets_its_threads(tmp_path):
    empty = tmp_path / "autogroup"
    empty.write_text("")
    probe_in = PROBE.replace(
        "from splitrl.core.service import configure_process, session_niceness",
        f"from splitrl.core import service; service.AUTOGROUP = service.Path({str(empty)!r})\n"
        "from splitrl.core.service import configure_process, session_niceness",
    )
    assert probe_in != PROBE  # the probe really reads the empty file
    result = subprocess.run(
        [sys.executable, "-c", probe_in, "6"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        start_new_session=True,
    )
    seen = json.loads(result.stdout)
    assert seen == {"process": 6, "autogroup": None, "before": 6, "after": 6}
    assert empty.read_text() == ""  # nothing written where the kernel showed no group
