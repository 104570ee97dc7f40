"""A worker's process-group store, joined as soon as it listens.

torch's ``env://`` rendezvous has global rank 0 host the store of a round's process group and
every other rank connect to it as a client. A round's workers all start at once — after every
failure, on every resize — and a client that comes a few milliseconds before rank 0's server
listens is refused; torch's client then backs off before it tries again by half a second,
± 50 % (``c10d::ExponentialBackoffWithJitter``'s first interval), which the whole round waits
for: the 0.25–0.75 s worker-start stall of a recovery in which rank 0 was not the first up.
Here a client waits for the server's port to accept a connection first, trying again within
milliseconds, then connects as torch does.

The tries back off too, with jitter, from :data:`FIRST_RETRY_SECONDS` doubled up to
:data:`FASTEST_CEILING_SECONDS` — both raised for a large world to ``world_size /``
:data:`TRIES_PER_SECOND`, so that all of a world's clients make no more than about that many
refused connections a second at rank 0's host, from the first try on. They go on for
:data:`PROBE_SECONDS` at most: a rank 0 later than that is late for a reason of its own (its
image, its node), and torch's own tries, with its own timeout, take over.
"""

import functools
import importlib
import random
import socket
import time
from datetime import timedelta
from typing import Any

FIRST_RETRY_SECONDS = 0.002
FASTEST_CEILING_SECONDS = 0.05
TRIES_PER_SECOND = 2000
PROBE_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 1.0


def connect_promptly() -> None:
    """Have this process's ``env://`` and ``tcp://`` rendezvous (``init_process_group``) wait
    for rank 0's store to listen before torch connects (once per process)."""
    # by import_module: the attribute torch.distributed.rendezvous is a function
    module: Any = importlib.import_module("torch.distributed.rendezvous")
    create = module._create_c10d_store
    if getattr(create, "_torchkube_prompt", False):
        return

    @functools.wraps(create)
    def _create_c10d_store(
        hostname: str,
        port: int,
        rank: int,
        world_size: int,
        timeout: timedelta,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if rank != 0:
            probing = min(timeout.total_seconds(), PROBE_SECONDS)
            until_listening(hostname, port, world_size, time.monotonic() + probing)
        return create(hostname, port, rank, world_size, timeout, *args, **kwargs)

    _create_c10d_store._torchkube_prompt = True  # type: ignore[attr-defined]
    module._create_c10d_store = _create_c10d_store


def retry_waits(world_size: int) -> tuple[float, float]:
    """The first and the longest wait between two tries of one client of a world of
    ``world_size`` (before jitter)."""
    spread = world_size / TRIES_PER_SECOND
    return max(FIRST_RETRY_SECONDS, spread), max(FASTEST_CEILING_SECONDS, spread)


def until_listening(host: str, port: int, world_size: int, deadline: float) -> None:
    """Return once ``host:port`` accepts a connection, or at ``deadline`` (monotonic): torch's
    own connection then says what is wrong, as it would have."""
    wait, ceiling = retry_waits(world_size)
    while True:
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS):
                return
        except OSError:
            jittered = wait * random.uniform(0.5, 1.5)
            if time.monotonic() + jittered >= deadline:
                return
            time.sleep(jittered)
            wait = min(wait * 2, ceiling)
