"""The number format a process's torch passes run in: float32, or bfloat16 under torch's CPU autocast.

Two places train or act in bfloat16 when asked, each with its own setting: the learner
(`--train-precision`: its forward and backward passes) and the split edge's encoder
(`--encoder-precision`: its acting forwards and its training's forward and backward). Under autocast,
convolutions and matrix products run in bfloat16 while weights, their gradients and optimizer state stay
float32. On a CPU with native bfloat16 (AVX512-BF16 or AMX) a training step is faster (the edge's small
acting batches gain little); on one without, oneDNN emulates it, slower than float32, so asking for it there
logs a warning.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any, cast, get_args

import torch

from splitrl.core.config import Precision

#: Every Precision, float32 first.
PRECISIONS: tuple[str, ...] = get_args(Precision)


def cpu_has_native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 instructions (AVX512-BF16 or AMX), which oneDNN's bfloat16 convolutions and
    matrix products need to beat float32. On plain AVX512 (Cascade Lake, Ice Lake) oneDNN emulates bfloat16,
    slower. torch has these checks only privately (torch.cpu); a torch without them answers False."""
    checks = (getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return any(bool(check()) for check in checks if check is not None)


def precisions_of(text: str) -> list[Precision]:
    """The comma-separated precisions in `text`, in order ("float32,bfloat16"); ValueError quoting one that is
    not one of PRECISIONS. For the benchmarks' --precisions."""
    precisions = text.split(",")
    for name in precisions:
        if name not in PRECISIONS:
            raise ValueError(f"{name!r} is not one of {PRECISIONS}")
    return cast(list[Precision], precisions)


def warn_if_emulated(precision: Precision, setting: str, passes: str, log: logging.Logger) -> None:
    """Log a warning naming `setting` (e.g. "train_precision") and whose `passes` it sets (e.g. "the learner's")
    when `precision` is bfloat16 and this CPU would emulate it (cpu_has_native_bfloat16)."""
    if precision == "bfloat16" and not cpu_has_native_bfloat16():
        log.warning(
            "%s='bfloat16' on a CPU without native bfloat16 (AVX512-BF16 or AMX): torch emulates it, and %s "
            "passes run slower than in float32",
            setting,
            passes,
        )


def autocast(precision: Precision) -> AbstractContextManager[Any]:
    """The context the CPU passes run in for `precision`: torch's bfloat16 autocast, or nothing for float32.
    Backward passes follow the precision their forward ran in."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16")


def forward_in(precision: Precision, module: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """`module(inputs)` in `precision`, as float32 (a graph unless grad is off): what codecs and losses take.
    The split edge's encoder runs this way when it acts and trains, and `splitrl eval` replays it so."""
    with autocast(precision):
        return module(inputs).float()  # type: ignore[no-any-return]
