"""A work queue over TrainingJob keys, fed by watch events, drained by a few workers.

kopf (and, for pods, :mod:`torchkube.operator.informer`) supplies the watches and caches;
this module supplies controller-runtime's habits that kopf leaves to us: one reconcile per
key at a time, coalesced wake-ups, one pending delayed requeue per key (the earliest wins),
and *expectations* — our own writes are folded into the cached view until the watch catches
up, so a reconcile right after creating pods never creates them twice.

One reconcile reads top to bottom in :meth:`Controller.reconcile`: the snapshot (the caches
corrected by our own writes, the trainer's progress, the job's Workload), the plan
(:func:`~torchkube.operator.planner.plan`, pure), its execution
(:class:`~torchkube.operator.executor.Executor`, every write fenced), and what is remembered
for the next one (:class:`~torchkube.operator.memory.JobMemory`). Everything here runs on the
event loop except the executor's writes, which block on the API in a thread.
"""

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from torchkube.api import TrainingJob
from torchkube.api.errors import describe
from torchkube.operator import metrics, queueing, refusals
from torchkube.operator import pods as p
from torchkube.operator import status as st
from torchkube.operator.config import OperatorSettings
from torchkube.operator.executor import Executor
from torchkube.operator.kube import Kube, api_message, resource_version
from torchkube.operator.leader import LeaderElection, LostLeadership
from torchkube.operator.memory import JobMemory
from torchkube.operator.planner import Plan, plan
from torchkube.operator.queue_client import QueueClient
from torchkube.operator.snapshot import Snapshot

log = logging.getLogger(__name__)
Key = tuple[str, str]
RETRY_SECONDS = 5.0
CONFLICT_RETRY_SECONDS = 0.5
RECONCILE_SHARE = 0.25
MIN_RECONCILE_SPACING = 0.05
"""A job's next reconcile starts no sooner than this after its last one ended, and its
planning (the CPU part: every pod of the job walked) takes at most ``RECONCILE_SHARE`` of its
time: while 512 workers start, back-to-back reconciles, one per batch of pod events, would
otherwise keep a core busy. Events that arrive meanwhile are served by the next one together.
Waiting for the API (creating 512 pods) does not count: it costs the operator no CPU."""
CALM_SPACING = 0.25
"""A job woken only by its pods' progress (created, bound, started, ready:
:func:`~torchkube.operator.pods.progress_only`) is reconciled no sooner than this after its
last reconcile ended. Such changes move only its status on (how many workers run), yet while
64 workers start they come every few milliseconds, and at ``MIN_RECONCILE_SPACING`` a
reconcile walked every pod 20 times a second, on the cores the API server and the scheduler
start those pods with. The status (phase, counts, conditions) follows the pods this much
later at most, beyond the reconcile's own time; start-up and recovery are timed to when the
watch saw the pods run (``pods.RUNNING_SEEN``), not to that reconcile. A pod that ended or
went, the job's own changes and its nodes' still wake it after the short spacing, Kueue's
at once."""


