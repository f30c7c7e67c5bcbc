"""Loopback helpers shared by the tests, the benchmark and the scripts."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """Ask the kernel for a free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
