"""TLS, mutual TLS and the bearer token on a real replay server, with certificates made inside the test.

Each refusal is shown against the same server that then serves the right client, so a refusal is
the security doing its job, not a server that serves nobody.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, generate_latest

from splitrl.core import certs, rpc, scrape, security
from splitrl.core.config import TransportSettings
from splitrl.core.metrics import Metrics
from splitrl.core.service import ServiceHost
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import replay_pb2, replay_pb2_grpc
from tests.chunks import tiny_chunk

TOKEN = "s3cret-token-for-this-test"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> certs.Pki:
    """The replay server's certificate, and a client's that may call every method these tests call (a learner's
    methods, and Insert, inference's: "writer")."""
    return certs.generate(tmp_path_factory.mktemp("tls"), ["replay", "client=learner", "writer=inference"])


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory) -> certs.Pki:
    """A second CA: its certificates are well-formed but not trusted by `pki`'s server."""
    return certs.generate(tmp_path_factory.mktemp("other-tls"), ["client=learner"])


def transport(pki: certs.Pki, host: str, mode: str = "mtls", **extra) -> dict:
    cert, key = pki.pairs[host]
    return {"tls": mode, "tls_cert_file": cert, "tls_key_file": key, "tls_ca_file": pki.ca, **extra}


def token_file(directory: Path, token: str) -> Path:
    path = directory / f"token-{abs(hash(token))}"
    path.write_text(token + "\n")
    return path


async def start_replay(**settings) -> ServiceHost:
    replay_settings = ReplaySettings(**settings)
    metrics = Metrics(CollectorRegistry())
    return await ServiceHost.start(ReplayService(replay_settings, metrics), replay_settings, metrics)


async def info(channel: grpc.aio.Channel, **kwargs) -> replay_pb2.InfoResponse:
    return await replay_pb2_grpc.ReplayStub(channel).Info(replay_pb2.InfoRequest(), timeout=5, **kwargs)


def chunk(steps: int = 2) -> replay_pb2.Trajectory:
    return tiny_chunk(steps)


async def insert_one(channel: grpc.aio.Channel) -> int:
    """One chunk over the Insert stream (stream-stream, written with call.write like the services do)."""
    call = replay_pb2_grpc.ReplayStub(channel).Insert()
    await call.write(replay_pb2.InsertRequest(table="rollouts", sequence=0, trajectory=chunk()))
    reply = await asyncio.wait_for(call.read(), 5)
    call.cancel()
    return reply.key


def unauthenticated(host: ServiceHost) -> float:
    """splitrl_rejected_requests_total{method="Info", code="UNAUTHENTICATED"} as /metrics shows it."""
    text = generate_latest(host.metrics.registry).decode()
    return sum(
        value
        for name, labels, value in scrape.samples(text)
        if name == "splitrl_rejected_requests_total" and labels == {"method": "Info", "code": "UNAUTHENTICATED"}
    )


async def test_mtls_serves_only_clients_with_a_certificate_from_its_ca(pki, other_pki):
    host = await start_replay(**transport(pki, "replay"))
    target = f"127.0.0.1:{host.grpc_port}"
    try:
        refused = {
            "plaintext client": grpc.aio.insecure_channel(target),
            "TLS client without a certificate": grpc.aio.secure_channel(
                target, grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
            ),
            "client certificate from another CA": rpc.dial(
                target, TransportSettings(**transport(other_pki, "client"), tls_server_name="localhost")
            ),
        }
        for what, channel in refused.items():
            async with channel:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await info(channel)
                assert error.value.code() == grpc.StatusCode.UNAVAILABLE, what

        async with rpc.dial(target, TransportSettings(**transport(pki, "client"))) as channel:
            assert [table.name for table in (await info(channel)).tables] == ["rollouts"]
        async with rpc.dial(target, TransportSettings(**transport(pki, "writer"))) as channel:
            assert await insert_one(channel) == 0
    finally:
        await host.stop()


async def test_tls_without_client_auth_still_verifies_the_server(pki, other_pki):
    host = await start_replay(**transport(pki, "replay", mode="tls"))
    target = f"127.0.0.1:{host.grpc_port}"
    try:
        # A client that trusts another CA refuses this server (it is the client that hangs up).
        async with rpc.dial(target, TransportSettings(**transport(other_pki, "client", mode="tls"))) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await info(channel)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        # tls: the client checks the server against the CA and presents no certificate of its own.
        async with rpc.dial(target, TransportSettings(**transport(pki, "client", mode="tls"))) as channel:
            assert (await info(channel)).tables
    finally:
        await host.stop()


