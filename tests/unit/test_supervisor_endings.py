"""The supervisor restarts a service that died, but ends the run at once, with the reason and the end of the
service's log, when a restart cannot help: it could not write its files (74) or refused its state (65)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from splitrl.core.state_files import EXIT_CANNOT_WRITE, EXIT_CORRUPT_STATE
from splitrl.run.launcher import Child, GaveUp, Supervisor


def supervisor_with_a_dead(tmp_path: Path, code: int) -> Supervisor:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "learner.log").write_text("starting\nsplitrl serve learner: the reason, in one line\n")
    supervisor = Supervisor(tmp_path, ["learner"], lambda name: None, max_restarts=5, start_timeout_s=1)
    process = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    process.wait()
    supervisor.children["learner"] = Child("learner", process, tmp_path / "learner.ports.json")
    return supervisor


@pytest.mark.parametrize(
    ("code", "reason", "says"),
    [
        (EXIT_CANNOT_WRITE, "cannot write", "it could not write its files (disk full, read-only or failing; "),
        (EXIT_CORRUPT_STATE, "corrupt state", "it refused its state files, none of which passed its checks"),
    ],
)
def test_a_service_a_restart_cannot_mend_ends_the_run_with_the_reason(tmp_path, code, reason, says):
    supervisor = supervisor_with_a_dead(tmp_path, code)
    with pytest.raises(GaveUp) as ended:
        supervisor.watch()
    assert ended.value.reason == reason and supervisor.restarts == {}  # not restarted
    message = str(ended.value)
    assert message.startswith(f"learner exited with code {code}: {says}")
    assert "splitrl serve learner: the reason, in one line" in message
    if code == EXIT_CANNOT_WRITE:
        assert "bytes free" in message  # the run directory's filesystem, measured
