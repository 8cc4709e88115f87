"""Loopback ports for the servers a test starts itself (a rendezvous, a compose stack's published ports)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, as the kernel picks it: parallel tests never share
    one (it could be taken again before the test binds it, which the kernel makes unlikely)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
