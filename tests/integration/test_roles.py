"""Authorisation by role over real gRPC and mutual TLS: every role against every method, the deny list cutting
off one edge while another goes on, and identities that cannot be borrowed.

The matrix runs against one server that serves every splitrl method with an echo (so a call that is let through
visibly succeeds) behind the real interceptors (`rpc.create_server` with `authz.RoleInterceptor`); the real
services are then shown to sit behind the same interceptor.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, generate_latest

from splitrl.core import authz, certs, ports, rpc, scrape, security
from splitrl.core.config import TransportSettings
from splitrl.core.metrics import Metrics
from splitrl.core.service import ServiceHost
from splitrl.replay.service import ReplayService
from splitrl.replay.settings import ReplaySettings
from splitrl.v1 import replay_pb2, replay_pb2_grpc
from tests.chunks import tiny_chunk

#: One certificate per role, named as `splitrl certs` names a service's; two edge devices besides.
HOSTS = ["replay", "inference", "learner", "edge-encoder", "environment"]
EDGES = ["dev1", "dev2"]
UNLISTED_METHOD = "/splitrl.v1.Replay/Drop"  # served, but no role is written down for it
STREAMING = {"Rollout", "Act", "Train", "Publish", "Insert"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> certs.Pki:
    return certs.generate(tmp_path_factory.mktemp("tls"), HOSTS, edges=EDGES)


def transport(pki: certs.Pki, holder: str, **extra) -> TransportSettings:
    cert, key = pki.pairs[holder]
    return TransportSettings(tls="mtls", tls_cert_file=cert, tls_key_file=key, tls_ca_file=pki.ca, **extra)


def _echo_handlers() -> list[grpc.GenericRpcHandler]:
    """Every method of METHOD_ROLES (and one unlisted), answering each request with an empty message."""

    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b""

    async def stream(requests, context: grpc.aio.ServicerContext):
        async for _ in requests:
            yield b""

    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for path in [*authz.METHOD_ROLES, UNLISTED_METHOD]:
        service, method = path.strip("/").split("/")
        handler = (
            grpc.stream_stream_rpc_method_handler(stream)
            if method in STREAMING
            else grpc.unary_unary_rpc_method_handler(unary)
        )
        by_service.setdefault(service, {})[method] = handler
    return [grpc.method_handlers_generic_handler(service, methods) for service, methods in by_service.items()]


class EchoServer:
    def __init__(self, pki: certs.Pki, deny_list: Path | None = None) -> None:
        self.pki, self.deny_list = pki, deny_list
        self.metrics = Metrics(CollectorRegistry())

    async def __aenter__(self) -> EchoServer:
        self.roles = authz.RoleInterceptor(self.metrics, authz.DenyList(self.deny_list))
        self.server, health_servicer, _ = await rpc.create_server(self.metrics, (), roles=self.roles)
        await rpc.set_serving(health_servicer, (), serving=True)
        self.server.add_generic_rpc_handlers(_echo_handlers())
        credentials = security.load(transport(self.pki, "replay")).server_credentials()
        self.port = ports.bind_grpc(self.server, "127.0.0.1", 0, credentials)
        await self.server.start()
        self.watch = asyncio.create_task(self.roles.watch(0.05)) if self.deny_list else None
        return self

    async def __aexit__(self, *exc) -> None:
        if self.watch is not None:
            self.watch.cancel()
        await self.server.stop(None)

    def dial(self, holder: str) -> grpc.aio.Channel:
        return rpc.dial(f"127.0.0.1:{self.port}", transport(self.pki, holder))

    def denied(self) -> float:
        text = generate_latest(self.metrics.registry).decode()
        return sum(
            value
            for name, labels, value in scrape.samples(text)
            if name == "splitrl_rejected_requests_total" and labels["code"] == "PERMISSION_DENIED"
        )


async def call(channel: grpc.aio.Channel, path: str) -> None:
    """One request and its answer on `path`; raises the call's AioRpcError."""
    if path.rsplit("/", 1)[-1] in STREAMING:
        stream = channel.stream_stream(path)()
        await stream.write(b"")
        reply = await asyncio.wait_for(stream.read(), 5)
        if reply is grpc.aio.EOF:
            await rpc.raise_if_failed(stream)
        stream.cancel()
    else:
        await channel.unary_unary(path)(b"", timeout=5)


async def open_stream(channel: grpc.aio.Channel, path: str = "/splitrl.v1.Inference/Act") -> grpc.aio.StreamStreamCall:
    stream = channel.stream_stream(path)()
    await stream.write(b"")
    assert await asyncio.wait_for(stream.read(), 5) == b""
    return stream


