"""Fuzzing every RPC's request path against real servers (issue 6).

Hypothesis builds structurally arbitrary requests (any dtype code, any shape, any bytes, NaN / Inf,
sequences and step ids up to 2**64 - 1, unknown tables, streams of several messages) and raw bytes that
need not parse as protobuf at all. Every call must end OK or with a client-error status carrying a
message, never UNKNOWN / INTERNAL / UNAVAILABLE, and the server must still answer a well-formed request
afterwards. The servers start once per module; each test's budget is small so CI stays fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import grpc
import pytest
import pytest_asyncio
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from splitrl.core import rpc, scrape, wire
from splitrl.core.config import VideoSettings
from splitrl.core.service import ServiceHost
from splitrl.core.video import VideoStreamEncoder
from splitrl.edge_encoder.service import EdgeEncoderService
from splitrl.edge_encoder.settings import EdgeEncoderSettings
from splitrl.inference.service import InferenceService
from splitrl.inference.settings import InferenceSettings
from splitrl.learner.service import LearnerService
from splitrl.learner.settings import LearnerSettings
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import (
    replay_pb2,
    replay_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    tensor_pb2,
    training_pb2,
    training_pb2_grpc,
    weights_pb2,
    weights_pb2_grpc,
)
from tests.integration.stack import FAST_ENV, address, start

pytestmark = pytest.mark.asyncio(loop_scope="module")

WIDTH = 256
FRAME_SIZE = 36
FRAME_STACK = 4
CALL_TIMEOUT_S = 10.0
#: A refusal must be one of these; UNKNOWN / INTERNAL mean an unhandled exception, UNAVAILABLE a dead server.
CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
}
FUZZ = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
U64 = st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1]))
FLOATS = st.floats(width=32, allow_nan=True, allow_infinity=True)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def hosts():
    """Replay, split inference (width 256, 36x36 frames), its edge-encoder, a split learner's Train service, and
    a cloud inference that takes H.264 video ("video")."""
    shared: dict[str, Any] = {"env": FAST_ENV, "width": WIDTH, "frame_size": FRAME_SIZE, "tls": "plaintext"}
    started: dict[str, ServiceHost] = {}
    try:
        started["replay"] = await start(ReplayService, ReplaySettings(tls="plaintext"))
        started["inference"] = await start(
            InferenceService, InferenceSettings(**shared, mode="split", replay_address=address(started["replay"]))
        )
        started["video"] = await start(
            InferenceService,
            InferenceSettings(**shared, mode="cloud", codec="h264", replay_address=address(started["replay"])),
        )
        started["edge"] = await start(
            EdgeEncoderService,
            EdgeEncoderSettings(
                **shared, mode="split", inference_address=address(started["inference"]), learner_address="127.0.0.1:1"
            ),
        )
        # The learner's own loop dials nothing reachable: only its EncoderTraining server is under test.
        started["learner"] = await start(
            LearnerService,
            LearnerSettings(**shared, mode="split", replay_address="127.0.0.1:1", inference_address="127.0.0.1:1"),
        )
        yield started
    finally:
        for name in ("learner", "edge", "video", "inference", "replay"):
            if name in started:
                await started[name].stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def channels(hosts):
    opened = {name: rpc.insecure_channel(address(host)) for name, host in hosts.items()}
    yield opened
    for channel in opened.values():
        await channel.close()


# -- strategies ---------------------------------------------------------------------------------------


@st.composite
def arbitrary_tensors(draw: st.DrawFn) -> tensor_pb2.Tensor:
    """Any field set to anything: unknown dtype codes, negative or huge dims, bytes that fit no shape."""
    return tensor_pb2.Tensor(
        dtype=draw(st.one_of(st.sampled_from(sorted(tensor_pb2.DType.values())), st.integers(-3, 2**31 - 1))),
        shape=draw(
            st.lists(st.one_of(st.integers(-3, 64), st.integers(-(2**63), 2**63 - 1), st.just(WIDTH)), max_size=5)
        ),
        data=draw(st.binary(max_size=300)),
        compression=draw(st.integers(-2, 3)),
        row_scale=draw(st.lists(FLOATS, max_size=4)),
        row_scale_bf16=draw(st.binary(max_size=10)),
        row_scale_log=draw(st.binary(max_size=10)),
        row_scale_log_base=draw(FLOATS),
    )


@st.composite
def plausible_tensors(draw: st.DrawFn, dims: tuple[int, ...], dtype: str = "float") -> tensor_pb2.Tensor:
    """A well-encoded tensor of [n, *dims] (or uint8 frames), then possibly one field broken: near misses."""
    n = draw(st.sampled_from([0, 1, 2, 3, 8]))  # 8 rows: quantized scales cross as log bytes
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if dtype == "uint8":
        message = wire.encode(torch.randint(0, 256, (n, *dims), dtype=torch.uint8, generator=generator))
    else:
        values = torch.randn((n, *dims), generator=generator)
        poison = draw(st.sampled_from([None, math.nan, math.inf, -math.inf]))
        if poison is not None and values.numel():
            values.view(-1)[draw(st.integers(0, values.numel() - 1))] = poison
            message = wire.encode(values, wire.DType.DTYPE_BFLOAT16)
        else:
            message = wire.encode_float(values, draw(st.sampled_from(wire.FLOAT_CODECS)))
    breakage = draw(
        st.sampled_from(
            ["none", "none", "truncate", "shape", "dtype", "compression", "row_scale", "row_scale_bf16", "log", "base"]
        )
    )
    if breakage == "truncate":
        message.data = message.data[: draw(st.integers(0, max(len(message.data) - 1, 0)))]
    elif breakage == "shape":
        message.shape[draw(st.integers(0, len(message.shape) - 1))] = draw(st.integers(-(2**63), 2**63 - 1))
    elif breakage == "dtype":
        message.dtype = draw(st.integers(0, 12))
    elif breakage == "compression":
        message.compression = 1 - message.compression
    elif breakage == "row_scale":
        message.row_scale[:] = draw(st.lists(FLOATS, max_size=4))
    elif breakage == "row_scale_bf16":
        message.row_scale_bf16 = draw(st.binary(max_size=10))
    elif breakage == "log":
        message.row_scale_log = draw(st.binary(max_size=10))
    elif breakage == "base":
        message.row_scale_log_base = draw(FLOATS)
    return message


@st.composite
def video_batches(draw: st.DrawFn) -> tuple[int, tensor_pb2.Tensor]:
    """(envs, an H.264 batch): real packets of noise or flat frames, possibly from a stream whose start (the
    keyframe) was lost, at another resolution, or with one thing broken."""
    n = draw(st.integers(1, 3))
    size = draw(st.sampled_from([FRAME_SIZE, FRAME_SIZE, 48]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    frames = torch.randint(0, 256, (n, size, size), dtype=torch.uint8, generator=generator)
    if draw(st.booleans()):
        frames[:] = frames[:, :1, :1]  # flat frames: tiny packets
    crf = draw(st.sampled_from([0, 23, 51]))
    encoder = VideoStreamEncoder(size, VideoSettings(video_crf=crf))
    for _ in range(draw(st.integers(0, 2))):  # earlier packets of this stream that inference never sees
        encoder.encode(frames)
    message = encoder.encode(frames)
    breakage = draw(st.sampled_from(["none", "none", "truncate", "flip", "sizes", "garbage", "oversize"]))
    if breakage == "truncate":
        message.data = message.data[: draw(st.integers(0, max(len(message.data) - 1, 0)))]
    elif breakage == "flip" and message.data:
        data = bytearray(message.data)
        data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        message.data = bytes(data)
    elif breakage == "sizes":
        message.packet_sizes[:] = draw(st.lists(st.integers(0, 2**32 - 1), max_size=4))
    elif breakage == "garbage":
        message.data = draw(st.binary(min_size=1, max_size=300))
        message.packet_sizes[:] = [len(message.data)] + [0] * (n - 1)
    elif breakage == "oversize":
        message.packet_sizes[0] = 2**31
    return n, message


def tensors(dims: tuple[int, ...], dtype: str = "float") -> st.SearchStrategy[tensor_pb2.Tensor]:
    return st.one_of(arbitrary_tensors(), plausible_tensors(dims, dtype))


def per_env(elements: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(elements, max_size=4)


def stream_of(messages: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """1-3 messages: duplicate and out-of-order sequences, and a bad message after a good one."""
    return st.lists(messages, min_size=1, max_size=3)


act_requests = st.builds(
    lambda first_step, reward_form, **fields: rollout_pb2.ActRequest(**first_step, **reward_form, **fields),
    # The step-id oneof: an id, an advance on the stream's previous message's id (refused on a first message), none.
    first_step=st.one_of(
        st.fixed_dictionaries({"first_step_id": U64}), st.fixed_dictionaries({"step_id_advance": U64}), st.just({})
    ),
    # Rewards plain, coded (codes naming slots filled or not, more or fewer new values than zero codes), or both.
    reward_form=st.fixed_dictionaries(
        {},
        optional={
            "rewards": per_env(FLOATS),
            "reward_codes": st.binary(max_size=4) | st.lists(st.sampled_from([0, 1, 2]), max_size=4).map(bytes),
            "new_rewards": per_env(FLOATS),
        },
    ),
    observations=tensors((WIDTH,)),
    terminated=per_env(st.booleans()),
    truncated=per_env(st.booleans()),
    encoder_version=st.one_of(st.none(), U64),  # absent: as on the stream's previous message
)
env_steps = st.builds(
    rollout_pb2.EnvStep,
    sequence=st.one_of(st.just(0), U64),
    frames=tensors((FRAME_SIZE, FRAME_SIZE), "uint8"),
    rewards=per_env(FLOATS),
    terminated=per_env(st.booleans()),
    truncated=per_env(st.booleans()),
)
TABLES = st.one_of(st.just("rollouts"), st.text(max_size=12))
trajectories = st.builds(
    replay_pb2.Trajectory,
    **{name: st.one_of(st.none(), tensors((16,))) for name in replay_pb2.Trajectory.DESCRIPTOR.fields_by_name},
)
insert_requests = st.builds(
    replay_pb2.InsertRequest,
    table=TABLES,
    sequence=st.one_of(st.just(0), U64),
    trajectory=st.one_of(st.none(), trajectories),
    priority=st.one_of(st.none(), st.floats()),
    writer_id=st.text(max_size=8),
)
edge_messages = st.one_of(
    st.builds(
        lambda hello: training_pb2.EdgeMessage(hello=hello),
        st.builds(
            training_pb2.EdgeHello,
            step_id_prefix=U64,
            encoder_version=U64,
            edge_id=st.text(max_size=8),
            width=st.one_of(st.just(WIDTH), st.integers(0, 2**32 - 1)),
        ),
    ),
    st.builds(
        lambda a: training_pb2.EdgeMessage(activations=a),
        st.builds(
            training_pb2.Activations,
            request_id=U64,
            activations=tensors((WIDTH,)),
            missing_step_ids=per_env(U64),
            encoder_version=U64,
        ),
    ),
    st.builds(
        lambda a: training_pb2.EdgeMessage(applied=a),
        st.builds(
            training_pb2.GradientsApplied,
            request_id=U64,
            encoder_version=U64,
            unknown_step_ids=st.integers(0, 2**32 - 1),
        ),
    ),
    st.just(training_pb2.EdgeMessage()),
)
weights_messages = st.builds(
    weights_pb2.Weights,
    version=U64,
    tensors=st.lists(
        st.builds(weights_pb2.NamedTensor, name=st.text(max_size=24), tensor=st.one_of(st.none(), arbitrary_tensors())),
        max_size=3,
    ),
)

# -- calling and checking -----------------------------------------------------------------------------


async def outcome(call: Any) -> tuple[grpc.StatusCode, str]:
    """Drain a call (unary or streaming) and return how it ended."""
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    return await call.code(), await call.details() or ""


def assert_clean(code: grpc.StatusCode, details: str) -> None:
    assert code == grpc.StatusCode.OK or code in CLIENT_ERRORS, f"{code.name}: {details}"
    if code != grpc.StatusCode.OK:
        assert details.strip(), f"{code.name} without a message"


def activation_step(n: int = 2) -> rollout_pb2.ActRequest:
    observations = wire.encode(torch.rand(n, WIDTH), wire.DType.DTYPE_BFLOAT16)
    return rollout_pb2.ActRequest(
        observations=observations, rewards=[0.0] * n, terminated=[False] * n, truncated=[False] * n, first_step_id=0
    )


async def still_serves(channels: dict[str, grpc.aio.Channel], name: str) -> None:
    """The fuzzed server answers its health check and one well-formed request of its own kind."""
    health = health_pb2_grpc.HealthStub(channels[name])
    status = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=CALL_TIMEOUT_S)
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    if name == "replay":
        info = await replay_pb2_grpc.ReplayStub(channels[name]).Info(replay_pb2.InfoRequest(), timeout=CALL_TIMEOUT_S)
        assert [t.name for t in info.tables] == ["rollouts"]
    elif name == "inference":
        call = rollout_pb2_grpc.InferenceStub(channels[name]).Act(
            iter([activation_step()]), metadata=(("splitrl-codec", "activation"),), timeout=CALL_TIMEOUT_S
        )
        answers = [wire.decode(response.actions).shape async for response in call]
        assert answers == [(2,)]
    elif name == "video":  # a new stream from a fresh encoder decodes, whatever the last one sent
        call = rollout_pb2_grpc.InferenceStub(channels[name]).Act(
            iter([video_step(2)]), metadata=VIDEO, timeout=CALL_TIMEOUT_S
        )
        answers = [wire.decode(response.actions).shape async for response in call]
        assert answers == [(2,)]
    elif name == "edge":
        frames = wire.encode(torch.zeros(1, FRAME_SIZE, FRAME_SIZE, dtype=torch.uint8))
        step = rollout_pb2.EnvStep(frames=frames, rewards=[0.0], terminated=[False], truncated=[False])
        call = rollout_pb2_grpc.EdgeEncoderStub(channels[name]).Rollout(iter([step]), timeout=CALL_TIMEOUT_S)
        answers = [wire.decode(action.actions).shape async for action in call]
        assert answers == [(1,)]
    elif name == "learner":
        hello = training_pb2.EdgeHello(step_id_prefix=7, edge_id="check", width=WIDTH)
        call = training_pb2_grpc.EncoderTrainingStub(channels[name]).Train(
            iter([training_pb2.EdgeMessage(hello=hello)]), timeout=CALL_TIMEOUT_S
        )
        assert await outcome(call) == (grpc.StatusCode.OK, "")


VIDEO = (("splitrl-codec", "video"),)


def video_step(n: int, observations: tensor_pb2.Tensor | None = None) -> rollout_pb2.ActRequest:
    """One step of a video stream: by default n envs' first frames, each a keyframe of a fresh encoder."""
    if observations is None:
        frames = torch.zeros(n, FRAME_SIZE, FRAME_SIZE, dtype=torch.uint8)
        observations = VideoStreamEncoder(FRAME_SIZE, VideoSettings()).encode(frames)
    return rollout_pb2.ActRequest(
        observations=observations, rewards=[0.0] * n, terminated=[False] * n, truncated=[False] * n, first_step_id=0
    )


