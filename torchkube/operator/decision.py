"""What the planner sees (:class:`Observed`), what it decides (:class:`Plan`), the scratch
state the policies share while deciding (:class:`Context`, with the job's pods sorted in
:class:`SortedPods`), and what a step tells the planner (:class:`Step`). No I/O and no policy
here: the policies live one per module and ``planner.plan`` runs them in order.

One style for every policy: a planning step is ``step(ctx: Context) -> Step``. It writes what
it decides into the Context (status, conditions, events, the plan) and returns ``CONTINUE``,
or ``STOP`` when nothing else is to be planned this pass. What a step finds for a later one
goes into a typed field of the Context, never through a return value or a list the caller
holds: ``owned`` (the planner, before the policies), ``children_ready`` (``children.ensure``),
``pods`` (``sorting.sort``; ``stragglers.replace`` leaves out the pod it replaces),
``may_create`` (``refusals.back_off``) and ``missing_slots`` (``scaling.scale_workers``).
The few steps that run whatever the policies decided (``queueing.finish``,
``queueing.place``, ``lifecycle.clean_up_finished``, ``topology.report``) settle nothing and
return nothing.

Beneath the steps, the decisions themselves are pure functions that return values
(``scaling.surplus_and_missing``, ``node_loss.NodeLoss.deadline``...), and those the local
runner (``torchkube run``) follows too live in ``torchkube.policy``
(``accounting.account``, ``stragglers.track``...), so both follow the same rules.
"""

import enum
import secrets
import string
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from torchkube.api import TrainingJob
from torchkube.api.contract import ProgressReport
from torchkube.api.status import Phase, TrainingJobStatus
from torchkube.api.times import format_time, parse_time
from torchkube.api.types import Condition
from torchkube.operator import conditions as cond
from torchkube.operator import pods as p
from torchkube.operator.goodput import Tracked
from torchkube.operator.workloads import QueueObservation

if TYPE_CHECKING:  # the failures sorted, and recorded, into a Context
    from torchkube.policy.failures import Failure


def random_suffix() -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Refusal:
    """The apiserver refused to create a pod of the job (quota, Pod Security admission, a
    webhook, an invalid pod spec), or one of its children (``what``: "PersistentVolumeClaim
    x")."""

    code: int
    reason: str
    message: str
    at: datetime
    attempts: int = 1
    what: str = "a pod"

    @property
    def permanent(self) -> bool:
        """Refusals the same pod spec can never get past: an invalid pod (422) or one the
        namespace's Pod Security level forbids. Quota and webhooks may let it through later;
        a child's refusal is retried (the pod spec is not what is wrong)."""
        if self.what != "a pod":
            return False
        return self.code == 422 or (self.code == 403 and "violates PodSecurity" in self.message)

    @property
    def retry_after(self) -> float:
        """Seconds between attempts: doubling from 1 s up to 5 minutes."""
        return float(min(300, 2 ** min(self.attempts - 1, 9)))


@dataclass(frozen=True)
class Observed:
    job: TrainingJob
    pods: list[dict[str, Any]]
    nodes: dict[str, p.NodeHealth]
    now: datetime
    progress: ProgressReport | None = None
    self_deleted: frozenset[str] = frozenset()
    """Pods this operator process deleted itself (not failures, whatever they look like)."""
    children: list[dict[str, Any]] = field(default_factory=list)
    """The job's Service and claim as the watch cache shows them (slim), whoever owns them."""
    refused: Refusal | None = None
    vanished: list[dict[str, Any]] = field(default_factory=list)
    """Workers live at the previous plan and gone now, never seen Terminating nor deleted
    by this operator (``pods.vanished``): their last known bodies."""
    queue: QueueObservation | None = None
    """The job's Kueue Workload, read for jobs with a queue-name label."""
    forbidden: str | None = None
    """The apiserver's words when it refused this job's last reconcile a request (403)."""
    goodput: Tracked | None = None
    """The job's goodput as the last plan left it (None: none yet, or a new operator)."""
    status_written: datetime | None = None
    """When this process last wrote the job's status (None: not yet)."""
    progress_polled: bool = True
    """The operator polls trainers for progress (its progress URL is set): without that,
    goodput has only the pods to go by."""


@dataclass
class Plan:
    create_pods: list[dict[str, Any]] = field(default_factory=list)
    delete_pods: list[tuple[str, bool]] = field(default_factory=list)
    """(pod name, force): force skips the grace period, for pods on a lost node."""
    release: dict[str, str] = field(default_factory=dict)
    """Live pods the operator deletes on purpose (scale-down, suspend, duplicates, clean-up),
    labelled with why before the delete, so their terminal phase is never taken for a
    failure, even by an operator that restarted meanwhile."""
    mark_recorded: dict[str, str] = field(default_factory=dict)
    """Pod → value of the failure-recorded label once the status holds its failure."""
    create_children: list[dict[str, Any]] = field(default_factory=list)
    patch_children: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """(kind, name, merge patch) for children of ours that drifted from what we build."""
    status: TrainingJobStatus = field(default_factory=TrainingJobStatus)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False
    failures: list["Failure"] = field(default_factory=list)
    workload_writes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """("create", Workload), or a merge patch of the job's Workload: ("status", ...) of its
    status, ("spec", ...) of the rest."""
    all_running: bool = False
    """Every desired worker is Running (start-up and recovery are timed to this moment)."""
    all_running_at: float | None = None
    """With ``all_running``: when the watch first showed the last of them Running
    (``pods.last_seen_running``); None: not known, the moment of this plan."""
    keep_status: bool = False
    """The job's status is someone else's to write now (Kueue's copy from the worker cluster
    MultiKueue dispatched it to): the plan's status is not written."""
    goodput: Tracked | None = None
    """The job's goodput after this pass, for the controller to hand to the next one."""
    status_written: datetime | None = None
    """When the job's status was last written, this pass's write included, for the next."""

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.05)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )

    def delete(self, pod: dict[str, Any], force: bool = False, why: str | None = None) -> None:
        """Delete ``pod``; ``why`` marks a deletion of a live pod by the operator's choice."""
        if all(name != p.name(pod) for name, _ in self.delete_pods):
            self.delete_pods.append((p.name(pod), force))
        if why and p.state(pod) in ("pending", "running"):
            self.release.setdefault(p.name(pod), why)


