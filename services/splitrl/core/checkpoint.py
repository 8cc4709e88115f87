"""Checkpoint files (learner, edge encoder): written whole or not at all, read back with weights_only.

`save` writes to a temporary file, fsyncs it, renames it over the old checkpoint and fsyncs the
directory, so a crash at any moment leaves either the old checkpoint or the new one, never half
of one. Only tensors, numbers, strings, lists, tuples and dicts go in (torch.load(weights_only=True)).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch


def save(state: dict[str, Any], path: Path) -> None:
    """Atomically replace `path` with `state` (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    tmp.replace(path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power loss
    finally:
        os.close(directory)


def load(path: Path) -> dict[str, Any] | None:
    """The checkpoint at `path`, or None if there is none."""
    if not path.exists():
        return None
    state: dict[str, Any] = torch.load(path, weights_only=True)
    return state


def rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """torch's and Python's global random states (and `generator`'s), for a resume that draws as before."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def restore_rng(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"])
