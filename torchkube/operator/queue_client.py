"""The operator's calls to Kueue's API: read a queued job's Workload (and, to create one, its
PriorityClass; to place pods, the ResourceFlavors it was assigned), create it, update its
status, release its finalizer. Only jobs labelled ``kueue.x-k8s.io/queue-name`` cost any of
these calls; the decisions are :mod:`torchkube.operator.queueing`'s."""

import dataclasses
import threading
import time
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchkube.api import TrainingJob
from torchkube.operator import metrics, workloads
from torchkube.operator.kube import REQUEST_TIMEOUT
from torchkube.operator.workloads import (
    API_GROUP,
    API_VERSION,
    PLURAL,
    Priority,
    QueueObservation,
)

FLAVORS = "resourceflavors"
POSITIONS_TTL_SECONDS = 2.0
"""How long one LocalQueue's pending-workloads list serves every job waiting in it: a burst
of reconciles of a queue's jobs costs one visibility request, not one per job."""
UNSERVED = (403, 404, 503)
"""The visibility API's answers that mean no position (not installed, its
``VisibilityOnDemand`` gate off, its APIService not available, or not granted): the job
waits as before, without one."""


class QueueClient:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)
        self._pending: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}
        self._pending_lock = threading.Lock()

    def observe(self, job: TrainingJob) -> QueueObservation:
        """The job's Workloads (the slices of an elastic one) as Kueue left them; the
        priority while there is one to create; where the followed one waits, its place. A
        list answered 404 means the apiserver does not serve the Workload API at all (a
        namespace without Workloads lists none): Kueue is not installed."""
        metrics.API_REQUESTS.labels("list", "workload").inc()
        try:
            listed: Any = self.custom.list_namespaced_custom_object(
                API_GROUP, API_VERSION, job.namespace, PLURAL,
                label_selector=f"{workloads.JOB_UID_LABEL}={job.uid}",
                _request_timeout=REQUEST_TIMEOUT,
            )  # fmt: skip
        except ApiException as error:
            if error.status != 404:
                raise
            return QueueObservation(kueue="not-installed")
        bodies: list[dict[str, Any]] = listed["items"]
        replicas = job.spec.replicas
        wanted = replicas.target + replicas.spares
        creates = not bodies or workloads.elastic(job)
        priority = self._priority(job.spec.scheduling.priority_class_name) if creates else None
        observed = workloads.observe(bodies, priority, wanted)
        state = observed.workload
        if state is None or state.reserved or state.is_true("Finished") or not state.queue:
            return observed
        summary = self._pending_workloads(job.namespace, state.queue)
        position = workloads.position_of(summary, state.name) if summary else None
        return dataclasses.replace(observed, position=position)

    def _priority(self, name: str | None) -> Priority:
        """The priority a new Workload carries, found as jobframework finds it: the named
        PriorityClass (gone: 0, as the pods could not be created either), else the one the
        cluster marks ``globalDefault`` (as the pods get it), else 0."""
        try:
            if name:
                metrics.API_REQUESTS.labels("get", "priorityclass").inc()
                found = self.scheduling.read_priority_class(name, _request_timeout=REQUEST_TIMEOUT)
                return Priority(int(found.value or 0), name)
            metrics.API_REQUESTS.labels("list", "priorityclass").inc()
            listed = self.scheduling.list_priority_class(_request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status != 404:
                raise
            return Priority()
        default = next((pc for pc in listed.items if pc.global_default and pc.metadata), None)
        if default is None or default.metadata is None:
            return Priority()
        return Priority(int(default.value or 0), default.metadata.name)

    def _pending_workloads(self, namespace: str, queue: str) -> dict[str, Any] | None:
        """The LocalQueue's pending workloads from Kueue's visibility API, shared by the
        jobs of that queue for ``POSITIONS_TTL_SECONDS``; None where the API is not served."""
        key = (namespace, queue)
        with self._pending_lock:
            cached = self._pending.get(key)
            if cached is not None and time.monotonic() - cached[0] < POSITIONS_TTL_SECONDS:
                return cached[1]
        summary: dict[str, Any] | None
        try:
            metrics.API_REQUESTS.labels("get", "pendingworkloads").inc()
            request = self.api_client.param_serialize(
                "GET",
                workloads.pending_workloads_path(namespace, queue),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = self.api_client.call_api(*request, _request_timeout=REQUEST_TIMEOUT)
            response.read()
            answer = self.api_client.response_deserialize(response, {"200": "object"})
            summary = cast(dict[str, Any], answer.data)
        except ApiException as error:
            if error.status not in UNSERVED:
                raise
            summary = None
        with self._pending_lock:
            self._pending[key] = (time.monotonic(), summary)
        return summary

    def flavors(self, names: set[str]) -> dict[str, dict[str, Any]]:
        """The named ResourceFlavors (a deleted one is left out: its pods get no labels)."""
        found: dict[str, dict[str, Any]] = {}
        for name in sorted(names):
            try:
                metrics.API_REQUESTS.labels("get", "resourceflavor").inc()
                found[name] = cast(
                    dict[str, Any],
                    self.custom.get_cluster_custom_object(
                        API_GROUP, API_VERSION, FLAVORS, name, _request_timeout=REQUEST_TIMEOUT
                    ),
                )
            except ApiException as error:
                if error.status != 404:
                    raise
        return found

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
