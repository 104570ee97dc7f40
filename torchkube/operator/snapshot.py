"""What a reconcile observes of a job, before it plans: the watch caches corrected by our own
writes they do not show yet, the trainer's last progress report, and the job's Kueue Workload.

kopf hands over its indexes of jobs, nodes and children, and the pod informer its index of
job pods (:meth:`Snapshot.attach`); nothing here writes, and only the progress poll and the
Workload read leave the process.
"""

import asyncio
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from torchkube.api import TrainingJob
from torchkube.api.times import format_time
from torchkube.operator import pods as p
from torchkube.operator import progress
from torchkube.operator.config import OperatorSettings
from torchkube.operator.decision import Observed
from torchkube.operator.kube import resource_version
from torchkube.operator.memory import JobMemory
from torchkube.operator.queue_client import QueueClient
from torchkube.operator.workloads import QueueObservation
from torchkube.policy.queue import queue_name

Key = tuple[str, str]


class Snapshot:
    def __init__(self, settings: OperatorSettings, queues: QueueClient | None) -> None:
        self.settings = settings
        self.queues = queues
        self.jobs: Mapping[Key, Any] | None = None
        self.pods: Mapping[Key, Any] | None = None
        self.nodes: Mapping[str, Any] | None = None
        self.children: Mapping[Key, Any] | None = None
        self.attached = asyncio.Event()

    def attach(
        self,
        jobs: Mapping[Key, Any],
        pods: Mapping[Key, Any],
        nodes: Mapping[str, Any],
        children: Mapping[Key, Any],
    ) -> None:
        """Hand over the caches: kopf's indexes (live, complete before any handler runs) and
        the pod informer's index (complete once its ``synced`` is set: the controller waits)."""
        if self.jobs is None:
            self.jobs, self.pods, self.nodes, self.children = jobs, pods, nodes, children
            self.attached.set()

    # ------------------------------------------------------------------ the caches
    def job(self, key: Key) -> dict[str, Any] | None:
        """The job under ``key`` as the watch cache shows it (None: none)."""
        cached = (self.jobs or {}).get(key)
        return next(iter(cached), None) if cached is not None else None

    def job_keys(self) -> list[Key]:
        return list(self.jobs or {})

    def jobs_on_node(self, node: str) -> Iterable[Key]:
        for key, store in list((self.pods or {}).items()):
            if any(p.node_name(pod) == node for pod in store):
                yield key

    def job_phases(self) -> dict[tuple[str, str], int]:
        """How many jobs of each namespace are in each phase, as the cache shows them."""
        counts: dict[tuple[str, str], int] = {}
        for (namespace, _), store in list((self.jobs or {}).items()):
            for body in store:
                phase = (body.get("status") or {}).get("phase", "Pending")
                counts[(namespace, phase)] = counts.get((namespace, phase), 0) + 1
        return counts

    def view(
        self, key: Key, job: dict[str, Any], memory: JobMemory
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The job (as cached, :meth:`job`) and its pods, corrected by our own recent
        writes."""
        memory.expected.expire(time.monotonic())
        ours = memory.cache.job
        if ours is not None and resource_version(ours) > resource_version(job):
            job = ours  # our own last write, newer than the watch has shown
        # The cached pods are shared, not copied: the planner only reads them, and a copy
        # would cost every reconcile of a large job time in proportion to all its pods.
        pods = list((self.pods or {}).get(key, []))
        seen = {p.name(pod) for pod in pods}
        # A create the watch has shown is no longer an expectation: were it kept, a pod that
        # was deleted since (kubectl delete, a force delete) would come back from our memory,
        # fill its slot, and get its own replacement deleted as a duplicate.
        expected = memory.expected
        expected.created = {k: v for k, v in expected.created.items() if k not in seen}
        pods += [body for _, body in expected.created.values()]
        deleting = format_time(datetime.now(UTC))
        return job, [
            {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": deleting}}
            if p.name(pod) in expected.deleted and not pod["metadata"].get("deletionTimestamp")
            else pod
            for pod in pods
        ]

    # ------------------------------------------------------------------ beyond the caches
    async def queue(
        self, job: TrainingJob, seen_version: str | None = None
    ) -> QueueObservation | None:
        """The job's Workload (and what comes with it) for a job with a queue-name label, no
        older than the ``seen_version`` its watch showed."""
        if queue_name(job) is None:
            return None
        if self.queues is None:
            return QueueObservation(kueue="disabled")
        return await asyncio.to_thread(self.queues.observe, job, seen_version)

    async def refresh_progress(
        self, job: TrainingJob, pods: list[dict[str, Any]], memory: JobMemory
    ) -> None:
        """Poll the trainer for its progress, at most once per progress interval."""
        now = time.monotonic()
        interval = self.settings.progress_interval_seconds
        if not job.spec.metrics.enabled or now - memory.cache.progress_at < interval:
            return
        memory.cache.progress_at = now
        report, responder = await asyncio.to_thread(
            progress.read_progress,
            self.settings.progress_url,
            [pod for pod in pods if p.owned_by(pod, job.uid)],
            job.spec.metrics.port,
            memory.cache.progress_pod,
        )
        if report is not None:
            memory.cache.progress, memory.cache.progress_pod = report, responder

    # ------------------------------------------------------------------ for the planner
    def observed(
        self,
        key: Key,
        job: TrainingJob,
        pods: list[dict[str, Any]],
        memory: JobMemory,
        queue: QueueObservation | None,
    ) -> Observed:
        """All the planner sees: the snapshot, and what this process remembers of the job."""
        expected = memory.expected
        return Observed(
            job=job,
            pods=pods,
            nodes={name: next(iter(store)) for name, store in list((self.nodes or {}).items())},
            now=datetime.now(UTC),
            progress=memory.cache.progress,
            self_deleted=frozenset(expected.deleted),
            children=list((self.children or {}).get(key, [])),
            refused=memory.trouble.refused,
            vanished=p.vanished(expected.live, pods, expected.deleted),
            queue=queue,
            forbidden=memory.trouble.forbidden,
            goodput=memory.accounting.goodput,
            status_written=memory.accounting.status_written,
            progress_polled=bool(self.settings.progress_url),
        )
