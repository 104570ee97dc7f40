"""A best-effort link to the job's rendezvous store, shared by the boards kept in it.

The store restarts with its pod (a crash, a node loss, an operator that replaced it), and
what the boards keep there — hang declarations, in-place restarts, the live quorum — is
advice: a caller that cannot reach the store decides alone and asks again later. So every
call either answers or falls back, and a failed call drops the connection so that the next
one reconnects to the store's new incarnation.

Connecting to a store that is away must be cheap: under live recovery the workers train on
while the store pod is replaced, the writer group posting to the quorum board after its
steps, and torch's client retries a refused connection with a growing delay (2 to 6 s a
call for a 2 s timeout, measured). So the link first tries a plain TCP connection (refused at
once), and after a failed connect it falls back at once for ``RETRY_AFTER_SECONDS``.
"""

import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

T = TypeVar("T")

RETRY_AFTER_SECONDS = 5.0
"""How long a link falls back at once after a failed connect before it tries the store again."""


def store_client(endpoint: str, timeout: float) -> Any:
    """A client of the job's rendezvous store at ``host:port`` (an IPv6 host in brackets);
    torch is imported only here, when a board first talks to the store.

    OSError at once where nothing listens yet (a store still starting, or restarting), and
    within a second where nothing answers (a pod gone with its node): c10d's client would
    retry for ``timeout``, on the training thread of a live job, and then print its timeout
    with a C++ stack trace on stderr, which is the terminal of ``torchkube run``."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    socket.create_connection((host, int(port)), timeout=min(timeout, 1.0)).close()
    from torch.distributed import TCPStore

    return TCPStore(
        host,
        int(port),
        is_master=False,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
    )


class StoreLink:
    """Connects on first use; ``endpoint`` None (not under torchkube's launcher): every call
    falls back."""

    def __init__(
        self, endpoint: str | None, timeout: float, retry_after: float = RETRY_AFTER_SECONDS
    ) -> None:
        self.endpoint, self.timeout, self.retry_after = endpoint, timeout, retry_after
        self._store: Any = None
        self._failed_at: float | None = None

    def call(self, use: Callable[[Any], T], fallback: T) -> T:
        """``use(store)``, or ``fallback`` when there is no store, it is away, or connecting
        to it failed less than ``retry_after`` seconds ago."""
        if not self.endpoint:
            return fallback
        if self._store is None:
            failed = self._failed_at
            if failed is not None and time.monotonic() < failed + self.retry_after:
                return fallback
            try:
                self._store = store_client(self.endpoint, self.timeout)
            except Exception:  # away (restarting, replaced)
                self._failed_at = time.monotonic()
                return fallback
            self._failed_at = None
        try:
            return use(self._store)
        except Exception:  # gone since (restarted, replaced): the next call reconnects
            self._store = None
            return fallback