async def test_every_role_may_call_exactly_the_methods_the_design_gives_it(pki):
    async with EchoServer(pki) as server:
        refused = 0
        for role, path in itertools.product(HOSTS, [*authz.METHOD_ROLES, UNLISTED_METHOD]):
            allowed = role in authz.METHOD_ROLES.get(path, frozenset())
            async with server.dial(role) as channel:
                if allowed:
                    await call(channel, path)
                    continue
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await call(channel, path)
                refused += 1
                assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED, (role, path)
                assert f"role {role}" in error.value.details() and path in error.value.details()
                # health stays open to every certificate of the CA (probes)
                health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert refused == len(HOSTS) * (len(authz.METHOD_ROLES) + 1) - len(authz.METHOD_ROLES)
        assert server.denied() == refused


async def test_an_edge_device_acts_and_trains_as_its_edge_encoder_and_rolls_out_as_its_environment(pki):
    async with EchoServer(pki) as server:
        async with server.dial("edge-encoder-dev1") as channel:
            await call(channel, "/splitrl.v1.Inference/Act")
            await call(channel, "/splitrl.v1.EncoderTraining/Train")
            with pytest.raises(grpc.aio.AioRpcError, match="role edge-encoder"):
                await call(channel, "/splitrl.v1.Replay/Insert")
        async with server.dial("environment-dev1") as channel:
            await call(channel, "/splitrl.v1.EdgeEncoder/Rollout")
            with pytest.raises(grpc.aio.AioRpcError, match="role environment"):
                await call(channel, "/splitrl.v1.PolicyUpdates/Publish")


async def test_the_deny_list_cuts_off_one_edge_while_the_others_go_on(pki, tmp_path):
    deny_list = tmp_path / "denied.txt"
    deny_list.write_text("# nobody yet\n")
    async with EchoServer(pki, deny_list) as server:
        async with server.dial("edge-encoder-dev1") as one, server.dial("edge-encoder-dev2") as two:
            revoked, kept = await open_stream(one), await open_stream(two)
            deny_list.write_text("dev1  # lost in the field\n")
            for _ in range(100):  # bounded: the watcher re-reads every 0.05 s
                if revoked.done():
                    break
                await asyncio.sleep(0.05)
            assert await revoked.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "edge-encoder/dev1 is revoked" in await revoked.details()
            for _ in range(3):  # the other edge's open stream goes on
                await kept.write(b"")
                assert await asyncio.wait_for(kept.read(), 5) == b""
            with pytest.raises(grpc.aio.AioRpcError, match="revoked"):  # and dev1 cannot come back
                await call(one, "/splitrl.v1.Inference/Act")
            kept.cancel()
        async with server.dial("environment-dev1") as channel:  # a bare id revokes every role of the device
            with pytest.raises(grpc.aio.AioRpcError, match="environment/dev1 is revoked"):
                await call(channel, "/splitrl.v1.EdgeEncoder/Rollout")
        deny_list.write_text("spiffe://splitrl/environment/dev2\n")  # one identity, exactly
        await asyncio.sleep(0.3)
        async with server.dial("edge-encoder-dev2") as channel:
            await call(channel, "/splitrl.v1.Inference/Act")
        async with server.dial("environment-dev2") as channel:
            with pytest.raises(grpc.aio.AioRpcError, match="revoked"):
                await call(channel, "/splitrl.v1.EdgeEncoder/Rollout")
        async with server.dial("edge-encoder-dev1") as channel:  # taken off the list: served again
            await call(channel, "/splitrl.v1.Inference/Act")