@pytest.mark.parametrize("mode", ["mtls", "plaintext"])
async def test_bearer_token_is_required_except_for_health_checks(pki, tmp_path, mode):
    wire = transport(pki, "replay") if mode == "mtls" else {"tls": "plaintext"}
    host = await start_replay(**wire, auth_token_file=token_file(tmp_path, TOKEN))
    target = f"127.0.0.1:{host.grpc_port}"
    client = transport(pki, "client") if mode == "mtls" else {"tls": "plaintext"}
    try:
        for token in (None, "wrong-token", TOKEN[:-1]):
            extra = {} if token is None else {"auth_token_file": token_file(tmp_path, token)}
            async with rpc.dial(target, TransportSettings(**client, **extra)) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await info(channel)
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, token
                # probes carry no token: health checks are answered anyway
                health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert unauthenticated(host) == 3

        async with rpc.dial(target, TransportSettings(**client, auth_token_file=token_file(tmp_path, TOKEN))) as ok:
            assert (await info(ok)).tables
        writer = transport(pki, "writer") if mode == "mtls" else {"tls": "plaintext"}
        async with rpc.dial(target, TransportSettings(**writer, auth_token_file=token_file(tmp_path, TOKEN))) as ok:
            assert await insert_one(ok) == 0  # the token rides on streams too
        assert unauthenticated(host) == 3
        # The server keeps serving after refusals: a second wrong call is refused the same way.
        async with rpc.dial(target, TransportSettings(**client)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await info(channel)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert unauthenticated(host) == 4
    finally:
        await host.stop()


async def test_missing_certificates_fail_at_startup_saying_how_to_fix_it(pki, tmp_path):
    with pytest.raises(security.SecurityConfigError) as error:
        await start_replay()  # the default is mtls, and no files were given
    message = str(error.value)
    assert "--tls-cert-file" in message and "--tls-key-file" in message and "--tls-ca-file" in message
    assert "splitrl certs" in message and "--tls plaintext" in message

    with pytest.raises(security.SecurityConfigError, match="cannot read"):
        await start_replay(**{**transport(pki, "replay"), "tls_cert_file": tmp_path / "absent.pem"})


async def test_plaintext_is_served_only_when_asked_for_and_warns(caplog):
    security._load.cache_clear()  # the warning is logged when the settings are first loaded
    with caplog.at_level(logging.WARNING, logger="splitrl.core.security"):
        host = await start_replay(tls="plaintext")
    try:
        assert any("PLAINTEXT" in r.message and "unencrypted" in r.message for r in caplog.records)
        async with rpc.insecure_channel(f"127.0.0.1:{host.grpc_port}") as channel:
            assert (await info(channel)).tables
    finally:
        await host.stop()


async def test_a_statefulset_pod_name_verifies_under_its_services_wildcard(tmp_path):
    """Inference replicas on Kubernetes are dialled as POD.SERVICE.SUFFIX (k8s/overlays/scale-out): the
    certificate of SERVICE covers each pod through `*.SERVICE.SUFFIX`, and nothing deeper or elsewhere."""
    suffix = "splitrl.svc"
    pki = certs.generate(tmp_path, ["replay", "client=learner"], dns_suffixes=[suffix])
    host = await start_replay(**transport(pki, "replay"))
    target = f"127.0.0.1:{host.grpc_port}"
    try:
        for name, served in {
            "replay-0.replay.splitrl.svc": True,
            "replay-1.replay.splitrl.svc": True,
            "replay.splitrl.svc": True,
            "a.replay-0.replay.splitrl.svc": False,  # a wildcard covers one label only
            "replay-0.inference.splitrl.svc": False,
        }.items():
            settings = TransportSettings(**transport(pki, "client"), tls_server_name=name)
            async with rpc.dial(target, settings) as channel:
                if served:
                    assert [table.name for table in (await info(channel)).tables] == ["rollouts"], name
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as error:
                        await info(channel)
                    assert error.value.code() == grpc.StatusCode.UNAVAILABLE, name
    finally:
        await host.stop()


async def test_a_certificate_renewed_on_disk_is_served_without_a_restart(tmp_path):
    """`splitrl certs --reuse-ca` writes a renewed pair over the old one; the running server presents it from
    the next handshake on (here the renewal adds a name, which only the new certificate answers to)."""
    pki = certs.generate(tmp_path, ["replay", "client=learner"])
    host = await start_replay(**transport(pki, "replay"))
    target = f"127.0.0.1:{host.grpc_port}"
    renamed = TransportSettings(**transport(pki, "client"), tls_server_name="renewed.splitrl.test")
    try:
        async with rpc.dial(target, renamed) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await info(channel)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE  # the old certificate lacks the name
        certs.generate(tmp_path, ["replay"], extra_names=["renewed.splitrl.test"], reuse_ca=True)
        async with rpc.dial(target, renamed) as channel:
            assert [table.name for table in (await info(channel)).tables] == ["rollouts"]
    finally:
        await host.stop()
