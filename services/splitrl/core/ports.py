"""Binding a service's two listening ports (gRPC, /metrics), with an error a user can act on.

gRPC reports a failed bind as a bare "Failed to bind to address" RuntimeError (the reason goes to its C
log only), and prometheus-client's HTTP server as a raw OSError from deep in http.server: either left a
traceback. Here both become `PortUnavailable`, which names the address, the flag that sets it and the
operating system's reason, found by binding the address once more with a plain socket (`bind_error`).

A host is given as a name, an IPv4 address or an IPv6 address with or without brackets (`::1`, `[::1]`):
gRPC is given it bracketed, the HTTP server and the probe bare.
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
    try:
        if credentials is None:
            return server.add_insecure_port(_address(host, port))
        return server.add_secure_port(_address(host, port), credentials)
    except RuntimeError as error:  # "Failed to bind to address ...": the reason is only in gRPC's C log
        raise PortUnavailable(_message("gRPC", host, port, "--port")) from error


def serve_metrics(host: str, port: int, registry: CollectorRegistry) -> Any:
    """Start Prometheus' /metrics HTTP server on host:port (0: any free one) in a daemon thread; the server."""
    try:
        http, _thread = start_http_server(port, addr=_bare(host), registry=registry)
    except OSError as error:
        raise PortUnavailable(_message("/metrics", host, port, "--metrics-port", error)) from error
    return http


def bind_error(host: str, port: int) -> OSError | None:
    """What the operating system says when host:port is bound the way gRPC binds it (SO_REUSEADDR, every
    address the host resolves to), or None when it can be bound now."""
    try:
        addresses = socket.getaddrinfo(_bare(host), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in addresses:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
    except OSError as error:  # socket.gaierror (an unknown host) included
        return error
    return None


def _bare(host: str) -> str:
    return host.removeprefix("[").removesuffix("]")


def _address(host: str, port: int) -> str:
    """host:port as gRPC takes it, an IPv6 address bracketed."""
    return f"[{_bare(host)}]:{port}" if ":" in host else f"{host}:{port}"


def _message(what: str, host: str, port: int, port_flag: str, error: OSError | None = None) -> str:
    reason = error if error is not None and error.errno is not None else bind_error(host, port)
    described = "the bind failed, and the port was free when tried again" if reason is None else reason.strerror
    return f"cannot serve {what} on {_address(host, port)}: {described or reason}; {_fix(reason, port_flag)}"


def _fix(reason: OSError | None, port_flag: str) -> str:
    port_setting = f"{port_flag} (SPLITRL_{port_flag.removeprefix('--').replace('-', '_').upper()})"
    if isinstance(reason, socket.gaierror) or (reason is not None and reason.errno == errno.EADDRNOTAVAIL):
        return "--host (SPLITRL_HOST) must be a name or address of this machine (0.0.0.0: every interface)"
    if reason is not None and reason.errno == errno.EACCES:
        return f"ports below 1024 need privilege; choose another with {port_setting}"
    return f"another process listens on that port or holds it: stop it, or choose another with {port_setting} (0: any)"
