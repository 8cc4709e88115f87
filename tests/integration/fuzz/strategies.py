"""Hypothesis strategies for structurally arbitrary requests.

Any dtype code, any shape, any bytes, NaN / Inf, sequences and step ids up to 2**64 - 1, unknown tables, and
streams of several messages; near misses (a well-encoded tensor or H.264 batch with one thing broken) beside
the arbitrary ones.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from hypothesis import strategies as st

from splitrl.core import wire
from splitrl.core.config import VideoSettings
from splitrl.core.video import VideoStreamEncoder
from splitrl.v1 import replay_pb2, rollout_pb2, tensor_pb2, training_pb2, weights_pb2
from tests.integration.fuzz.conftest import FRAME_SIZE, WIDTH

U64 = st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1]))
FLOATS = st.floats(width=32, allow_nan=True, allow_infinity=True)


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
            message = wire.encode(values, wire.DTYPE_BFLOAT16)
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