class Controller:
    def __init__(
        self,
        settings: OperatorSettings,
        kube: Kube,
        leader: LeaderElection | None = None,
        queues: QueueClient | None = None,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.leader = leader
        self.queues = queues
        """Kueue's API, for jobs with a queue-name label (None: the Kueue integration is off,
        ``kueue_enabled`` false, and such a job runs as one without a queue)."""
        self.snapshot = Snapshot(settings, queues)
        self.queue: asyncio.Queue[Key] = asyncio.Queue()
        self.queued: set[Key] = set()
        self.active: set[Key] = set()
        self.dirty: set[Key] = set()
        self.news: set[Key] = set()
        """Dirty keys woken by more than their pods' progress (see ``CALM_SPACING``)."""
        self.job_versions_seen: dict[Key, int] = {}
        """The last version of a job its watch showed while the job was being reconciled: an
        echo of that reconcile's own write is only known as one when its write returns."""
        self.timers: dict[Key, asyncio.TimerHandle] = {}
        self.calm_timers: set[Key] = set()
        """Keys whose pending timer only their pods' progress armed: when it fires, the wake
        is still progress alone (``CALM_SPACING``)."""
        self.not_before: dict[Key, float] = {}
        """Loop time before which a job is not reconciled again (see ``RECONCILE_SHARE``)."""
        self.calm_after: dict[Key, float] = {}
        """Loop time before which its pods' progress alone does not (``CALM_SPACING``)."""
        self.unspaced: set[Key] = set()
        """Jobs whose next reconcile skips the spacing: an event that unblocks them came."""
        self.workload_versions: dict[Key, int] = {}
        """The resourceVersion of each job's Workload as its watch last showed it: the list
        of its Workloads asks for no older (see ``QueueClient.observe``)."""
        self.memory: dict[Key, JobMemory] = {}
        self.executor = Executor(kube, queues, leader, lambda: self.acting, settings.workers)
        self.stopping = False
        if leader is not None:
            leader.on_stopped_leading.append(self._stepped_down)

    @property
    def acting(self) -> bool:
        """Whether this replica reconciles (and exports job metrics): it holds the Lease, and
        is not shutting down."""
        return not self.stopping and (self.leader is None or self.leader.leading.is_set())

    async def stop(self, timeout: float) -> None:
        """Stop acting, and wait up to ``timeout`` for the plans being carried out to end
        and their events to be posted.

        No write batch starts from now on (each is fenced), and a plan under way stops at
        its next fenced step. A plan still blocked in an API call after the timeout is left to
        the process's exit: the status is written before the pods change, so a cut batch is
        one the next leader re-plans, as after a crash."""
        self.stopping = True
        deadline = time.monotonic() + timeout
        while self.executor.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.executor.in_flight:
            log.warning("stopping with %d plans still waiting for the API", self.executor.in_flight)
            return
        left = max(0.0, deadline - time.monotonic())
        if not await asyncio.to_thread(self.executor.events_posted, left):
            log.warning("stopping with events of the last plans not yet posted")

    def _stepped_down(self) -> None:
        """Forget what this replica did as the leader: the new leader acts now, so our
        expectations, progress and goodput accumulators would be stale should the lead come
        back (it starts from the cluster's state, as a new process does), and our job
        metrics would stand beside the new leader's."""
        self.memory.clear()
        metrics.forget_jobs()

    def attach(
        self,
        jobs: Mapping[Key, Any],
        pods: Mapping[Key, Any],
        nodes: Mapping[str, Any],
        children: Mapping[Key, Any],
    ) -> None:
        self.snapshot.attach(jobs, pods, nodes, children)

    # ------------------------------------------------------------------ the queue
    def enqueue(
        self, key: Key, delay: float = 0.0, spaced: bool = True, progress_only: bool = False
    ) -> None:
        """Reconcile ``key`` now (or as soon as its spacing allows), or after ``delay`` seconds.
        Delayed requeues of one key are deduplicated: a single timer per key, and an earlier
        one wins over a later one, so a burst of events cannot multiply the reconcile rate.
        An event that is not ``spaced`` skips the spacing (see :meth:`workload_changed`); one
        that is ``progress_only`` waits out the longer ``CALM_SPACING``."""
        loop = asyncio.get_running_loop()
        if not spaced:
            self.unspaced.add(key)
        now = loop.time()
        when = now + delay
        if key not in self.unspaced:
            spacing = self.calm_after if progress_only else self.not_before
            when = max(when, spacing.get(key, 0.0))
        if when > now:
            pending = self.timers.get(key)
            if pending is not None and not pending.cancelled() and pending.when() <= when:
                return
            if pending is not None:
                pending.cancel()
            self.timers[key] = loop.call_at(when, self._timer_fired, key)
            if progress_only:
                self.calm_timers.add(key)
            else:
                self.calm_timers.discard(key)
            return
        if key in self.active:
            self.dirty.add(key)
            if not progress_only:
                self.news.add(key)
        elif key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    def pods_changed(self, key: Key, progress_only: bool) -> None:
        """The pod watch showed ``key``'s pods changed; ``progress_only``: they only moved on
        (see ``CALM_SPACING``)."""
        self.enqueue(key, progress_only=progress_only)

    def job_changed(self, key: Key, body: Mapping[str, Any]) -> None:
        """Reconcile a job its watch shows changed — unless the change is the echo of our own
        write of ``status.goodput`` alone. No decision reads that field and the write's own
        reconcile planned on everything else, so the echo's reconcile would change nothing,
        yet come for every quiet job every ``GOODPUT_MIN_INTERVAL``. An event during the job's
        reconcile (the echo may come before the write's response) is decided when the
        reconcile ends."""
        version = resource_version(body)
        if key in self.active:
            self.job_versions_seen[key] = version
        elif not self._echo_of_quiet_write(key, version):
            self.enqueue(key)

    def _memory_of(self, key: Key, body: dict[str, Any] | None) -> JobMemory:
        """The memory of ``body``, the job cached under ``key`` now: a namesake created
        after a delete this process has not reconciled yet gets none of the old job's."""
        uid = (body or {}).get("metadata", {}).get("uid")
        memory = self.memory.get(key)
        if memory is None or (uid is not None and memory.uid != uid):
            if memory is not None:
                metrics.job_gone(*key)
            memory = self.memory[key] = JobMemory(uid=uid)
        return memory

    def _echo_of_quiet_write(self, key: Key, version: int) -> bool:
        memory = self.memory.get(key)
        return memory is not None and version == memory.cache.quiet_write

    def workload_changed(self, body: Mapping[str, Any]) -> None:
        """Wake the job whose Kueue Workload changed (admitted, evicted) at once, not after
        the job's spacing: the spacing gathers bursts of pod events into one reconcile, and a
        Workload changes a few times in a job's life, each time the one thing its pods wait
        for. Release Kueue's finalizer from one being deleted."""
        key = queueing.job_key_of(dict(body))
        if key is None:
            return
        version = resource_version(dict(body))
        if version > self.workload_versions.get(key, 0):
            self.workload_versions[key] = version
        self.enqueue(key, spaced=False)
        if self.acting and self.queues is not None and queueing.finalizer_to_remove(dict(body)):
            self.executor.release_workload(key, dict(body))

    def _timer_fired(self, key: Key) -> None:
        self.timers.pop(key, None)
        progress_only = key in self.calm_timers
        self.calm_timers.discard(key)
        self.enqueue(key, progress_only=progress_only)

    def _cancel_timer(self, key: Key) -> None:
        timer = self.timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self.calm_timers.discard(key)

    def enqueue_all(self) -> None:
        for key in self.snapshot.job_keys():
            self.enqueue(key)

    async def run(self, *caches_filled: asyncio.Event) -> None:
        """Reconcile queued jobs once kopf's indexes are attached and every other cache
        (the pod informer's) holds its full list: a reconcile on a partial view would
        recreate pods that exist."""
        await self.snapshot.attached.wait()
        for filled in caches_filled:
            await filled.wait()
        workers = [asyncio.create_task(self._worker()) for _ in range(self.settings.workers)]
        try:
            while True:
                await asyncio.sleep(self.settings.resync_seconds)
                if self.acting:
                    self.enqueue_all()
        finally:
            for task in workers:
                task.cancel()

    async def _worker(self) -> None:
        while True:
            if self.leader is not None:
                await self.leader.leading.wait()  # standbys keep their caches warm, no more
            key = await self.queue.get()
            self.queued.discard(key)
            self.unspaced.discard(key)
            # This reconcile serves whatever a pending timer waited for: each reconcile asks
            # for its own delayed requeue again (a plan's, a retry), and a calm timer left
            # over would bring a second reconcile with nothing new.
            self._cancel_timer(key)
            if self.leader is not None and not self.leader.leading.is_set():
                self.enqueue(key)  # lost the lease while waiting: keep it for the next leader
                continue
            self.active.add(key)
            loop = asyncio.get_running_loop()
            try:
                await self.reconcile(key)
            except LostLeadership:
                self.enqueue(key)
            except ApiException as error:
                if error.status == 409:  # the job changed since the cache saw it: re-read
                    self.enqueue(key, delay=CONFLICT_RETRY_SECONDS)
                elif error.status == 403:
                    metrics.RECONCILE_ERRORS.inc()
                    try:
                        await asyncio.to_thread(self._report_forbidden, key, error)
                    except LostLeadership:  # its fenced write found the Lease gone
                        self.enqueue(key)  # kept for the next leader, as above
                    else:
                        self.enqueue(key, delay=RETRY_SECONDS)
                elif error.status == 404 and await asyncio.to_thread(self._replaced, key):
                    log.info("%s/%s was deleted while it was planned for; read again", *key)
                    self.enqueue(key, delay=CONFLICT_RETRY_SECONDS)
                else:
                    metrics.RECONCILE_ERRORS.inc()
                    log.warning("reconcile of %s/%s failed: %s; retrying", *key, error.reason)
                    self.enqueue(key, delay=RETRY_SECONDS)
            except Exception:
                metrics.RECONCILE_ERRORS.inc()
                log.exception("reconcile of %s/%s failed; retrying in 5 s", *key)
                self.enqueue(key, delay=RETRY_SECONDS)
            finally:
                self.active.discard(key)
                memory = self.memory.get(key)
                if memory is not None:  # the job still exists
                    thought = memory.planning_seconds
                    spacing = max(MIN_RECONCILE_SPACING, thought / RECONCILE_SHARE - thought)
                    ended = loop.time()
                    self.not_before[key] = ended + spacing
                    self.calm_after[key] = ended + max(spacing, CALM_SPACING)
                changed = key in self.job_versions_seen and not self._echo_of_quiet_write(
                    key, self.job_versions_seen.pop(key)
                )
                if key in self.dirty or changed:
                    progress_only = not changed and key not in self.news
                    self.dirty.discard(key)
                    self.news.discard(key)
                    self.enqueue(key, progress_only=progress_only)

    # ------------------------------------------------------------------ reconciling
    async def reconcile(self, key: Key) -> None:
        """Observe the job (:class:`Snapshot`), plan (pure), carry the plan out (in a
        thread), remember what the next reconcile needs, and requeue when the plan asks."""
        cached = self.snapshot.job(key)
        if cached is None:
            self._forget(key)
            return
        memory = self._memory_of(key, cached)
        body, pods = self.snapshot.view(key, cached, memory)
        started = time.perf_counter()
        try:
            job = TrainingJob.model_validate(body)
        except ValidationError as error:
            await asyncio.to_thread(self._report_invalid, key, body, error, memory)
            return
        memory.trouble.invalid = None
        seen = self.workload_versions.get(key)
        queue = await self.snapshot.queue(job, str(seen) if seen else None)
        await self.snapshot.refresh_progress(job, pods, memory)
        thinking = time.perf_counter()
        observed = self.snapshot.observed(key, job, pods, memory, queue)
        unseen = set(memory.expected.created)
        decided = plan(observed)
        memory.accounting.goodput = decided.goodput
        memory.accounting.status_written = decided.status_written
        planned = st.to_wire(decided.status)
        memory.planning_seconds = time.perf_counter() - thinking
        await asyncio.to_thread(self.executor.execute, key, body, decided, planned, memory)
        memory.expected.live = p.live_workers(pods, unseen | set(memory.expected.deleted))
        if self.acting and self.memory.get(key) is memory:
            # Not after a step-down (which forgot every job and its series), even if the lead
            # came back meanwhile: series of a memory no longer ours would outlive the job.
            metrics.job_planned(job, decided, memory.accounting)
        metrics.RECONCILE.observe(time.perf_counter() - started)
        delay = decided.requeue_after
        if memory.trouble.forbidden is not None:  # allowed again: the next plan clears it
            memory.trouble.forbidden = None
            delay = 0.0
        if self._polls_progress(job, decided):
            interval = self.settings.progress_interval_seconds
            delay = interval if delay is None else min(delay, interval)
        if delay is not None:
            self.enqueue(key, delay=delay)

    def _forget(self, key: Key) -> None:
        """A deleted job: its memory, timers and metric series go. Its pods' events still
        wake it while they are deleted (hundreds for a large job), each time on the event
        loop: only the first finds anything to drop (series exist only for a job with
        memory, :meth:`reconcile` exports them)."""
        self.not_before.pop(key, None)
        self.calm_after.pop(key, None)
        self.workload_versions.pop(key, None)
        self._cancel_timer(key)
        if self.memory.pop(key, None) is not None:
            metrics.job_gone(*key)

    def _polls_progress(self, job: TrainingJob, decided: Plan) -> bool:
        """Running jobs are revisited every progress interval so their status stays fresh
        (not one whose status is copied from where it runs)."""
        return bool(
            self.settings.progress_url
            and not decided.keep_status
            and job.spec.metrics.enabled
            and decided.status.phase in ("Running", "Restarting")
        )

    def _report_invalid(
        self, key: Key, body: dict[str, Any], error: ValidationError, memory: JobMemory
    ) -> None:
        """A job the model refuses: said on the job once (``refusals.invalid``), instead of
        only in the operator's log."""
        text = describe(error, prefix="")
        if memory.trouble.invalid == text:
            return
        memory.trouble.invalid = text
        log.error("%s/%s is invalid:\n%s", *key, text)
        patch, event = refusals.invalid(body, text, datetime.now(UTC))
        self.executor.write_condition(key, body, patch, event, memory)

    def _replaced(self, key: Key) -> bool:
        """Whether the job a reconcile worked on is gone (deleted, or deleted and created
        again under its name) since the cache showed it: then a 404 for it (its status
        write) is no failure, only nothing left to write."""
        memory = self.memory.get(key)
        now = self.kube.read_job(*key)
        return now is None or memory is None or now["metadata"].get("uid") != memory.uid

    def _report_forbidden(self, key: Key, error: ApiException) -> None:
        """A request this job's reconcile needs was refused (403: the operator's RBAC lacks
        a right). Said on the job at once (``refusals.forbidden``) when the refusal is new:
        the plan that would say it may be what fails."""
        memory = self._memory_of(key, self.snapshot.job(key))
        text = api_message(error)
        log.warning("reconcile of %s/%s refused: %s; retrying", *key, text)
        if memory.trouble.forbidden == text:
            return
        memory.trouble.forbidden = text
        body = self.snapshot.job(key)
        if body is None:
            return
        patch, event = refusals.forbidden(body, text, datetime.now(UTC))
        try:
            self.executor.write_condition(key, body, patch, event, memory)
        except ApiException as refused:  # the status itself is not ours to write: log only
            log.error("cannot write the status of %s/%s: %s", *key, api_message(refused))

    def publish_phases(self) -> None:
        """``torchkube_jobs`` from the cache, by the leader only (see ``metrics``)."""
        metrics.JOBS.clear()
        if not self.acting:
            return
        for (namespace, phase), count in self.snapshot.job_phases().items():
            metrics.JOBS.labels(namespace, phase).set(count)
