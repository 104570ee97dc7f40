"""A best-effort link to the job's rendezvous store, shared by the boards kept in it.

The store restarts with its pod (a crash, a node loss, an operator that replaced it), and
what the boards keep there — hang declarations, in-place restarts, the live quorum — is
advice: a caller that cannot reach the store decides alone and asks again later. So every
call either answers or falls back, and a failed call drops the connection so that the next
one reconnects to the store's new incarnation.
"""

import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

T = TypeVar("T")


def store_client(endpoint: str, timeout: float) -> Any:
    """A client of the job's rendezvous store at ``host:port`` (an IPv6 host in brackets);
    torch is imported only here, when a board first talks to the store.

    OSError at once where nothing listens yet (a store still starting, or restarting): c10d's
    client would retry for ``timeout`` and then print its timeout with a C++ stack trace on
    stderr, which is the terminal of ``torchkube run``."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    socket.create_connection((host, int(port)), timeout=timeout).close()
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

    def __init__(self, endpoint: str | None, timeout: float) -> None:
        self.endpoint, self.timeout = endpoint, timeout
        self._store: Any = None

    def call(self, use: Callable[[Any], T], fallback: T) -> T:
        """``use(store)``, or ``fallback`` when there is no store or it is away."""
        if not self.endpoint:
            return fallback
        try:
            if self._store is None:
                self._store = store_client(self.endpoint, self.timeout)
            return use(self._store)
        except Exception:  # away (restarting, replaced): the next call reconnects
            self._store = None
            return fallback
