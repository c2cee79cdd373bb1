"""Free loopback ports for the servers that tests and benchmarks start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port that was free a moment ago (the OS picked it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_run(count: int) -> int:
    """A base port with ``count`` consecutive free loopback ports from it (servers that
    take ``--port base`` and bind base, base + 1, …)."""
    for _ in range(200):
        base = free_port()
        if base + count > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for i in range(count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no run of {count} free loopback ports")
