"""The byte forms of a quantized tensor's per-row scales: splitrl.core.wire's helper (numpy only, no torch).

A row's scale is float32, finite and >= 0 (0: an all-zero row). Three forms cross the wire:
- `row_scale`: float32, exact, 4 bytes per row (read, never sent by splitrl);
- `row_scale_bf16`: bfloat16, 2 bytes per row, rounded to nearest (relative error <= 2**-9);
- `row_scale_log` + `row_scale_log_base`: 1 byte per row and one float32, each scale rounded *up* to
  base * 2**((k - 1) / LOG_STEPS_PER_OCTAVE) (steps at most 4.4% coarser than the row's own).
`pack` picks the smaller of the last two: bf16 for a few rows (an activation of one step per env), the log form
for more than LOG_MIN_ROWS (a training minibatch), where it saves ~1 byte per row, unless the rows' nonzero
scales span more than the log form's range (2**(254/16), ~60,000x): then bf16, so no row's step is coarser.
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
    if scales.size > LOG_MIN_ROWS:
        codes, base = _log_codes(scales)
        if not np.any((scales > 0) & (scales < base)):  # every row within the log form's range
            return from_log(codes, base), {"row_scale_log": codes.tobytes(), "row_scale_log_base": base}
    raw = _bf16_bits(scales)
    return _from_bf16(raw), {"row_scale_bf16": raw.tobytes()}


def from_bf16(data: bytes) -> np.ndarray:
    """float32 scales from `row_scale_bf16` bytes (a trailing odd byte is ignored: validation reports it)."""
    return _from_bf16(np.frombuffer(data[: len(data) // 2 * 2], dtype="<u2"))


def from_log(codes: np.ndarray | bytes, base: float) -> np.ndarray:
    """float32 scales from `row_scale_log` codes and `row_scale_log_base` (inf where a forged base overflows)."""
    codes = np.frombuffer(codes, dtype=np.uint8) if isinstance(codes, bytes) else codes
    exponents = (codes.astype(np.float64) - 1) / LOG_STEPS_PER_OCTAVE
    with np.errstate(over="ignore"):
        values = np.where(codes == 0, 0.0, np.float64(np.float32(base)) * np.exp2(exponents)).astype(np.float32)
    return values  # type: ignore[no-any-return]


def _log_codes(scales: np.ndarray) -> tuple[np.ndarray, float]:
    """The smallest code per row whose value is >= its scale, with the base that gives the largest code 255."""
    top = float(scales.max())
    if top == 0:
        return np.zeros(scales.shape, dtype=np.uint8), 1.0  # every row is zero; the base must still be > 0
    base = float(np.float32(top / 2 ** ((LOG_MAX_CODE - 1) / LOG_STEPS_PER_OCTAVE)))
    if base == 0:  # a subnormal top: no base below it (pack then sends bf16), but the base must stay > 0
        base = float(np.finfo(np.float32).tiny)
    with np.errstate(divide="ignore"):
        steps = np.ceil(np.log2(scales.astype(np.float64) / base) * LOG_STEPS_PER_OCTAVE)
    codes = 1 + np.clip(np.nan_to_num(steps, neginf=0.0), 0, LOG_MAX_CODE - 1)
    return np.where(scales > 0, codes, 0).astype(np.uint8), base


def _bf16_bits(scales: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (as torch rounds); scales are finite and >= 0."""
    bits = scales.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def _from_bf16(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)  # bfloat16 is float32's upper half
