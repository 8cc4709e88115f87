"""Deployment tests need tools outside Python: a Docker engine, kubectl, promtool.

On a developer machine without them these tests skip, saying what is missing. CI sets
SPLITRL_REQUIRE_DEPLOY_TOOLS=1 (after installing them, see .ci/run), and then a missing
tool fails the test instead: a deployment check that silently skipped would prove nothing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("SPLITRL_REQUIRE_DEPLOY_TOOLS") == "1"


def missing(reason: str) -> None:
    """Skip, or fail under SPLITRL_REQUIRE_DEPLOY_TOOLS=1, because a tool is missing."""
    if REQUIRED:
        pytest.fail(f"{reason} (SPLITRL_REQUIRE_DEPLOY_TOOLS=1: the deployment tools must be installed)")
    pytest.skip(reason)


def tool(name: str) -> str:
    """Path of a command-line tool, or skip/fail if it is not installed."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        missing(f"{name} is not installed")
    assert path is not None
    return path


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run promtool (skip/fail if it is not installed); the caller checks the exit status."""
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=60, check=False)


def load_script(relative: str) -> ModuleType:
    """Import one of the repository's scripts (their file names have dashes) as a module."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
