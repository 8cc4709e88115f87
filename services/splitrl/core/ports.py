"""Binding a service's two listening ports (gRPC, /metrics), with an error a user can act on.

gRPC reports a failed bind as a bare "Failed to bind to address" RuntimeError (the reason goes to its C
log only), and prometheus-client's HTTP server as a raw OSError from deep in http.server: either left a
traceback. Here both become `PortUnavailable`, which names the address, the flag that sets it and the
operating system's reason, found by binding the address once more with a plain socket.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, start_http_server


class PortUnavailable(OSError):
    """A service cannot listen where it was told to. The message says where, why, and which flag moves it."""


def bind_grpc(server: grpc.aio.Server, host: str, port: int, credentials: grpc.ServerCredentials | None) -> int:
    """Add the listening port host:port (0: any free one) to a not yet started server; the port bound."""
    bind = f"{host}:{port}"
    try:
        bound = server.add_insecure_port(bind) if credentials is None else server.add_secure_port(bind, credentials)
    except RuntimeError:
        bound = 0  # grpcio >= 1.56 raises where earlier releases returned 0
    if bound == 0:
        raise PortUnavailable(_message("gRPC", host, port, "--port"))
    return bound


def serve_metrics(host: str, port: int, registry: CollectorRegistry) -> Any:
    """Start Prometheus' /metrics HTTP server on host:port (0: any free one) in a daemon thread; the server."""
    try:
        http, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        raise PortUnavailable(_message("/metrics", host, port, "--metrics-port", error)) from error
    return http


def _message(what: str, host: str, port: int, port_flag: str, error: OSError | None = None) -> str:
    reason = error if error is not None and error.errno is not None else _bind_error(host, port)
    return f"cannot serve {what} on {host}:{port}: {_describe(reason)}; {_fix(reason, port_flag)}"


def _fix(reason: OSError | None, port_flag: str) -> str:
    if isinstance(reason, socket.gaierror) or (reason is not None and reason.errno == errno.EADDRNOTAVAIL):
        return "--host must be a name or address of this machine (0.0.0.0: every interface)"
    if reason is not None and reason.errno == errno.EACCES:
        return f"ports below 1024 need privilege; choose another with {port_flag}"
    return f"another process listens on that port or holds it: stop it, or choose another with {port_flag} (0: any)"


def _bind_error(host: str, port: int) -> OSError | None:
    """What the operating system says when host:port is bound the way gRPC binds it (SO_REUSEADDR), if anything."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as error:  # socket.gaierror (an unknown host) included
        return error
    return None  # free by now: whatever held it let go between the two binds


def _describe(reason: OSError | None) -> str:
    if reason is None:
        return "the bind failed, and the port was free when tried again"
    return reason.strerror or str(reason)
