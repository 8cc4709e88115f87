"""Authorisation by role: which certificate may call which RPC, and which edges are revoked.

Under mutual TLS every certificate names its holder with one SPIFFE ID as a URI SAN,
`spiffe://splitrl/<role>/<instance>` (`splitrl certs` writes it): the role is the kind of service that holds
it, the instance names the holder among its kind (an edge device's id, a service's name). gRPC verifies the
chain during the handshake and reports the ID in the call's auth context (`peer_spiffe_id`), so nothing here
parses a certificate. `RoleInterceptor` then lets each method through only from the roles that call it in
the design (`METHOD_ROLES`): a certificate of the run's CA proves who its holder is, not what it may do.

A deny list (`DenyList`) names identities the servers refuse from then on, re-read while they run; open
calls of a newly denied identity are ended with PERMISSION_DENIED at the next re-read. Every refusal says
who was refused and why, and is counted in `splitrl_rejected_requests_total{code="PERMISSION_DENIED"}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from splitrl.core.metrics import Metrics

log = logging.getLogger(__name__)

TRUST_DOMAIN = "splitrl"
#: The kinds of holder a certificate can name, one per service.
ROLES = ("environment", "edge-encoder", "inference", "replay", "learner")
#: The roles an edge device's processes hold: a deny list's bare name revokes these.
EDGE_ROLES = frozenset({"environment", "edge-encoder"})
#: An instance name: what a deny list can name on a line of its own (no spaces, no '#', no '/').
INSTANCE_NAME = re.compile(r"[A-Za-z0-9._-]+")

#: Who may call each method, by gRPC method path. Each caller is the service that dials that link in the
#: design (docs/design.md, links): environments roll out on their edge-encoder, edge-encoders act and train
#: across the WAN, inference writes replay, learners sample replay and publish weights.
METHOD_ROLES: Mapping[str, frozenset[str]] = {
    "/splitrl.v1.EdgeEncoder/Rollout": frozenset({"environment"}),
    "/splitrl.v1.Inference/Act": frozenset({"edge-encoder"}),
    "/splitrl.v1.EncoderTraining/Train": frozenset({"edge-encoder"}),
    "/splitrl.v1.PolicyUpdates/Publish": frozenset({"learner"}),
    "/splitrl.v1.Replay/Insert": frozenset({"inference"}),
    "/splitrl.v1.Replay/Sample": frozenset({"learner"}),
    "/splitrl.v1.Replay/UpdatePriorities": frozenset({"learner"}),
    "/splitrl.v1.Replay/Info": frozenset({"learner"}),
}
#: Methods any certificate of the CA may call: probes (Kubernetes, Docker) and, where enabled, reflection.
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
#: Seconds a refused streaming call waits for its caller's first message before it ends (see _guarded).
FIRST_MESSAGE_WAIT_S = 5.0


@dataclass(frozen=True, order=True)
class Identity:
    """Who holds a certificate: its `role` (one of ROLES) and `instance` (a name without '/')."""

    role: str
    instance: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; roles are {', '.join(ROLES)}")
        if not INSTANCE_NAME.fullmatch(self.instance):
            raise ValueError(f"an instance name is letters, digits, '.', '_' and '-', got {self.instance!r}")

    @property
    def uri(self) -> str:
        """The SPIFFE ID a certificate carries for this identity."""
        return f"spiffe://{TRUST_DOMAIN}/{self.role}/{self.instance}"

    def __str__(self) -> str:
        return f"{self.role}/{self.instance}"

    @classmethod
    def parse(cls, uri: str) -> Identity:
        """The identity a SPIFFE ID names; ValueError for any other URI."""
        prefix = f"spiffe://{TRUST_DOMAIN}/"
        role, _, instance = uri.removeprefix(prefix).partition("/")
        if not uri.startswith(prefix) or not instance:
            raise ValueError(f"{uri!r} is not a splitrl identity (spiffe://{TRUST_DOMAIN}/ROLE/INSTANCE)")
        return cls(role, instance)


def role_of(host: str) -> str:
    """The role a certificate for `host` gets: the role `host` is named after ("inference-1" -> inference)."""
    for role in sorted(ROLES, key=len, reverse=True):  # longest first: "edge-encoder-2" is not "edge..."
        if host == role or host.startswith(f"{role}-"):
            return role
    raise ValueError(f"cannot tell the role of {host!r}: name it ROLE or ROLE-SUFFIX, or give HOST=ROLE")


def peer_identity(context: grpc.aio.ServicerContext) -> Identity | None:
    """The caller's identity from its verified certificate; None when the call carries none (no mutual TLS,
    or a certificate without one splitrl SPIFFE ID)."""
    ids = context.auth_context().get("peer_spiffe_id", [])
    if len(ids) != 1:
        return None
    try:
        return Identity.parse(ids[0].decode())
    except (UnicodeDecodeError, ValueError):
        return None


class PermissionDenied(Exception):
    """A caller that may not do what it asked (PERMISSION_DENIED); the message says who and why."""


class DenyList:
    """Identities refused from now on, read from a text file re-read while the service runs.

    One entry a line: a SPIFFE ID (`spiffe://splitrl/edge-encoder/dev-7`, that certificate's holder) or a
    bare instance name (`dev-7`: both roles of that edge device, EDGE_ROLES); `#` starts a comment. A file
    that cannot be read keeps the entries read last (a revocation is never undone by a failed read) and is
    logged. The file is read whole at every reload (it is a few lines): no edit is missed for keeping its
    size and modification time.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: frozenset[str] = frozenset()
        if path is not None and not path.is_file():
            raise ValueError(f"--deny-list-file {path}: no such file (create it empty to deny nobody)")
        self.reload()

    def denies(self, identity: Identity) -> bool:
        return identity.uri in self.entries or (identity.role in EDGE_ROLES and identity.instance in self.entries)

    def reload(self) -> bool:
        """Re-read the file; whether the entries changed."""
        if self.path is None:
            return False
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            log.error("deny list %s unreadable, keeping its %d entries: %s", self.path, len(self.entries), error)
            return False
        entries = frozenset(line.split("#", 1)[0].strip() for line in text.splitlines()) - {""}
        changed = entries != self.entries
        if changed:
            log.warning("deny list %s: %d entries (%s)", self.path, len(entries), ", ".join(sorted(entries)) or "-")
        self.entries = entries
        return changed


class Claims:
    """Which identity owns each name (an edge's step-id prefix): the first identity to use a name owns it, and
    any other identity using it is refused. So an edge cannot speak for another, even with a name it guessed.

    Without an identity (no mutual TLS) nothing is claimed or checked. An identity keeps its newest
    `per_identity` names (an edge draws a new prefix at every restart): claiming more releases its oldest, so
    no identity can take the name space from the others.
    """

    def __init__(self, what: str, per_identity: int = 64) -> None:
        self.what, self.per_identity = what, per_identity
        self._owners: dict[int, Identity] = {}
        self._claimed: dict[Identity, list[int]] = {}

    def claim(self, name: int, identity: Identity | None) -> None:
        """Note `identity` as the owner of `name`, or raise PermissionDenied if another identity owns it."""
        if identity is None:
            return
        owner = self._owners.setdefault(name, identity)
        if owner != identity:
            raise PermissionDenied(f"{self.what} {name} belongs to {owner}; {identity} may not use it")
        names = self._claimed.setdefault(identity, [])
        if name in names:
            return
        names.append(name)
        if len(names) > self.per_identity:
            del self._owners[names.pop(0)]


def deny_list_for(path: Path | None, mode: str) -> DenyList | None:
    """The deny list a server of transport `mode` enforces roles with; None where roles cannot be enforced
    (no client certificates: logged). ValueError for a deny-list file that is missing."""
    if mode != "mtls":
        if path is not None:  # the server warns that nothing is authorised; this names what it cannot enforce
            log.warning("--deny-list-file %s is not enforced: --tls %s carries no client identities", path, mode)
        return None
    return DenyList(path)


@dataclass
class _OpenCall:
    identity: Identity
    method: str
    context: grpc.aio.ServicerContext
    task: asyncio.Task[Any] | None


@dataclass
class RoleInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through only from a role `METHOD_ROLES` allows for its method and an identity the deny
    list does not name; anything else ends PERMISSION_DENIED before the handler reads a request.

    Methods outside METHOD_ROLES and OPEN_PREFIXES are refused too: a new RPC is callable only once its
    callers are written down. `watch()` re-reads the deny list and ends the open calls it now denies.
    """

    metrics: Metrics
    deny_list: DenyList
    method_roles: Mapping[str, frozenset[str]] = field(default_factory=lambda: METHOD_ROLES)
    _open: dict[int, _OpenCall] = field(default_factory=dict)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        return _guarded(
            handler,
            lambda context: self._admit(method, context),
            lambda error: self.refuse(method, error),
            self._forget,
        )

    def _admit(self, method: str, context: grpc.aio.ServicerContext) -> int:
        """Check the caller of `method`; raises PermissionDenied, else notes the open call (its key)."""
        identity = peer_identity(context)
        allowed = self.method_roles.get(method, frozenset())
        if identity is None:
            raise PermissionDenied(
                f"{method} needs a client certificate with a splitrl identity (spiffe://{TRUST_DOMAIN}/ROLE/NAME, "
                "`splitrl certs`); the caller presented none"
            )
        if identity.role not in allowed:
            callers = ", ".join(sorted(allowed)) or "no role"
            raise PermissionDenied(f"role {identity.role} ({identity}) may not call {method}; {callers} may")
        if self.deny_list.denies(identity):
            raise PermissionDenied(f"{identity} is revoked (deny list {self.deny_list.path})")
        key = id(context)
        self._open[key] = _OpenCall(identity, method, context, asyncio.current_task())
        return key

    def _forget(self, key: int) -> None:
        self._open.pop(key, None)

    def refuse(self, method: str, error: PermissionDenied) -> None:
        short = method.rsplit("/", 1)[-1]
        self.metrics.rejected_requests.labels(method=short, code=grpc.StatusCode.PERMISSION_DENIED.name).inc()
        log.warning("%s refused: PERMISSION_DENIED: %s", short, error)

    async def watch(self, poll_s: float) -> None:
        """Forever: re-read the deny list every `poll_s` seconds; end the open calls of identities it now names."""
        while True:
            await asyncio.sleep(poll_s)
            if self.deny_list.reload():
                await self.cut(call for call in self._open.values() if self.deny_list.denies(call.identity))

    async def cut(self, calls: Iterable[_OpenCall]) -> None:
        for call in list(calls):
            error = PermissionDenied(f"{call.identity} is revoked (deny list {self.deny_list.path})")
            self.refuse(call.method, error)
            with contextlib.suppress(Exception):  # abort raises AbortError in this task: the status is sent
                await call.context.abort(grpc.StatusCode.PERMISSION_DENIED, str(error))
            if call.task is not None:
                call.task.cancel()
            self._forget(id(call.context))


def _guarded(
    handler: grpc.RpcMethodHandler,
    admit: Callable[[grpc.aio.ServicerContext], int],
    refuse: Callable[[PermissionDenied], None],
    forget: Callable[[int], None],
) -> grpc.RpcMethodHandler:
    """`handler` with `admit(context)` run first (a PermissionDenied it raises is passed to `refuse`, then ends the
    call) and `forget(key)` once the call has ended. Requests reach this wrapper as bytes and are parsed only
    once the caller is admitted."""
    kinds = {
        "unary_unary": grpc.unary_unary_rpc_method_handler,
        "unary_stream": grpc.unary_stream_rpc_method_handler,
        "stream_unary": grpc.stream_unary_rpc_method_handler,
        "stream_stream": grpc.stream_stream_rpc_method_handler,
    }
    kind = next(name for name in kinds if getattr(handler, name) is not None)
    behaviour = getattr(handler, kind)
    parse: Callable[[bytes], Any] = handler.request_deserializer or (lambda raw: raw)
    streaming_requests = kind.startswith("stream_")

    async def checked(request: Any, context: grpc.aio.ServicerContext) -> tuple[int, Any]:
        """The open call's key and the request (iterator) parsed as the handler expects."""
        try:
            key = admit(context)
        except PermissionDenied as error:
            refuse(error)
            if streaming_requests:
                # Ending the call while the caller is still writing its first message would show it INTERNAL
                # ("Internal error from Core"), not this reason: that message is read (as bytes) first.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(anext(aiter(request)), FIRST_MESSAGE_WAIT_S)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(error))
            raise  # not reached: abort raises
        if streaming_requests:
            return key, (parse(raw) async for raw in request)
        return key, parse(request)

    wrapped: Callable[..., Any]
    if inspect.isasyncgenfunction(behaviour):

        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
            key, parsed = await checked(request, context)
            try:
                async for response in behaviour(parsed, context):
                    yield response
            finally:
                forget(key)

        wrapped = streaming
    else:  # a coroutine: a unary answer, or a stream answered with context.write

        async def returning(request: Any, context: grpc.aio.ServicerContext) -> Any:
            key, parsed = await checked(request, context)
            try:
                return await behaviour(parsed, context)
            finally:
                forget(key)

        wrapped = returning
    return kinds[kind](wrapped, response_serializer=handler.response_serializer)
