"""The link meter: one end of one link counting each message it sends or receives (docs/design.md §4).

Each message counts its serialized protobuf size (the payload of gRPC's length-prefixed frame), one message, and
the tensor elements ("numbers") it carries, on the families `splitrl.core.metrics` defines, labelled link,
direction, phase and payload from the fixed sets there.
"""

from __future__ import annotations

import functools
import math

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message
from prometheus_client import Counter

from splitrl.core import wire
from splitrl.core.metrics import Direction, Link, Metrics, Payload, Phase
from splitrl.v1 import tensor_pb2


def tensor_elements(message: Message) -> int:
    """Total elements of every splitrl.v1.Tensor inside `message`, at any depth.

    Counted from the bytes each tensor carries (len(data) / bytes per element), which equals
    product(shape) for every valid tensor and cannot be inflated or made negative
    by a forged shape; a tensor of unknown dtype counts 0. A compressed tensor counts
    product(shape), clipped to what the wire's size limit allows (a forged shape is
    refused by decoding, and cannot count more than a valid tensor could).
    """
    if isinstance(message, tensor_pb2.Tensor):
        return _elements_of(message)
    total = 0
    for name, repeated in _tensor_fields(message.DESCRIPTOR):
        if repeated:
            total += sum(tensor_elements(item) for item in getattr(message, name))
        elif message.HasField(name):
            total += tensor_elements(getattr(message, name))
    return total


def _elements_of(tensor: tensor_pb2.Tensor) -> int:
    """tensor_elements of one Tensor: never negative, and 0 for an unknown dtype."""
    shape = tensor.shape
    try:
        if tensor.compression == wire.COMPRESSION_NONE:
            data_bytes = len(tensor.data)  # each read of a bytes field copies it
            if all(dim >= 0 for dim in shape):
                declared = math.prod(shape)
                # An odd int4 count fills its last byte half: the shape says how many when it fits the data.
                if wire.data_bytes(tensor.dtype, declared) == data_bytes:
                    return declared
            return wire.elements_in(tensor.dtype, data_bytes)
        most = wire.elements_in(tensor.dtype, wire.DEFAULT_MAX_TENSOR_BYTES)
    except wire.WireError:
        return 0
    if any(dim < 0 for dim in shape):
        return 0
    return min(math.prod(shape), most)


@functools.cache
def _tensor_fields(descriptor: Descriptor) -> tuple[tuple[str, bool], ...]:
    """(name, repeated) of each field of `descriptor` that can hold a Tensor, at any depth below it.

    Walking only these, not every set field (Message.ListFields), keeps the meter from building a Python
    object for each scalar and bytes field of each message it counts, a frame's bytes among them."""
    return tuple(
        (field.name, field.is_repeated)
        for field in descriptor.fields
        if field.message_type is not None and _holds_tensors(field.message_type, frozenset())
    )


def _holds_tensors(descriptor: Descriptor, enclosing: frozenset[str]) -> bool:
    """Whether a message of type `descriptor` can hold a Tensor; `enclosing`: the types being asked about above
    it, so a recursive message type ends the walk."""
    if descriptor.full_name == tensor_pb2.Tensor.DESCRIPTOR.full_name:
        return True
    if descriptor.full_name in enclosing:
        return False
    inside = enclosing | {descriptor.full_name}
    return any(
        field.message_type is not None and _holds_tensors(field.message_type, inside) for field in descriptor.fields
    )


class LinkMeter:
    """Counts one end of one link. Cheap to call per message: label children are cached."""

    def __init__(self, metrics: Metrics, link: Link) -> None:
        self._metrics = metrics
        self.link = link
        self._children: dict[tuple[str, str, str], tuple[Counter, Counter, Counter]] = {}

    def sent(self, message: Message, *, phase: Phase, payload: Payload) -> int:
        """Count `message` as sent; return its size in bytes."""
        return self._count(message, "sent", phase, payload)

    def received(self, message: Message, *, phase: Phase, payload: Payload) -> int:
        """Count `message` as received; return its size in bytes."""
        return self._count(message, "received", phase, payload)

    def _count(self, message: Message, direction: Direction, phase: Phase, payload: Payload) -> int:
        key = (direction, phase, payload)
        children = self._children.get(key)
        if children is None:
            labels = {"link": self.link, "direction": direction, "phase": phase, "payload": payload}
            children = (
                self._metrics.link_bytes.labels(**labels),
                self._metrics.link_messages.labels(**labels),
                self._metrics.link_elements.labels(**labels),
            )
            self._children[key] = children
        size = message.ByteSize()
        children[0].inc(size)
        children[1].inc()
        children[2].inc(tensor_elements(message))
        return size
