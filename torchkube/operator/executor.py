"""Carrying a plan out: the API writes a :class:`~torchkube.operator.decision.Plan` asks for,
in the order that keeps the job's status the record of what was done, every one fenced.

The fence: a write goes out only while this replica holds the Lease as the Lease itself says
(``LeaderElection.fence``), checked before the status, Workload and children writes of a
plan, before each batch of pod writes, and before a status set without a plan; a stale leader
that slept through a takeover writes nothing (tests/integration/test_leader_election.py).

Everything here blocks on the API and runs in threads; it touches only the job's own
:class:`~torchkube.operator.memory.JobMemory`: what its writes left behind (the job as the
status write returned it, the pods created and deleted, the apiserver's refusal).
"""

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from torchkube.api import labels as lbl
from torchkube.operator import pods as p
from torchkube.operator import status as st
from torchkube.operator.decision import Event, Plan, Refusal
from torchkube.operator.kube import Kube, api_message, resource_version
from torchkube.operator.leader import LeaderElection, LostLeadership
from torchkube.operator.memory import JobMemory
from torchkube.operator.queue_client import QueueClient

log = logging.getLogger(__name__)
Key = tuple[str, str]

CHILDREN_BEFORE_PODS = frozenset({"PersistentVolumeClaim"})
"""Children created before any pod even by a plan that only creates: a worker whose claim
does not exist waits unschedulable, its slot taken. The Service is not among them: created
with the pods, it exists long before a container resolves the store's name (a refused one is
reported and retried while the workers wait for the store)."""


