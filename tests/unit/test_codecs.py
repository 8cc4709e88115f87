"""What a stream carries per mode (splitrl.core.codecs): the action replies' wire format."""

from __future__ import annotations

import numpy as np
import pytest

from splitrl.core import codecs, wire
from splitrl.core.spec import ActionSpec


@pytest.mark.parametrize(
    ("spec", "dtype", "shape", "bytes_per_env"),
    [
        (ActionSpec("discrete", 5), wire.DTYPE_UINT8, (4,), 1),
        (ActionSpec("discrete", 256), wire.DTYPE_UINT8, (4,), 1),
        (ActionSpec("discrete", 257), wire.DTYPE_INT64, (4,), 8),
        (ActionSpec("continuous", 3, (-1.0,) * 3, (1.0,) * 3), wire.DTYPE_FLOAT32, (4, 3), 12),
    ],
)
def test_actions_cross_in_the_narrowest_dtype_that_holds_every_choice(spec, dtype, shape, bytes_per_env):
    wire_dtype, wire_shape = codecs.action_wire(spec, 4)
    assert (wire_dtype, wire_shape) == (dtype, shape)
    highest = np.full(shape, spec.size - 1 if spec.kind == "discrete" else 1.0)
    message = wire.encode(highest, wire_dtype)
    assert len(message.data) == 4 * bytes_per_env
    decoded = wire.decode_array(message, expect_dtype=wire_dtype, expect_shape=list(wire_shape))
    assert np.array_equal(decoded, highest)  # the largest choice survives the narrowing
