"""splitrl.core.precision: the benchmarks' --precisions list is read in order and a bad entry is quoted."""

from __future__ import annotations

import pytest

from splitrl.core.precision import PRECISIONS, precisions_of


def test_precisions_are_read_in_the_order_given_and_an_unknown_one_is_quoted():
    assert PRECISIONS == ("float32", "bfloat16")
    assert precisions_of("bfloat16,float32") == ["bfloat16", "float32"]
    with pytest.raises(ValueError, match=r"^'float16' is not one of \('float32', 'bfloat16'\)$"):
        precisions_of("float32,float16")
