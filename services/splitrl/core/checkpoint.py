"""Checkpoint files (learner, edge encoder): checksummed, written whole or not at all, the last few kept.

`save` writes the state (torch.save's bytes) as a checksummed blob (core.state_files) and rotates it in as
the newest of KEEP generations (learner.pt, learner.1.pt, learner.2.pt), so a crash at any moment leaves the
old checkpoints or the new one, never half of one. `load` verifies them newest first: one that fails its
SHA-256 (a flipped byte, a cut) is reported by name and the next older one used; if none passes, it refuses
(CorruptState naming every file) rather than start from nothing. Only tensors, numbers, strings, lists, tuples
and dicts go in (torch.load(weights_only=True)). A checkpoint written before checksums (a plain torch zip file)
is still read, and trusted only as far as torch.load's own checks go.
"""

from __future__ import annotations

import io
import logging
import random
from pathlib import Path
from typing import Any

import torch

from splitrl.core import state_files
from splitrl.core.state_files import CorruptState

log = logging.getLogger(__name__)

#: Generations kept of each checkpoint: the newest and two before it.
KEEP = 3
MAGIC = b"SRLCKPT1"
_ZIP_MAGIC = b"PK\x03\x04"


def save(state: dict[str, Any], path: Path, keep: int = KEEP) -> None:
    """Make `state` the newest checkpoint at `path`, keeping `keep` generations (see the module docstring)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    state_files.rotate_in(path, lambda file: state_files.write_blob(file, MAGIC, payload), keep)


def exists(path: Path, keep: int = KEEP) -> bool:
    """Whether any generation of checkpoint `path` is on disk."""
    return bool(state_files.generations(path, keep))


def load(path: Path, keep: int = KEEP) -> dict[str, Any] | None:
    """The newest checkpoint of `path` that passes its check, or None if there is none at all.

    Each that fails is logged by name; CorruptState (naming each and why) if files exist and none passes.
    """
    failures = []
    for candidate in state_files.generations(path, keep):
        try:
            state = _read(candidate)
        except CorruptState as error:
            log.error("checkpoint failed its check: %s", error)
            failures.append(str(error))
            continue
        if failures:
            log.warning("resuming from %s, an older checkpoint: the newer ones failed their checks", candidate)
        return state
    if failures:
        raise CorruptState(f"no good checkpoint of {path}: " + "; ".join(failures))
    return None


def _read(path: Path) -> dict[str, Any]:
    with path.open("rb") as file:
        head = file.read(len(MAGIC))
    # A zip file was written before checksums: torch's own checks are all there are.
    data = path.read_bytes() if head.startswith(_ZIP_MAGIC) else state_files.read_blob(path, MAGIC)
    try:
        state = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:
        raise CorruptState(f"{path}: not a readable checkpoint: {type(error).__name__}: {error}") from None
    if not isinstance(state, dict):
        raise CorruptState(f"{path}: holds a {type(state).__name__}, not a checkpoint's dict")
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
