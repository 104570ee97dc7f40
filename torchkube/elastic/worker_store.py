"""A worker's process-group store, joined as soon as it listens.

torch's ``env://`` rendezvous has global rank 0 host the store of a round's process group and
every other rank connect to it as a client. A round's workers all start at once — after every
failure, on every resize — and a client that comes a few milliseconds before rank 0's server
listens is refused; torch's client then backs off before it tries again by half a second,
± 50 % (``c10d::ExponentialBackoffWithJitter``'s first interval), which the whole round waits
for: the 0.25–0.75 s worker-start stall of a recovery in which rank 0 was not the first up.
Here a client waits for the server's port to accept a connection first, trying again within
milliseconds, then connects as torch does.

The tries back off too, from :data:`FIRST_RETRY_SECONDS`, doubled up to a ceiling that keeps
all of a world's clients to about :data:`TRIES_PER_SECOND` refused connections a second at
rank 0's host (50 ms up to 100 ranks, then proportionally longer).
"""

import functools
import importlib
import socket
import time
from datetime import timedelta
from typing import Any

FIRST_RETRY_SECONDS = 0.002
TRIES_PER_SECOND = 2000
FASTEST_CEILING_SECONDS = 0.05
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
        hostname: str, port: int, rank: int, world_size: int, timeout: timedelta, *args: Any
    ) -> Any:
        if rank != 0:
            deadline = time.monotonic() + timeout.total_seconds()
            until_listening(hostname, port, world_size, deadline)
        return create(hostname, port, rank, world_size, timeout, *args)

    _create_c10d_store._torchkube_prompt = True  # type: ignore[attr-defined]
    module._create_c10d_store = _create_c10d_store


def retry_ceiling(world_size: int) -> float:
    """The longest wait between two tries of one client of a world of ``world_size``."""
    return max(FASTEST_CEILING_SECONDS, world_size / TRIES_PER_SECOND)


def until_listening(host: str, port: int, world_size: int, deadline: float) -> None:
    """Return once ``host:port`` accepts a connection, or at ``deadline`` (monotonic): torch's
    own connection then says what is wrong, as it would have."""
    delay, ceiling = FIRST_RETRY_SECONDS, retry_ceiling(world_size)
    while True:
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS):
                return
        except OSError:
            if time.monotonic() + delay >= deadline:
                return
            time.sleep(delay)
            delay = min(delay * 2, ceiling)
