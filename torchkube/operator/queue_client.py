"""The operator's calls to Kueue's API: read a queued job's Workload (and, to create one, its
priority class; once admitted, the ResourceFlavors it was assigned, to place its pods; while
it waits, its place in line), create it, update its status, release its finalizer. Only jobs
labelled ``kueue.x-k8s.io/queue-name`` cost any of these calls; the decisions are
:mod:`torchkube.operator.queueing`'s."""

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from torchkube.api import TrainingJob
from torchkube.operator import metrics, queueing, workloads
from torchkube.operator.kube import REQUEST_TIMEOUT
from torchkube.operator.workloads import (
    API_GROUP,
    API_VERSION,
    PLURAL,
    Priority,
    QueueObservation,
)

log = logging.getLogger(__name__)

FLAVORS = "resourceflavors"
WORKLOAD_PRIORITY_CLASSES = "workloadpriorityclasses"
POSITIONS_TTL_SECONDS = 2.0
"""How long one LocalQueue's pending-workloads list serves every job waiting in it: a burst
of reconciles of a queue's jobs costs one visibility request, not one per job."""
POSITIONS_FORGET_SECONDS = 60.0
"""A LocalQueue's list nobody asked for this long is dropped (its jobs were admitted or gone)."""
FLAVORS_TTL_SECONDS = 30.0
"""How long one read of a ResourceFlavor serves every reconcile of the jobs admitted on it:
an admitted job's flavours are read before each of its plans (any may create pods), and a
flavour's node labels and tolerations seldom change (pods created this long after a change
get the new ones)."""