@dataclass
class SortedPods:
    """The job's own pods, sorted into what the policies act on (``sorting.sort``)."""

    live_workers: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    live_stores: list[dict[str, Any]] = field(default_factory=list)
    live_lighthouses: list[dict[str, Any]] = field(default_factory=list)
    """recovery live: the Lighthouse pods Pending or Running (one, but for a moment)."""
    succeeded: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    new_failures: list["Failure"] = field(default_factory=list)
    deleting: list[dict[str, Any]] = field(default_factory=list)
    released: list[dict[str, Any]] = field(default_factory=list)
    """Spares that exited 0 when the rendezvous closed at the end of training."""

    @property
    def workers(self) -> list[dict[str, Any]]:
        return [pod for pods in self.live_workers.values() for pod in pods]

    def without(self, pod: dict[str, Any]) -> "SortedPods":
        """These pods with a live worker left out (the policies after the one that replaces
        it see its slot empty, and refill it); a slot left with no pod is dropped."""
        live: dict[int, list[dict[str, Any]]] = {}
        for index, pods in self.live_workers.items():
            kept = [other for other in pods if p.name(other) != p.name(pod)]
            if kept:
                live[index] = kept
        return replace(self, live_workers=live)


class Step(enum.Enum):
    """What a planning step tells the planner: go on to the next policy, or this pass is
    settled (the job waits, is suspended or ended, or one step already planned all there is
    to do now)."""

    CONTINUE = "continue"
    STOP = "stop"


CONTINUE, STOP = Step.CONTINUE, Step.STOP


class Context:
    """One planning pass: the job as the policies run it (``job``: the stored one unless
    given, e.g. at the size Kueue admitted), a mutable copy of its status, and the plan being
    built. ``observed.job`` stays the job as stored."""

    def __init__(self, observed: Observed, new_suffix: Any, job: TrainingJob | None = None) -> None:
        self.observed = observed
        self.job = job or observed.job
        self.spec = self.job.spec
        self.now = observed.now
        self.nodes = observed.nodes
        self.generation = self.job.metadata.get("generation")
        self.new_suffix = new_suffix
        status = self.job.status
        self.status = status.model_copy(deep=True) if status else TrainingJobStatus()
        self.plan = Plan()
        self.owned: list[dict[str, Any]] = []
        """The job's own pods, for a job this cluster runs (the planner sets them before the
        policies; one MultiKueue runs elsewhere has none here)."""
        self.children_ready = False
        """The job's Service and claim are in place, so its pods may be created
        (``children.ensure``)."""
        self.pods = SortedPods()
        """The job's own pods sorted (``sorting.sort``), as the later policies act on them."""
        self.may_create = False
        """Pods may be created this pass: the children are ready and no refused create is
        being backed off (``refusals.back_off``)."""
        self.missing_slots: list[int] = []
        """Worker slots left without a pod after scaling (backing off after a failure, or
        creates not allowed): ``scaling.scale_workers``, said by ``waiting.report``."""

    def condition(self, kind: str) -> Condition | None:
        return cond.get(self.status.conditions, kind)

    def set(self, kind: str, status: bool, reason: str, message: str) -> None:
        self.status.conditions = cond.set_condition(
            self.status.conditions, kind, status, reason, message, self.now, self.generation
        )

    def clear(self, kind: str, reason: str, message: str = "") -> None:
        self.status.conditions = cond.clear(
            self.status.conditions, kind, reason, message, self.now, self.generation
        )

    def is_true(self, kind: str) -> bool:
        return cond.is_true(self.status.conditions, kind)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.plan.events.append(Event(type_, reason, message))

    def warn_once(self, kind: str, reason: str, message: str) -> None:
        """Set ``kind`` True and emit a Warning event only when its reason changes."""
        previous = self.condition(kind)
        if previous is None or previous.status != "True" or previous.reason != reason:
            self.event("Warning", reason, message)
        self.set(kind, True, reason, message)

    def seconds_since(self, value: str | None) -> float | None:
        moment = parse_time(value)
        return None if moment is None else (self.now - moment).total_seconds()

    def finish(self, phase: Phase, reason: str, message: str) -> None:
        self.status.phase = phase
        self.status.completion_time = format_time(self.now)
        self.set(phase, True, reason, message)
        self.clear(cond.RUNNING, reason, message)
        self.clear(cond.RESTARTING, reason, message)
        self.clear(cond.WAITING_FOR_WORKERS, reason, message)
        self.event("Warning" if phase == "Failed" else "Normal", reason, message)

    def done(self) -> Plan:
        self.plan.status = self.status
        return self.plan