def test_a_missing_deny_list_is_refused_before_serving(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        authz.deny_list_for(tmp_path / "absent.txt", "mtls")
    assert authz.deny_list_for(tmp_path / "absent.txt", "tls") is None  # nothing is authorised: logged, not read
    assert authz.deny_list_for(None, "plaintext") is None


def test_claims_keep_each_name_with_its_first_identity():
    claims = authz.Claims("step-id prefix")
    one, two = authz.Identity("edge-encoder", "dev1"), authz.Identity("edge-encoder", "dev2")
    claims.claim(7, one)
    claims.claim(7, one)  # a redial of the same edge
    claims.claim(7, None)  # no identity (no mutual TLS): nothing to check
    with pytest.raises(authz.PermissionDenied, match="step-id prefix 7 belongs to edge-encoder/dev1"):
        claims.claim(7, two)
    claims.claim(8, two)


def test_a_bare_name_revokes_an_edge_device_and_never_a_cloud_service(tmp_path):
    deny_list = tmp_path / "denied.txt"
    deny_list.write_text("learner\ndev-7\n")
    denied = authz.DenyList(deny_list)
    assert denied.denies(authz.Identity("edge-encoder", "learner")) and denied.denies(
        authz.Identity("environment", "dev-7")
    )
    assert not denied.denies(authz.Identity("learner", "learner"))
    deny_list.write_text("spiffe://splitrl/learner/learner\n")  # a cloud service only by its full identity
    assert denied.reload() and denied.denies(authz.Identity("learner", "learner"))


def test_claims_release_an_identitys_oldest_names_beyond_its_share():
    claims = authz.Claims("step-id prefix", per_identity=2)
    one, two = authz.Identity("edge-encoder", "dev1"), authz.Identity("edge-encoder", "dev2")
    for prefix in (1, 2, 3):  # three restarts of one edge: its first prefix is released
        claims.claim(prefix, one)
    claims.claim(1, two)
    with pytest.raises(authz.PermissionDenied):
        claims.claim(3, two)


def test_edge_certificates_answer_to_no_cloud_name(tmp_path):
    from cryptography import x509

    pki = certs.generate(tmp_path, ["inference"], extra_names=["cloud.example.com"], edges=["dev1"])
    for holder, cloud in (("inference", True), ("edge-encoder-dev1", False), ("environment-dev1", False)):
        cert = x509.load_pem_x509_certificate(pki.pairs[holder][0].read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert ("cloud.example.com" in names.get_values_for_type(x509.DNSName)) == cloud, holder


def test_identities_are_read_only_from_splitrl_spiffe_ids():
    assert authz.Identity.parse("spiffe://splitrl/edge-encoder/dev-7") == authz.Identity("edge-encoder", "dev-7")
    for uri in ("spiffe://other/learner/x", "spiffe://splitrl/admin/x", "spiffe://splitrl/learner/", "learner/x"):
        with pytest.raises(ValueError):
            authz.Identity.parse(uri)
    assert authz.role_of("inference-3") == "inference" and authz.role_of("edge-encoder") == "edge-encoder"
    with pytest.raises(ValueError, match="HOST=ROLE"):
        authz.role_of("gateway")
    for unlistable in ("dev#2", " dev3", "dev 4", ""):  # names a deny-list line could not hold
        with pytest.raises(ValueError, match="instance name"):
            authz.Identity("edge-encoder", unlistable)


async def start_replay(pki: certs.Pki, **settings) -> ServiceHost:
    replay_settings = ReplaySettings(**transport(pki, "replay").model_dump(), **settings)
    metrics = Metrics(CollectorRegistry())
    return await ServiceHost.start(ReplayService(replay_settings, metrics), replay_settings, metrics)


async def test_the_real_replay_serves_inference_and_learners_only(pki):
    host = await start_replay(pki)
    target = f"127.0.0.1:{host.grpc_port}"
    try:
        async with rpc.dial(target, transport(pki, "environment")) as channel:
            stub = replay_pb2_grpc.ReplayStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.Info(replay_pb2.InfoRequest(), timeout=5)
            assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
            insert = stub.Insert()
            await insert.write(replay_pb2.InsertRequest(table="rollouts", trajectory=tiny_chunk()))
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await insert.read()
            assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        async with rpc.dial(target, transport(pki, "inference")) as channel:
            insert = replay_pb2_grpc.ReplayStub(channel).Insert()
            await insert.write(replay_pb2.InsertRequest(table="rollouts", trajectory=tiny_chunk()))
            assert (await asyncio.wait_for(insert.read(), 5)).key == 0
            insert.cancel()
        async with rpc.dial(target, transport(pki, "learner")) as channel:
            assert (await replay_pb2_grpc.ReplayStub(channel).Info(replay_pb2.InfoRequest(), timeout=5)).tables
    finally:
        await host.stop()


async def test_reflection_is_served_only_when_asked_for(pki):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    for enabled in (False, True):
        host = await start_replay(pki, reflection=enabled)
        try:
            async with rpc.dial(f"127.0.0.1:{host.grpc_port}", transport(pki, "environment")) as channel:
                stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo()
                await stream.write(reflection_pb2.ServerReflectionRequest(list_services=""))
                if enabled:
                    reply = await asyncio.wait_for(stream.read(), 5)
                    names = {service.name for service in reply.list_services_response.service}
                    assert "splitrl.v1.Replay" in names
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as error:
                        await asyncio.wait_for(stream.read(), 5)
                    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await host.stop()


async def test_without_mutual_tls_the_service_says_loudly_that_nothing_is_authorised(caplog):
    with caplog.at_level(logging.WARNING, logger="splitrl.core.service"):
        settings = ReplaySettings(tls="plaintext")
        metrics = Metrics(CollectorRegistry())
        host = await ServiceHost.start(ReplayService(settings, metrics), settings, metrics)
    await host.stop()
    assert any("NO AUTHORISATION" in record.message for record in caplog.records)
