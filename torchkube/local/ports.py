"""Free loopback ports for servers this machine starts: ``torchkube run``'s rendezvous store,
Lighthouse and metrics endpoints, and the test control plane's components.

Ports are drawn at random from below the kernel's ephemeral range (where the kernel puts outgoing
connections and ``bind(0)``), never the same one twice in a process, and each candidate is
test-bound before it is handed out. So two servers never get one port, and a server started
again on its port after a loss (a store, a Lighthouse) does not find it taken as the source port
of some client's connection; two clusters on one machine practically never collide.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOW_PORT = 20000
"""Lowest port handed out: clear of well-known services and of most development servers."""

_EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def ephemeral_range(path: Path = _EPHEMERAL_FILE) -> tuple[int, int]:
    """Return the kernel's ephemeral port range (Linux default 32768-60999 when unreadable)."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def candidate_range(ephemeral: tuple[int, int] | None = None) -> tuple[int, int]:
    """Return the inclusive range free ports are drawn from.

    Below the ephemeral range when there is room there, otherwise above it; a machine whose
    ephemeral range covers everything leaves no choice but to draw from it anyway.
    """
    low, high = ephemeral or ephemeral_range()
    if low - 1 - LOW_PORT >= 1000:
        return LOW_PORT, low - 1
    if 65535 - (high + 1) >= 1000:
        return high + 1, 65535
    return LOW_PORT, 65535


def is_port_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether ``port`` can be bound on ``host`` now (no SO_REUSEADDR: TIME_WAIT counts as busy);
    every address by default, as the store and the Lighthouse bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(rng: random.Random | None = None, attempts: int = 200) -> int:
    """Return a random bindable loopback port, never the same one twice in this process.

    The port is only known free at the moment of the check; components that lose the race fail
    to bind and the cluster reports which one, with its log.
    """
    rng = rng or random.SystemRandom()
    low, high = candidate_range()
    for _ in range(attempts):
        port = rng.randint(low, high)
        if port in _handed_out or not is_port_free(port):
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {low}-{high} after {attempts} attempts")
