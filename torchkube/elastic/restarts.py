"""In-place restarts of a pod's workers, where the operator can see them.

torchrun restarts a pod's failed workers in place up to ``--max-restarts`` times; the pod
neither fails nor restarts, so nothing in Kubernetes shows it, and a crash loop went
unnoticed until torchrun's budget ran out. Each launcher appends an :class:`InPlaceRestart`
per restart to one key of the job's rendezvous store; every trainer's metrics server reads
that key and serves it in ``/progress`` (one poll of any pod shows every pod's), and the
operator counts each restart like a pod failure (``policy/accounting.py``).

Best effort both ways: a store that is away stores and answers nothing (a restarted store
has forgotten the older records; the pods they name were counted by then, or failed since).
"""

import os
import time
from typing import Any

from pydantic import ValidationError

from torchkube.api.contract import Env, InPlaceRestart
from torchkube.elastic.store_link import StoreLink

RUN_ID = "TORCHELASTIC_RUN_ID"
"""torchrun's: the rendezvous id, in every worker's environment."""

KEPT = 64
"""Records read back: the newest, enough for every pod of a crash loop between two polls."""
CACHE_SECONDS = 2.0
"""How long a read is served again: the operator's poll, not the store, sets the pace."""


def board_id(rendezvous_id: str | None) -> str | None:
    """Whose board this process posts to or reads: the job's (``Env.RESTART_BOARD``, in every
    worker's environment), else — a launcher run by hand — its rendezvous id."""
    return os.environ.get(Env.RESTART_BOARD) or rendezvous_id


class RestartBoard:
    """The job's in-place restarts in its rendezvous store (one key per job: ``board_id``)."""

    def __init__(self, endpoint: str | None, run_id: str, timeout: float = 2.0) -> None:
        self.key = f"torchkube/restarts/{run_id}"
        self._link = StoreLink(endpoint, timeout)
        self._read_at = -CACHE_SECONDS
        self._cached: list[InPlaceRestart] = []

    @classmethod
    def from_env(cls) -> "RestartBoard | None":
        """A worker's view of its job's board (None: not under torchkube's launcher)."""
        endpoint, run_id = os.environ.get(Env.RENDEZVOUS_ENDPOINT), board_id(os.environ.get(RUN_ID))
        return cls(endpoint, run_id) if endpoint and run_id else None

    def post(self, record: InPlaceRestart) -> bool:
        """Append ``record``; False when the store is away."""

        def append(store: Any) -> bool:
            store.append(self.key, record.model_dump_json(by_alias=True) + "\n")
            return True

        return self._link.call(append, False)

    def read(self) -> list[InPlaceRestart]:
        """The newest ``KEPT`` records, oldest first (the last read again within
        ``CACHE_SECONDS``)."""
        now = time.monotonic()
        if now - self._read_at < CACHE_SECONDS:
            return self._cached
        self._read_at = now

        def read(store: Any) -> list[str] | None:
            return store.get(self.key).decode().splitlines() if store.check([self.key]) else []

        lines = self._link.call(read, None)
        if lines is None:  # away: what was read last
            return self._cached
        records = []
        for line in lines[-KEPT:]:
            try:
                records.append(InPlaceRestart.model_validate_json(line))
            except ValidationError:  # a line cut by a launcher killed mid-append
                continue
        self._cached = records
        return records