@dataclass
class _Pending:
    """One LocalQueue's pending workloads as last read (None: Kueue's visibility API did not
    answer), and the lock that makes the jobs of that queue wait for one read, not send one
    each."""

    read_at: float
    """When it was last read (at first: due now, and not stale)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    summary: dict[str, Any] | None = None


class QueueClient:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._pending_lock = threading.Lock()
        self._flavors: dict[str, tuple[float, dict[str, Any] | None]] = {}
        """ResourceFlavor name → (when read, its body; None: it does not exist)."""
        self._flavors_lock = threading.Lock()
        self._served = False
        """Whether the apiserver has served the Workload API to this client (see
        :meth:`_listed`)."""

    def observe(self, job: TrainingJob, seen_version: str | None = None) -> QueueObservation:
        """The job's Workloads (the slices of an elastic one) as Kueue left them; the
        priority while there is none to create one from; where the followed one waits, its
        place. A list answered 404 means the apiserver does not serve the Workload API at all
        (a namespace without Workloads lists none): Kueue is not installed. A job labelled
        with a prebuilt Workload (a MultiKueue worker's copy) follows that one, by name."""
        bodies = self._listed(job, seen_version)
        if bodies is None:
            return QueueObservation(kueue="not-installed")
        replicas = job.spec.replicas
        wanted = replicas.target + replicas.spares
        priority = Priority() if bodies else self._priority(job)
        observed = workloads.observe(bodies, priority, wanted)
        to_read = queueing.flavors_to_read(job, observed)
        if to_read:
            observed = dataclasses.replace(observed, flavors=self.flavors(to_read))
        state = observed.workload
        if state is None or state.reserved or state.is_true("Finished") or not state.queue:
            return observed
        summary = self._pending_workloads(job.namespace, state.queue)
        if summary is None:
            return observed
        position = workloads.position_of(summary, state.name)
        return dataclasses.replace(observed, position=position, places_served=True)

    def _listed(
        self, job: TrainingJob, seen_version: str | None = None
    ) -> list[dict[str, Any]] | None:
        """The job's Workloads (None: the API is not served). A list that asks for the
        newest waits until the apiserver's watch cache has caught up with etcd (0.04 to 0.1
        s here, every time the job's pods or its admission waited for it), so it asks for
        none older than ``seen_version``, what the Workload's watch last showed, which the
        cache already holds. A job with no status yet has none — no operator has planned
        for it, and a Workload made for it by someone else is named by its label
        (``prebuilt_name``) — so once the API has answered, nothing is listed for it."""
        prebuilt = workloads.prebuilt_name(job)
        if job.status is None and not prebuilt and self._served:
            return []
        by_name = f"metadata.name={prebuilt}" if prebuilt else None
        by_job = None if prebuilt else f"{workloads.JOB_UID_LABEL}={job.uid}"
        metrics.API_REQUESTS.labels("list", "workload").inc()
        try:
            listed: Any = self.custom.list_namespaced_custom_object(
                API_GROUP, API_VERSION, job.namespace, PLURAL,
                field_selector=by_name, label_selector=by_job,
                resource_version=seen_version,
                resource_version_match="NotOlderThan" if seen_version else None,
                _request_timeout=REQUEST_TIMEOUT,
            )  # fmt: skip
        except ApiException as error:
            if error.status != 404:
                raise
            self._served = False
            return None
        self._served = True
        return cast(list[dict[str, Any]], listed["items"])

    def _priority(self, job: TrainingJob) -> Priority:
        """The priority of the job's first Workload, found in jobframework's order
        (:class:`~torchkube.operator.workloads.Priority`). A class named but not found
        gives 0: jobframework would create no Workload, and the job would wait without a
        word; the job's own pods are refused at creation for it, which says why."""
        labelled = job.metadata.get("labels", {}).get(workloads.PRIORITY_CLASS_LABEL)
        name = job.spec.scheduling.priority_class_name
        try:
            if labelled:
                metrics.API_REQUESTS.labels("get", "workloadpriorityclass").inc()
                found: Any = self.custom.get_cluster_custom_object(
                    API_GROUP, API_VERSION, WORKLOAD_PRIORITY_CLASSES, labelled,
                    _request_timeout=REQUEST_TIMEOUT,
                )  # fmt: skip
                return Priority(int(found.get("value") or 0), labelled, "WorkloadPriorityClass")
            if name:
                metrics.API_REQUESTS.labels("get", "priorityclass").inc()
                pc = self.scheduling.read_priority_class(name, _request_timeout=REQUEST_TIMEOUT)
                return Priority(int(pc.value or 0), name)
            metrics.API_REQUESTS.labels("list", "priorityclass").inc()
            listed = self.scheduling.list_priority_class(_request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status != 404:
                raise
            return Priority()
        defaults = [
            (int(pc.value or 0), pc.metadata.name)
            for pc in listed.items
            if pc.global_default and pc.metadata is not None
        ]
        if not defaults:
            return Priority()
        value, default = min(defaults)
        return Priority(value, default)

    def _pending_workloads(self, namespace: str, queue: str) -> dict[str, Any] | None:
        """The LocalQueue's pending workloads from Kueue's visibility API, read at most once
        per ``POSITIONS_TTL_SECONDS`` for all the jobs of that queue. Places are optional:
        any failure (the API not served, not granted, unavailable, or failing) is no place,
        and the job waits as it would without them."""
        key = (namespace, queue)
        with self._pending_lock:
            now = time.monotonic()
            stale = [
                k
                for k, v in self._pending.items()
                if now - v.read_at > POSITIONS_FORGET_SECONDS and not v.lock.locked() and k != key
            ]
            for gone in stale:
                del self._pending[gone]
            entry = self._pending.setdefault(key, _Pending(read_at=now - POSITIONS_TTL_SECONDS))
        with entry.lock:
            if time.monotonic() - entry.read_at < POSITIONS_TTL_SECONDS:
                return entry.summary
            entry.summary = self._read_pending(namespace, queue)
            entry.read_at = time.monotonic()
            return entry.summary

    def _read_pending(self, namespace: str, queue: str) -> dict[str, Any] | None:
        metrics.API_REQUESTS.labels("get", "pendingworkloads").inc()
        path = workloads.pending_workloads_path(namespace, queue)
        try:
            request = self.api_client.param_serialize(
                "GET", path, header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )  # fmt: skip
            response = self.api_client.call_api(*request, _request_timeout=REQUEST_TIMEOUT)
            response.read()
            answer = self.api_client.response_deserialize(response, {"200": "object"})
        except (ApiException, HTTPError, OSError) as error:
            log.debug("no places in line for LocalQueue %s/%s: %s", namespace, queue, error)
            return None
        return cast(dict[str, Any], answer.data)

    def flavors(self, names: set[str]) -> dict[str, dict[str, Any]]:
        """The named ResourceFlavors (a deleted one is left out: its pods get no labels),
        each read at most once per ``FLAVORS_TTL_SECONDS``."""
        found: dict[str, dict[str, Any]] = {}
        for name in sorted(names):
            with self._flavors_lock:
                cached = self._flavors.get(name)
            if cached is None or time.monotonic() - cached[0] >= FLAVORS_TTL_SECONDS:
                cached = (time.monotonic(), self._read_flavor(name))
                with self._flavors_lock:
                    self._flavors[name] = cached
            if cached[1] is not None:
                found[name] = cached[1]
        return found

    def _read_flavor(self, name: str) -> dict[str, Any] | None:
        metrics.API_REQUESTS.labels("get", "resourceflavor").inc()
        try:
            return cast(
                dict[str, Any],
                self.custom.get_cluster_custom_object(
                    API_GROUP, API_VERSION, FLAVORS, name, _request_timeout=REQUEST_TIMEOUT
                ),
            )
        except ApiException as error:
            if error.status != 404:
                raise
            return None

    def write(self, namespace: str, writes: list[tuple[str, dict[str, Any]]]) -> None:
        """Carry out a plan's Workload writes; a conflict on a status update (Kueue wrote the
        Workload meanwhile) propagates, and the job is reconciled again."""
        for verb, body in writes:
            if verb == "create":
                try:
                    metrics.API_REQUESTS.labels("create", "workload").inc()
                    self.custom.create_namespaced_custom_object(
                        API_GROUP, API_VERSION, namespace, PLURAL, body,
                        _request_timeout=REQUEST_TIMEOUT,
                    )  # fmt: skip
                except ApiException as error:
                    if error.status == 404:  # Kueue's API went away: the next job lists
                        self._served = False
                    if error.status != 409:
                        raise
            else:
                metrics.API_REQUESTS.labels("patch", "workload").inc()
                name = body["metadata"]["name"]
                patch = (
                    self.custom.patch_namespaced_custom_object_status
                    if verb == "status"
                    else self.custom.patch_namespaced_custom_object
                )
                patch(
                    API_GROUP, API_VERSION, namespace, PLURAL, name, body,
                    _request_timeout=REQUEST_TIMEOUT,
                )  # fmt: skip

    def release_finalizer(self, workload: dict[str, Any]) -> None:
        """Remove Kueue's resource-in-use finalizer from a Workload being deleted."""
        metadata = workload["metadata"]
        kept = [f for f in metadata.get("finalizers") or [] if f != workloads.FINALIZER]
        patch = {"metadata": {"finalizers": kept, "resourceVersion": metadata["resourceVersion"]}}
        try:
            metrics.API_REQUESTS.labels("patch", "workload").inc()
            self.custom.patch_namespaced_custom_object(
                API_GROUP, API_VERSION, metadata["namespace"], PLURAL, metadata["name"], patch,
                _request_timeout=REQUEST_TIMEOUT,
            )  # fmt: skip
        except ApiException as error:
            if error.status not in (404, 409):
                raise
