"""An edge cannot speak for another: the step-id prefix an edge's steps carry belongs to the certificate that
first used it, at inference (Act streams) and at the learner (Train hellos), and the learner names each edge
by its certificate, not by what it announces."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from splitrl.core import authz
from splitrl.core.metrics import Metrics
from splitrl.core.rpc import BadRequest
from splitrl.core.step_ids import first_id
from splitrl.inference.service import _EdgeStream
from splitrl.inference.settings import InferenceSettings
from splitrl.learner.edges import EdgeLinks
from splitrl.v1 import training_pb2

DEV1, DEV2 = authz.Identity("edge-encoder", "dev1"), authz.Identity("edge-encoder", "dev2")


def test_an_act_stream_keeps_to_the_prefix_its_edge_owns():
    settings = InferenceSettings(tls="plaintext", env="splitrl/Catch-v0")
    prefixes = authz.Claims("step-id prefix")
    first = _EdgeStream(settings, "frame", DEV1, prefixes)
    first._claim_prefix(first_id(5), 4)
    first._claim_prefix(first_id(5) + 4, 4)
    with pytest.raises(BadRequest, match="left this stream's step-id prefix 5"):
        first._claim_prefix(first_id(6), 4)
    again = _EdgeStream(settings, "frame", DEV1, prefixes)  # the same edge, redialled
    again._claim_prefix(first_id(5) + 8, 4)
    thief = _EdgeStream(settings, "frame", DEV2, prefixes)
    with pytest.raises(authz.PermissionDenied, match="step-id prefix 5 belongs to edge-encoder/dev1"):
        thief._claim_prefix(first_id(5) + 12, 4)


async def hellos(prefix: int, edge_id: str):
    yield training_pb2.EdgeMessage(hello=training_pb2.EdgeHello(step_id_prefix=prefix, width=16, edge_id=edge_id))


async def test_the_learner_names_edges_by_certificate_and_refuses_a_borrowed_prefix():
    links = EdgeLinks(Metrics(CollectorRegistry()), 16, max_encoder_lag=4)
    edge = await links._accept_hello(hellos(9, "claims-to-be-dev2"), DEV1)
    assert edge.edge_id == "edge-encoder/dev1 (announced as 'claims-to-be-dev2')"
    with pytest.raises(authz.PermissionDenied, match="step-id prefix 9 belongs to edge-encoder/dev1"):
        await links._accept_hello(hellos(9, "dev1"), DEV2)
    assert (await links._accept_hello(hellos(10, "dev2"), DEV2)).edge_id.startswith("edge-encoder/dev2")
    plain = await links._accept_hello(hellos(11, "a-name"), None)  # no mutual TLS: the announced name is all there is
    assert plain.edge_id == "a-name"
