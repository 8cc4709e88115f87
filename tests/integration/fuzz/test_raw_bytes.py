"""Every method fuzzed with raw bytes that need not parse as protobuf at all: refused cleanly, server unharmed."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.integration.fuzz.conftest import CALL_TIMEOUT_S, FUZZ, fuzz_once

pytestmark = pytest.mark.asyncio(loop_scope="module")

METHODS = [
    ("replay", "/splitrl.v1.Replay/Insert", "stream"),
    ("replay", "/splitrl.v1.Replay/Sample", "unary"),
    ("replay", "/splitrl.v1.Replay/Info", "unary"),
    ("replay", "/splitrl.v1.Replay/UpdatePriorities", "unary"),
    ("inference", "/splitrl.v1.Inference/Act", "stream"),
    ("inference", "/splitrl.v1.PolicyUpdates/Publish", "stream"),
    ("edge", "/splitrl.v1.EdgeEncoder/Rollout", "stream"),
    ("learner", "/splitrl.v1.EncoderTraining/Train", "stream"),
]


@FUZZ
@given(method=st.sampled_from(METHODS), payloads=st.lists(st.binary(max_size=64), min_size=1, max_size=3))
@example(method=METHODS[0], payloads=[b"\x00"])  # found: unparseable protobuf was UNKNOWN on every method
@example(method=METHODS[1], payloads=[b"\xff"])
async def test_raw_bytes_that_need_not_parse(hosts, channels, method, payloads):
    name, path, kind = method
    channel = channels[name]
    if kind == "unary":
        call = channel.unary_unary(path)
        await fuzz_once(hosts, channels, name, lambda: call(payloads[0], timeout=CALL_TIMEOUT_S))
    else:
        call = channel.stream_stream(path)
        await fuzz_once(hosts, channels, name, lambda: call(iter(payloads), timeout=CALL_TIMEOUT_S))