#: What grpc.aio's client reports when it writes a message just as the server ends the call: the server's own
#: status is lost on the client, so the server's rejected counter is checked instead.
CLIENT_WRITE_RACE = (grpc.StatusCode.INTERNAL, "Internal error from Core")


def rejected(host: ServiceHost) -> float:
    return scrape.total([scrape.fetch(host.metrics_port)], "splitrl_rejected_requests_total")


async def fuzz_once(
    hosts: dict[str, ServiceHost], channels: dict[str, grpc.aio.Channel], name: str, make_call: Callable[[], Any]
) -> None:
    before = rejected(hosts[name])
    code, details = await outcome(make_call())
    if (code, details) == CLIENT_WRITE_RACE:
        assert rejected(hosts[name]) > before, "the client saw its write fail, but the server refused nothing"
    else:
        assert_clean(code, details)
    await still_serves(channels, name)


# -- the fuzz tests -----------------------------------------------------------------------------------


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


async def test_refusals_were_counted(hosts):
    """Runs last in this module: every fuzzed server counted refusals in splitrl_rejected_requests_total."""
    for name, host in hosts.items():
        rejected = scrape.total([scrape.fetch(host.metrics_port)], "splitrl_rejected_requests_total")
        assert rejected > 0, f"{name} counted no refusals"
