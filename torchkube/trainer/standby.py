"""Hot spares under live recovery: a replica group that stands by until one is lost.

With ``replicas.spares`` a restart-mode job keeps warm pods waiting in the rendezvous. Under
live recovery every pod is a rendezvous of its own, so a spare would simply train as one
group more, beyond ``replicas.max``. Instead a group beyond the target stands by — started,
its model and optimizer built, but no torchft Manager yet (a Manager heartbeats to the
Lighthouse, and a heartbeating group that asks for no quorum holds up every quorum) — and
joins as soon as the quorum is short of the target: at the next quorum, copying the live
state from a peer, instead of after a new pod's scheduling, image and start-up.

Which group stands by follows the quorum, not the slot: the writer group posts the quorum's
size to the job's rendezvous store (:class:`QuorumBoard`), and a group starting while the
others are whole stands by, whichever slot it has — the lost slot's replacement, once the
spare took its place, is the new spare. A quorum short of the target is a gap to fill only
after a loss (fewer groups than it held) or when it stayed short for ``SHORT_GRACE_SECONDS``
(a slot whose pod does not start); while the job starts, groups join one by one and the slots
decide: those below the target train, as they do when no fresh post exists (the job restarts
after losing every group).
Two standbys that see the same gap may both join; the quorum then holds one group more than
the target until one is lost, which costs throughput, never correctness (the global batch is
the spec's whatever the number of groups).
"""

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

from torchkube.elastic.store_link import StoreLink

log = logging.getLogger("torchkube.trainer")

QUORUM_KEY = "torchkube/live/quorum"
POLL_SECONDS = 0.5
"""How often a standby reads the quorum's post."""
POST_SECONDS = 1.0
"""How often the writer posts when nothing changed: the post's age says it still trains."""
STALE_SECONDS = 10.0
"""A post older than this (or than three of its steps) is from a job that no longer trains."""
SHORT_GRACE_SECONDS = 30.0
"""How long a quorum may stay short of the target, with no loss, before a standby fills it:
a slot's pod still starting is not a gap."""

Decision = Literal["join", "released"]


@dataclass(frozen=True)
class QuorumPost:
    """What the writer group last said about the quorum."""

    groups: int
    time: float
    step_seconds: float = 0.0
    finished: bool = False
    peak: int = 0
    """The most groups the writer has seen train together: fewer now is a loss."""
    short_since: float | None = None
    """Since when the quorum has been short of the target (None: whole)."""

    def fresh(self, now: float) -> bool:
        return now - self.time <= max(STALE_SECONDS, 3 * self.step_seconds)


def stands_by(slot: int, target: int, post: QuorumPost | None, now: float) -> bool:
    """Whether the group in ``slot`` waits rather than joins: the quorum is whole; or it is
    short without a gap to fill (no loss, not short for long: the others are still starting)
    and the slot is beyond the ``target``, as it decides with no fresh post (nothing trains)."""
    if post is None or not post.fresh(now):
        return slot >= target
    if post.groups >= target:
        return True
    lost = post.groups < post.peak
    short_long = post.short_since is not None and now - post.short_since > SHORT_GRACE_SECONDS
    return not (lost or short_long) and slot >= target


class QuorumBoard:
    """The quorum's size in the job's rendezvous store: posted by the writer group's rank 0,
    read by standbys. Best effort: a store that is away stores and answers nothing."""

    def __init__(self, endpoint: str | None, timeout: float = 2.0) -> None:
        self._link = StoreLink(endpoint, timeout)
        self._posted: tuple[int, bool] | None = None
        self._posted_at = 0.0
        self._peak = 0
        self._short_since: float | None = None

    def post(
        self, groups: int, target: int | None, step_seconds: float, finished: bool = False
    ) -> None:
        """Say how many groups train; written when that changed or ``POST_SECONDS`` passed.
        Keeps the peak and since when the quorum is short of ``target`` (None: no target)."""
        now = time.time()
        self._peak = max(self._peak, groups)
        short = target is not None and groups < target
        if not short:
            self._short_since = None
        elif self._short_since is None:
            self._short_since = now
        if self._posted == (groups, finished) and now - self._posted_at < POST_SECONDS:
            return
        body = {
            "groups": groups,
            "time": now,
            "stepSeconds": step_seconds,
            "finished": finished,
            "peak": self._peak,
            "shortSince": self._short_since,
        }

        def write(store: Any) -> bool:
            store.set(QUORUM_KEY, json.dumps(body))
            return True

        if self._link.call(write, False):  # else away: the next step posts again
            self._posted, self._posted_at = (groups, finished), now

    def read(self) -> QuorumPost | None:
        def read(store: Any) -> Any:
            return json.loads(store.get(QUORUM_KEY).decode()) if store.check([QUORUM_KEY]) else None

        body = self._link.call(read, None)
        if body is None:
            return None
        since = body.get("shortSince")
        return QuorumPost(
            int(body["groups"]),
            float(body["time"]),
            float(body.get("stepSeconds") or 0.0),
            bool(body.get("finished")),
            int(body.get("peak") or 0),
            None if since is None else float(since),
        )


def wait_for_a_place(
    board: QuorumBoard, slot: int, target: int | None, stopped: Any
) -> Decision | None:
    """Stand by while :func:`stands_by` says so; ``join`` once the quorum is short,
    ``released`` once training finished, None when ``stopped()`` (a signal) came first."""
    if target is None:
        return "join"
    announced = False
    while True:
        if stopped():
            return None
        post = board.read()
        now = time.time()
        if post is not None and post.finished:  # final: training is over for this store
            return "released"
        if not stands_by(slot, target, post, now):
            if announced:
                log.info("live: the quorum is short of its %d replica groups: joining", target)
            return "join"
        if not announced:
            groups = f"{post.groups} replica groups train" if post else "slots below it train"
            log.info(
                "live: standing by: %s, the target of %d; this group joins when one is lost",
                groups,
                target,
            )
            announced = True
        time.sleep(POLL_SECONDS)
