"""Transport security of every gRPC link: TLS, mutual TLS and an optional bearer token.

A process loads one `Transport` from its settings (`load`) and uses it both as a server
(`server_credentials`, `BearerTokenInterceptor`) and as a client (`rpc.dial`). Under mtls both ends present
a certificate chaining to the same CA, so a peer without one is refused during the TLS handshake, before
any request is read. The token, when set, is checked on every call except health checks (probes carry no
token), compared in constant time.

Certificates renewed on disk are used without a restart: a server reads its files again for the next
handshake once their modification times change (`server_credentials`), and a client for its next dial.
Connections already open keep the certificates they were made with.
"""

from __future__ import annotations

import functools
import hmac
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from splitrl.core.config import TlsMode, TransportSettings
from splitrl.core.metrics import Metrics

log = logging.getLogger(__name__)

#: Method prefix that needs no token: Kubernetes and Docker probes cannot send one.
TOKEN_EXEMPT_PREFIX = "/grpc.health.v1.Health/"
AUTHORIZATION = "authorization"


class SecurityConfigError(ValueError):
    """Transport settings that cannot work (a missing or unreadable file); the message says how to fix them."""


@dataclass(frozen=True)
class Transport:
    """Loaded credentials: PEM bytes and the token. `mode` says which of them are used."""

    mode: TlsMode
    certificate: bytes | None = None
    private_key: bytes | None = None
    ca: bytes | None = None
    server_name: str | None = None
    token: str | None = None

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """None under plaintext; under mtls a client without a certificate from the CA fails the handshake.
        These files, for good: `security.server_credentials` takes renewed ones too."""
        if self.mode == "plaintext":
            return None
        assert self.certificate is not None and self.private_key is not None
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate)],
            root_certificates=self.ca,
            require_client_auth=self.mode == "mtls",
        )

    def certificate_configuration(self) -> grpc.ServerCertificateConfiguration:
        assert self.certificate is not None and self.private_key is not None
        return grpc.ssl_server_certificate_configuration([(self.private_key, self.certificate)], self.ca)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """None under plaintext; TLS verifies the server against `ca` (system roots if None), mtls adds our cert.

        The token rides as call credentials, which gRPC sends only over a secure channel.
        """
        if self.mode == "plaintext":
            return None
        own = (self.private_key, self.certificate) if self.mode == "mtls" else (None, None)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=own[0], certificate_chain=own[1]
        )
        if self.token is None:
            return credentials
        return grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(self.token))

    def channel_options(self) -> list[tuple[str, Any]]:
        """Options a client channel adds: the name to expect in the server's certificate, when overridden."""
        if self.mode == "plaintext" or self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]

    def client_interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        """Under plaintext the token goes as metadata (call credentials need a secure channel)."""
        if self.mode != "plaintext" or self.token is None:
            return []
        metadata = ((AUTHORIZATION, f"Bearer {self.token}"),)
        return [cls(metadata) for cls in _TOKEN_INTERCEPTORS]


def load(settings: TransportSettings) -> Transport:
    """Read the files `settings` names (again only once they changed on disk); SecurityConfigError says what is
    missing and how to give it."""
    return _load(
        settings.tls,
        settings.tls_cert_file,
        settings.tls_key_file,
        settings.tls_ca_file,
        settings.tls_server_name,
        settings.auth_token_file,
        _stamps(settings),
    )


