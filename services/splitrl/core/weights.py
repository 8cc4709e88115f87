"""Policy weights <-> Weights messages, with the checks inference applies before swapping them in."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from splitrl.core import wire
from splitrl.core.rpc import BadRequest
from splitrl.v1 import weights_pb2


def to_proto(version: int, state_dict: Mapping[str, torch.Tensor], dtype: int = wire.DTYPE_FLOAT32):
    """A Weights message for `state_dict` at `version`, every tensor sent as `dtype`."""
    return weights_pb2.Weights(
        version=version,
        tensors=[
            weights_pb2.NamedTensor(name=name, tensor=wire.encode(value, dtype)) for name, value in state_dict.items()
        ],
    )


def from_proto(
    message: weights_pb2.Weights, reference: Mapping[str, torch.Tensor], *, max_magnitude: float = math.inf
) -> dict[str, torch.Tensor]:
    """Decode `message` into a state_dict shaped like `reference`; BadRequest/WireError name any mismatch.

    Every entry of `reference` must be present exactly once with its shape, finite, and no |value| above
    `max_magnitude`.
    """
    received: dict[str, torch.Tensor] = {}
    for named in message.tensors:
        if named.name in received:
            raise BadRequest(f"Weights.tensors names {named.name!r} twice")
        if named.name not in reference:
            raise BadRequest(f"Weights.tensors has unknown entry {named.name!r}")
        want = reference[named.name]
        try:
            value = wire.decode(named.tensor, expect_shape=list(want.shape))
        except wire.WireError as error:
            raise wire.WireError(f"Weights entry {named.name!r}: {error}") from None
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise BadRequest(f"Weights entry {named.name!r} holds NaN or Inf")
        largest = float(value.abs().max()) if value.numel() else 0.0
        if largest > max_magnitude:
            raise BadRequest(f"Weights entry {named.name!r} holds |{largest:.3g}|, above the bound {max_magnitude:.3g}")
        received[named.name] = value.to(want.dtype)
    missing = sorted(reference.keys() - received.keys())
    if missing:
        raise BadRequest(f"Weights is missing {len(missing)} entries, e.g. {missing[:3]}")
    return received
