"""Every RPC fuzzed with protobuf messages built to be structurally arbitrary (strategies.py), then the
refusals counted: Act (activations and H.264 video), Rollout, replay Insert / Sample / UpdatePriorities,
Train and Publish."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from splitrl.core import scrape
from splitrl.v1 import replay_pb2, replay_pb2_grpc, rollout_pb2_grpc, training_pb2, training_pb2_grpc, weights_pb2_grpc
from tests.integration.fuzz.conftest import CALL_TIMEOUT_S, FUZZ, VIDEO, fuzz_once, video_step
from tests.integration.fuzz.strategies import (
    TABLES,
    U64,
    act_requests,
    edge_messages,
    env_steps,
    insert_requests,
    stream_of,
    video_batches,
    weights_messages,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@FUZZ
@given(
    messages=stream_of(act_requests),
    codec=st.sampled_from(["activation", "activation", "frame", "", "nonsense"]),
)
async def test_fuzzed_act_streams(hosts, channels, messages, codec):
    metadata = (("splitrl-codec", codec),) if codec else ()
    stub = rollout_pb2_grpc.InferenceStub(channels["inference"])
    await fuzz_once(
        hosts, channels, "inference", lambda: stub.Act(iter(messages), metadata=metadata, timeout=CALL_TIMEOUT_S)
    )


@FUZZ
@given(batches=stream_of(video_batches()))
async def test_fuzzed_video_streams(hosts, channels, batches):
    """Malformed, truncated, oversize or keyframe-less H.264 is refused (INVALID_ARGUMENT, counted) and the
    inference that decodes video keeps serving new streams."""
    messages = [video_step(n, message) for n, message in batches]
    stub = rollout_pb2_grpc.InferenceStub(channels["video"])
    await fuzz_once(hosts, channels, "video", lambda: stub.Act(iter(messages), metadata=VIDEO, timeout=CALL_TIMEOUT_S))


async def test_video_decode_errors_were_counted(hosts):
    """After the video fuzz: the refusals of undecodable batches were counted as such."""
    errors = scrape.total([scrape.fetch(hosts["video"].metrics_port)], "splitrl_video_decode_errors_total")
    assert errors > 0


@FUZZ
@given(messages=stream_of(env_steps))
async def test_fuzzed_rollout_streams(hosts, channels, messages):
    stub = rollout_pb2_grpc.EdgeEncoderStub(channels["edge"])
    await fuzz_once(hosts, channels, "edge", lambda: stub.Rollout(iter(messages), timeout=CALL_TIMEOUT_S))


@FUZZ
@given(messages=stream_of(insert_requests))
async def test_fuzzed_replay_inserts(hosts, channels, messages):
    stub = replay_pb2_grpc.ReplayStub(channels["replay"])
    await fuzz_once(hosts, channels, "replay", lambda: stub.Insert(iter(messages), timeout=CALL_TIMEOUT_S))


@FUZZ
@given(
    request=st.one_of(
        st.builds(replay_pb2.SampleRequest, table=TABLES, num_items=st.integers(0, 2**32 - 1)),
        st.builds(
            replay_pb2.UpdatePrioritiesRequest,
            table=TABLES,
            updates=st.lists(st.builds(replay_pb2.KeyPriority, key=U64, priority=st.floats()), max_size=4),
        ),
    )
)
async def test_fuzzed_replay_unary_calls(hosts, channels, request):
    stub = replay_pb2_grpc.ReplayStub(channels["replay"])
    method = stub.Sample if isinstance(request, replay_pb2.SampleRequest) else stub.UpdatePriorities
    # An empty table answers Sample SAMPLE_DEADLINE_MARGIN_S (1 s) before the deadline: 1.3 s keeps the wait short.
    await fuzz_once(hosts, channels, "replay", lambda: method(request, timeout=1.3))


@FUZZ
@given(messages=stream_of(edge_messages))
@example(messages=[training_pb2.EdgeMessage()])  # found: a non-hello first message was UNKNOWN (Train bypassed mapping)
async def test_fuzzed_train_streams(hosts, channels, messages):
    stub = training_pb2_grpc.EncoderTrainingStub(channels["learner"])
    await fuzz_once(hosts, channels, "learner", lambda: stub.Train(iter(messages), timeout=CALL_TIMEOUT_S))


@FUZZ
@given(messages=stream_of(weights_messages))
async def test_fuzzed_weights_publish(hosts, channels, messages):
    stub = weights_pb2_grpc.PolicyUpdatesStub(channels["inference"])
    await fuzz_once(hosts, channels, "inference", lambda: stub.Publish(iter(messages), timeout=CALL_TIMEOUT_S))


async def test_refusals_were_counted(hosts):
    """Runs last in this module: every fuzzed server counted refusals in splitrl_rejected_requests_total."""
    for name, host in hosts.items():
        rejected = scrape.total([scrape.fetch(host.metrics_port)], "splitrl_rejected_requests_total")
        assert rejected > 0, f"{name} counted no refusals"