def server_credentials(settings: TransportSettings) -> grpc.ServerCredentials | None:
    """A server's credentials that take renewed certificate files for each new handshake (None: plaintext)."""
    initial = load(settings)
    if initial.mode == "plaintext":
        return None
    loaded = [initial]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC before each handshake: a new configuration once the files changed, else None."""
        try:
            current = load(settings)
        except SecurityConfigError as error:  # a renewal half-written: keep serving with what worked
            log.error("keeping the current certificate: %s", error)
            return None
        if current is loaded[0]:
            return None
        loaded[0] = current
        log.info("certificate files changed on disk: new handshakes use them")
        return current.certificate_configuration()

    return grpc.dynamic_ssl_server_credentials(
        initial.certificate_configuration(), fetch, require_client_authentication=initial.mode == "mtls"
    )


def _stamps(settings: TransportSettings) -> tuple[int, ...]:
    """The modification times (ns) of the files `settings` names, 0 for one absent: a change means a reload."""
    stamps = []
    for path in (settings.tls_cert_file, settings.tls_key_file, settings.tls_ca_file, settings.auth_token_file):
        try:
            stamps.append(path.stat().st_mtime_ns if path is not None else 0)
        except OSError:
            stamps.append(0)
    return tuple(stamps)


@functools.lru_cache(maxsize=16)  # a process dials many times with the same settings: files read once per change
def _load(
    mode: TlsMode,
    cert_file: Path | None,
    key_file: Path | None,
    ca_file: Path | None,
    server_name: str | None,
    token_file: Path | None,
    stamps: tuple[int, ...],
) -> Transport:
    token = _read(token_file, "--auth-token-file").decode().strip() if token_file is not None else None
    if token_file is not None and not token:
        raise SecurityConfigError(f"--auth-token-file {token_file} is empty")
    if mode == "plaintext":
        log.warning(
            "gRPC links are PLAINTEXT (--tls plaintext): traffic is unencrypted and peers are not authenticated%s",
            "; the bearer token crosses the link in clear" if token else "",
        )
        return Transport("plaintext", token=token)
    missing = [
        flag
        for flag, path in (("--tls-cert-file", cert_file), ("--tls-key-file", key_file), ("--tls-ca-file", ca_file))
        if path is None and not (flag == "--tls-ca-file" and mode == "tls")
    ]
    if missing:
        raise SecurityConfigError(
            f"--tls {mode} needs {', '.join(missing)} (env SPLITRL_TLS_CERT_FILE, SPLITRL_TLS_KEY_FILE, "
            "SPLITRL_TLS_CA_FILE): create them with `splitrl certs --out DIR --hosts NAME,...`, "
            "or pass --tls plaintext to run unencrypted and unauthenticated"
        )
    return Transport(
        mode,
        certificate=_read(cert_file, "--tls-cert-file"),
        private_key=_read(key_file, "--tls-key-file"),
        ca=_read(ca_file, "--tls-ca-file") if ca_file is not None else None,
        server_name=server_name,
        token=token,
    )


def _read(path: Path | None, flag: str) -> bytes:
    assert path is not None
    try:
        return path.read_bytes()
    except OSError as error:
        raise SecurityConfigError(f"{flag} {path}: cannot read ({error.strerror})") from None


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call (health checks aside) without `authorization: Bearer <token>`: UNAUTHENTICATED, counted."""

    def __init__(self, token: str, metrics: Metrics) -> None:
        self._expected = f"Bearer {token}".encode()
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method_path = handler_call_details.method
        if method_path.startswith(TOKEN_EXEMPT_PREFIX) or self._authorized(handler_call_details.invocation_metadata):
            return await continuation(handler_call_details)
        method = method_path.rsplit("/", 1)[-1]
        self._metrics.rejected_requests.labels(method=method, code=grpc.StatusCode.UNAUTHENTICATED.name).inc()
        log.warning("%s refused: UNAUTHENTICATED: missing or wrong bearer token", method)
        handler = await continuation(handler_call_details)
        return _refusal(handler)

    def _authorized(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
        given = next((value for key, value in metadata or () if key == AUTHORIZATION), "")
        given_bytes = given.encode() if isinstance(given, str) else given
        return hmac.compare_digest(given_bytes, self._expected)  # constant time: no timing oracle on the token


def _refusal(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that aborts with UNAUTHENTICATED before reading any request."""

    async def abort(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    if handler is None:  # unknown method: refuse it the same way, so the token is needed to probe for names
        return grpc.unary_unary_rpc_method_handler(abort)
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make: Any = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(abort, request_deserializer=handler.request_deserializer)


class _TokenMetadata:
    """Adds the bearer token to a call's metadata (plaintext channels only)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return details._replace(metadata=metadata)  # type: ignore[attr-defined]

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)

    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


class _UnaryUnary(_TokenMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    pass


class _UnaryStream(_TokenMetadata, grpc.aio.UnaryStreamClientInterceptor):
    pass


class _StreamUnary(_TokenMetadata, grpc.aio.StreamUnaryClientInterceptor):
    pass


class _StreamStream(_TokenMetadata, grpc.aio.StreamStreamClientInterceptor):
    pass


# grpc.aio picks an interceptor by the base class it derives from, so one class per call shape.
_TOKEN_INTERCEPTORS = (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)
