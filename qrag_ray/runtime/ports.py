"""Local TCP ports: the one helper that finds a free one (the CLI's spare proxy port, tests, benchmarks)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at this moment (the OS picks it); the caller binds it soon after."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
