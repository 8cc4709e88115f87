"""The byte forms of a quantized tensor's per-row scales: splitrl.core.wire's helper (numpy only, no torch).

A row's scale is float32, finite and >= 0 (0: an all-zero row). Three forms cross the wire:
- `row_scale`: float32, exact, 4 bytes per row (read, never sent by splitrl);
- `row_scale_bf16`: bfloat16, 2 bytes per row, rounded to nearest (relative error <= 2**-9);
- `row_scale_log` + `row_scale_log_base`: 1 byte per row and one float32, each scale rounded *up* to
  base * 2**((k - 1) / LOG_STEPS_PER_OCTAVE) (steps at most 4.4% coarser than the row's own).
`pack` picks the smaller of the last two: bf16 for up to LOG_MIN_ROWS rows (e.g. one step of a few envs), the
log form for more (e.g. a training minibatch), where it saves ~1 byte per row, unless the rows' nonzero scales
span more than the log form's range (2**(254/16), ~60,000x): then bf16, so no row's step grows more than 4.4%.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Codes per octave of row_scale_log: a nonzero scale is rounded up by at most 2**(1/16), 4.4%.
LOG_STEPS_PER_OCTAVE = 16
#: The largest code; codes 1..255 span 2**(254/16), ~60,000x, below the tensor's largest scale.
LOG_MAX_CODE = 255
#: Rows above which the log form (n + 5 bytes: codes and a float32 base) is smaller than bf16's 2 n.
LOG_MIN_ROWS = 5


def pack(scales: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """(the scales as the receiver will read them, float32; the Tensor fields that carry them) for float32
    `scales` [rows], finite and >= 0. Quantize against the first: that is what the receiver multiplies by."""
    scales = np.asarray(scales, dtype=np.float32)
    if scales.size > LOG_MIN_ROWS and (log := _log_form(scales)) is not None:
        codes, base, sent = log
        return sent, {"row_scale_log": codes.tobytes(), "row_scale_log_base": base}
    raw = _bf16_bits(scales)
    return _from_bf16(raw), {"row_scale_bf16": raw.tobytes()}


def from_bf16(data: bytes) -> np.ndarray:
    """float32 scales from `row_scale_bf16` bytes (a trailing odd byte is ignored: validation reports it)."""
    return _from_bf16(np.frombuffer(data[: len(data) // 2 * 2], dtype="<u2"))


def from_log(codes: bytes, base: float) -> np.ndarray:
    """float32 scales from `row_scale_log` codes and `row_scale_log_base` (inf where a forged base overflows)."""
    return _log_table(base)[np.frombuffer(codes, dtype=np.uint8)]  # type: ignore[no-any-return]


def _log_table(base: float) -> np.ndarray:
    """float32 [256]: the scale each code names with `base` (code 0 names 0)."""
    exponents = (np.arange(LOG_MAX_CODE + 1, dtype=np.float64) - 1) / LOG_STEPS_PER_OCTAVE
    with np.errstate(over="ignore"):
        table = (np.float64(np.float32(base)) * np.exp2(exponents)).astype(np.float32)
    table[0] = 0.0
    return table


def _log_form(scales: np.ndarray) -> tuple[np.ndarray, float, np.ndarray] | None:
    """(codes, base, the scales they name) with each nonzero scale rounded up to the next code's value, or None
    where a row lies below the form's range (its step would grow more than 2**(1/16)) or the base would be
    subnormal (too few bits for the guarantee)."""
    top = np.float32(scales.max())
    if top == 0:
        return np.zeros(scales.shape, dtype=np.uint8), 1.0, np.zeros(scales.shape, dtype=np.float32)
    base = np.float32(top / 2 ** ((LOG_MAX_CODE - 1) / LOG_STEPS_PER_OCTAVE))
    if base < np.finfo(np.float32).tiny or np.any((scales > 0) & (scales < base)):
        return None
    table = _log_table(float(base))
    for _ in range(8):  # the base was rounded to float32: step it up until the top code covers the top row
        if table[LOG_MAX_CODE] >= top:
            break
        base = np.nextafter(base, np.float32(np.inf))
        table = _log_table(float(base))
    else:
        return None
    codes = np.where(scales > 0, 1 + np.searchsorted(table[1:], scales, side="left"), 0).astype(np.uint8)
    return codes, float(base), table[codes]


def _bf16_bits(scales: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (as torch rounds); scales are finite and >= 0."""
    bits = scales.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def _from_bf16(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)  # bfloat16 is float32's upper half