class Executor:
    def __init__(
        self,
        kube: Kube,
        queues: QueueClient | None,
        leader: LeaderElection | None,
        acting: Callable[[], bool],
        workers: int,
    ) -> None:
        self.kube = kube
        self.queues = queues
        self.leader = leader
        self.acting = acting
        """Whether this replica may write at all (it leads, and is not stopping)."""
        self.beside = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="status-beside")
        """Writes that run beside a plan's others (its status beside its creates) or beside
        the reconciles (a Workload's finalizer)."""
        self.recorders = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"events-{lane}")
            for lane in range(workers)
        ]
        """Post the plans' events beside the reconciles, a job's plans' in the order they were
        made (each job has its lane, one thread): an event is a record for the user that no
        decision waits for, and one refused for the moment is sent again for seconds
        (``kube.EVENT_RETRY_DELAYS``), which a reconcile that posted them itself waited for —
        and every event of the job with it, a queued job's admission among them. Lanes, so
        that one job's refused events do not hold up every other job's."""
        self.in_flight = 0
        """Plans being carried out now (a stopping controller waits for them)."""
        self._in_flight_lock = threading.Lock()

    def fence(self) -> None:
        """Before a write: this replica acts, and the Lease itself still says it leads (the
        local flag alone trusts a replica that slept through a takeover)."""
        self._check_acting()
        if self.leader is not None:
            self.leader.fence()

    def _check_acting(self) -> None:
        if not self.acting():
            raise LostLeadership("this replica does not hold the Lease")

    # ------------------------------------------------------------------ a plan
    def execute(
        self,
        key: Key,
        body: dict[str, Any],
        decided: Plan,
        planned: dict[str, Any],
        memory: JobMemory,
    ) -> None:
        """Carry out a plan (``planned``: its status as sent), counted in :attr:`in_flight`."""
        with self._in_flight_lock:
            self.in_flight += 1
        try:
            self._execute(key, body, decided, planned, memory)
        finally:
            with self._in_flight_lock:
                self.in_flight -= 1

    def _execute(
        self,
        key: Key,
        body: dict[str, Any],
        decided: Plan,
        planned: dict[str, Any],
        memory: JobMemory,
    ) -> None:
        """The children (no pod is created while one is refused: a worker without its claim
        would wait unschedulable), the status, so nothing is done that the status does not
        know about (a failure the status lost would be forgotten, a permanent one retried),
        then labels, deletions, creations — and the plan's events however those end, handed
        to :attr:`recorders`: only this plan has them (the next one finds the failure recorded
        and opens no incident).
        A plan that only creates writes its status beside its creates, and a Service with its
        pods (see :func:`_status_may_go_beside`); a new Workload goes beside them too: Kueue
        admits it within tens of milliseconds, and the admitted job's plan waits for this one
        to end. A Workload's other writes come first, before anything they could leave behind
        half done (a conflict refuses them). A plan whose status is someone else's to write
        (``keep_status``) writes none."""
        namespace, name = key
        self._check_acting()
        status_patch = {} if decided.keep_status else st.merge_patch(body.get("status"), planned)
        if status_patch or _writes_besides_status(decided):
            self.fence()
        creates_only = _status_may_go_beside(decided)
        workload: Future[None] | None = None
        if decided.workload_writes and self.queues is not None:
            if creates_only and all(verb == "create" for verb, _ in decided.workload_writes):
                workload = self.beside.submit(self.queues.write, namespace, decided.workload_writes)
            else:
                self.queues.write(namespace, decided.workload_writes)
        for kind, child, patch in decided.patch_children:
            self.kube.patch(kind, namespace, child, patch)
        version = body.get("metadata", {}).get("resourceVersion")
        children_first = decided.create_children
        if creates_only and not any(c["kind"] in CHILDREN_BEFORE_PODS for c in children_first):
            children_first = []
        beside: Future[dict[str, Any]] | None = None
        if status_patch and creates_only:
            beside = self.beside.submit(
                self.kube.patch_status, namespace, name, status_patch, version
            )
        try:
            children_refused = False
            if children_first:
                results = self.kube.create_all(children_first)
                _note_refusals(children_first, results, memory)
                children_refused = any(r.refused is not None for r in results)
            if status_patch and beside is None:
                self._write_status(key, status_patch, version, memory)
            with_pods = [] if children_first else decided.create_children
            self._write_pods(namespace, decided, memory, not children_refused, with_pods)
        finally:
            try:
                if beside is not None:
                    _remember_status(status_patch, beside.result(), memory)
                if workload is not None:
                    workload.result()
            finally:
                self._record(key, body, decided.events)
        if decided.delete_job:
            self.fence()
            self.kube.delete_job(namespace, name)

    def _write_pods(
        self,
        namespace: str,
        decided: Plan,
        memory: JobMemory,
        create: bool,
        with_pods: list[dict[str, Any]],
    ) -> None:
        """Labels, deletions, then the plan's pods and ``with_pods`` (children created in
        the same batch) — pods only if ``create``."""
        now = time.monotonic()
        if decided.mark_recorded:
            recorded = decided.mark_recorded.items()
            self.kube.label_pods(
                namespace, {pod: {lbl.FAILURE_RECORDED: value} for pod, value in recorded}
            )
        if decided.delete_pods:
            self.fence()
            self.kube.delete_pods(namespace, decided.delete_pods, decided.release)
            memory.expected.deleted.update({pod_name: now for pod_name, _ in decided.delete_pods})
        bodies = [*with_pods, *(decided.create_pods if create else [])]
        if bodies:
            self.fence()
            results = self.kube.create_all(bodies)
            for body, result in zip(bodies, results, strict=True):
                if result.body is not None and body["kind"] == "Pod":
                    memory.expected.created[result.body["metadata"]["name"]] = (
                        now,
                        p.slim(result.body, owned=True),
                    )
            _note_refusals(bodies, results, memory)

    # ------------------------------------------------------------------ the status alone
    def write_condition(
        self, key: Key, body: dict[str, Any], patch: dict[str, Any], event: Event, memory: JobMemory
    ) -> None:
        """A status patch made without a plan (the planner cannot run for the job: it does
        not validate, or its reconcile was refused), written as a plan's status is, then its
        event. Unconditional (no resourceVersion): it sets one condition on top of whatever
        the status holds."""
        self.fence()
        self._write_status(key, patch, None, memory)
        self._record(key, body, [event])

    # ------------------------------------------------------------------ events
    def _record(self, key: Key, body: dict[str, Any], events: list[Event]) -> None:
        """Post ``events`` on the job after those of its earlier plans (see ``recorders``),
        stamped with the time the plan made them."""
        if events:
            lane = self.recorders[hash(key) % len(self.recorders)]
            lane.submit(self._post, body, events, datetime.now(UTC))

    def _post(self, body: dict[str, Any], events: list[Event], at: datetime) -> None:
        for event in events:
            try:
                self.kube.event(body, event.type, event.reason, event.message, at)
            except Exception as error:  # a record lost, never a decision: said, and on
                name = body["metadata"]["name"]
                log.warning("could not record event %s on %s: %s", event.reason, name, error)

    def events_posted(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the events of the plans carried out so far to be
        posted (or given up); True when they were."""
        deadline = time.monotonic() + timeout
        marks = [lane.submit(lambda: None) for lane in self.recorders]
        try:
            for mark in marks:
                mark.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return False
        return True

    def _write_status(
        self, key: Key, patch: dict[str, Any], version: str | None, memory: JobMemory
    ) -> None:
        _remember_status(patch, self.kube.patch_status(*key, patch, version), memory)

    # ------------------------------------------------------------------ Kueue's finalizer
    def release_workload(self, key: Key, body: dict[str, Any]) -> None:
        """Remove Kueue's finalizer from a Workload being deleted, beside the reconciles."""
        released = self.beside.submit(self._release_workload, body)
        released.add_done_callback(_log_failure(f"releasing the Workload of {key[0]}/{key[1]}"))

    def _release_workload(self, body: dict[str, Any]) -> None:
        assert self.queues is not None
        self.fence()
        self.queues.release_finalizer(body)


def _remember_status(patch: dict[str, Any], written: dict[str, Any], memory: JobMemory) -> None:
    """The job as our status write left it (newer than the watch may show yet), and its
    version if the write changed only ``status.goodput`` (its echo is not reconciled)."""
    memory.cache.job = written
    quiet = set(patch) == {"goodput"}
    memory.cache.quiet_write = (resource_version(written) or None) if quiet else None


def _note_refusals(bodies: list[dict[str, Any]], results: list[Any], memory: JobMemory) -> None:
    """Remember the apiserver's refusal (the planner backs off and reports it) or forget it
    once a create went through."""
    refused = [(b, r.refused) for b, r in zip(bodies, results, strict=True) if r.refused]
    if not refused:
        if any(r.body is not None for r in results):
            memory.trouble.refused = None
        return
    body, error = refused[0]
    kind = body["kind"]
    what = "a pod" if kind == "Pod" else f"{kind} {body['metadata']['name']}"
    previous = memory.trouble.refused
    memory.trouble.refused = Refusal(
        code=int(error.status or 0),
        reason=str(error.reason or ""),
        message=api_message(error),
        at=datetime.now(UTC),
        attempts=previous.attempts + 1 if previous is not None else 1,
        what=what,
    )
    log.warning("create refused (%s): %s", error.status, memory.trouble.refused.message)


def _writes_besides_status(decided: Plan) -> bool:
    """Whether a plan writes anything but the job's status (each such write is fenced)."""
    return bool(
        decided.workload_writes
        or decided.patch_children
        or decided.create_children
        or decided.create_pods
        or decided.delete_pods
        or decided.mark_recorded
        or decided.delete_job
    )


def _status_may_go_beside(decided: Plan) -> bool:
    """Whether a plan's status write may run beside its creates instead of before them, and
    its Service be created with its pods: two round trips less before a new job's first pod.
    Not when the plan records a failure, labels or deletes pods: the status must hold a
    failure before anything acts on it. A pod created beside a status write that then fails
    (a conflict) is not lost: our expectations hold it, and the next plan keeps or deletes
    it."""
    return not (
        decided.failures or decided.mark_recorded or decided.delete_pods or decided.delete_job
    )


def _log_failure(what: str) -> Any:
    """A done-callback that says in the log when a write beside the reconciles failed (it is
    tried again at the object's next event)."""

    def report(done: Future[Any]) -> None:
        error = done.exception()
        if error is not None:
            log.warning("%s failed: %s; tried again at its next watch event", what, error)

    return report
