"""What the controller remembers of one job between its reconciles, by purpose.

The watch caches are the truth; this is what they cannot say yet or at all: our own writes
the watch has not shown (:class:`Expectations`), what was read or written that the next
reconcile need not repeat (:class:`Cache`), what goodput and the timing metrics carry from one
reconcile to the next (:class:`Accounting`), and what keeps the operator from acting on the job
(:class:`Trouble`). All of it belongs to one job, the one with ``uid``: a job deleted and
created again under its name is another job, and starts afresh.
"""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchkube.api.contract import ProgressReport
from torchkube.operator.decision import Refusal
from torchkube.operator.goodput import Tracked

EXPECTATION_TTL = 120.0
"""An expectation the watch never confirmed is dropped after this long: the watch lost the
event, and the cache (relisted since) is the truth again."""


@dataclass
class Expectations:
    """Our own pod writes, folded into the cached view until the watch shows them: a
    reconcile right after creating pods never creates them twice."""

    created: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    """Pod name → (when, the slim body the create returned)."""
    deleted: dict[str, float] = field(default_factory=dict)
    """Pod name → when this process deleted it (not a failure, whatever it looks like)."""
    live: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The Pending and Running workers of the last plan, by name: a force-deleted one
    leaves the watch with no Terminating state to see (``pods.vanished``)."""

    def expire(self, now: float) -> None:
        self.created = {k: v for k, v in self.created.items() if now - v[0] < EXPECTATION_TTL}
        self.deleted = {k: v for k, v in self.deleted.items() if now - v < EXPECTATION_TTL}


@dataclass
class Cache:
    """What was read or written that the watch or the next poll has not made stale yet."""

    job: dict[str, Any] | None = None
    """The job as our last status write returned it (newer than the watch may show)."""
    quiet_write: int | None = None
    """The resourceVersion of our last status write that changed nothing but
    ``status.goodput`` (its echo is not reconciled: see ``Controller.job_changed``)."""
    progress: ProgressReport | None = None
    """The trainer's last progress report."""
    progress_at: float = 0.0
    """When the trainer was last polled (monotonic seconds)."""
    progress_pod: str | None = None
    """The pod that answered last: asked first next time."""


@dataclass
class Accounting:
    """What the job's goodput, its status writes and its start-up and recovery metrics carry
    over."""

    goodput: Tracked | None = None
    status_written: datetime | None = None
    """When this process last wrote the job's status (``Plan.status_written``)."""
    seen: bool = False
    """The job's metric series were created at zero."""
    startup_observed: bool = False
    """Start-up was timed, or cannot be (the job had started before this process saw it)."""
    failure_at: float | None = None
    """When the failure now being recovered from was recorded (wall seconds, ``time.time()``,
    the clock of the pod watch's ``RUNNING_SEEN`` that ends it)."""


@dataclass
class Trouble:
    """What keeps the operator from acting on the job, as the apiserver or the model said it."""

    refused: Refusal | None = None
    """The apiserver's last refusal of a create (the planner backs off and reports it)."""
    invalid: str | None = None
    """Why the job does not validate, as last said on it."""
    forbidden: str | None = None
    """The apiserver's words for the request it refused this job's last reconcile (403)."""


@dataclass
class JobMemory:
    uid: str | None = None
    expected: Expectations = field(default_factory=Expectations)
    cache: Cache = field(default_factory=Cache)
    accounting: Accounting = field(default_factory=Accounting)
    trouble: Trouble = field(default_factory=Trouble)
    planning_seconds: float = 0.0
    """How long the last reconcile took to decide (its API calls not counted): it spaces
    the job's reconciles (``controller.RECONCILE_SHARE``)."""
