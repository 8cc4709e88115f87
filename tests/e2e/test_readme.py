"""README's commands run as written: the one-by-one services example, and every `--help` it points to."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

README = Path(__file__).parents[2] / "README.md"


def bash_block_after(heading: str) -> str:
    """The first ```bash block after `heading` in README."""
    text = README.read_text()
    section = text[text.index(heading) :]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, f"no bash block after {heading!r}"
    return match.group(1)


def test_the_services_one_by_one_example_runs_as_written(tmp_path):
    script = bash_block_after("## Running services one by one")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    process = subprocess.Popen(
        ["bash", "-e", "-c", "set -m\n" + script],  # -m: job control, so `kill %1` works as in a shell
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, output
    assert "Traceback" not in output, output


@pytest.mark.parametrize(
    "command",
    [
        ["up", "--help"],
        ["eval", "--help"],
        ["plot", "--help"],
        ["report", "--help"],
        ["bench", "learning", "--help"],
        ["bench", "network", "--help"],
        ["serve", "environment", "--help"],
    ],
)
def test_the_help_readme_points_to_explains_itself(command):
    result = subprocess.run(
        [sys.executable, "-m", "splitrl.cli.main", *command], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "usage: splitrl" in result.stdout and "--" in result.stdout
