"""The operator's calls to Kueue's API: read a queued job's Workload (and, to create one, its
PriorityClass; to place pods, the ResourceFlavors it was assigned), create it, update its
status, release its finalizer. Only jobs labelled ``kueue.x-k8s.io/queue-name`` cost any of
these calls; the decisions are :mod:`torchkube.operator.queueing`'s."""

from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchkube.api import TrainingJob
from torchkube.operator import metrics, workloads
from torchkube.operator.kube import REQUEST_TIMEOUT
from torchkube.operator.workloads import API_GROUP, API_VERSION, PLURAL, QueueObservation

FLAVORS = "resourceflavors"


class QueueClient:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)

    def observe(self, job: TrainingJob) -> QueueObservation:
        """The job's Workloads (the slices of an elastic one) as Kueue left them; the
        PriorityClass's value while there is one to create. A list answered 404 means the
        apiserver does not serve the Workload API at all (a namespace without Workloads
        lists none): Kueue is not installed."""
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
        priority = None
        name = job.spec.scheduling.priority_class_name
        if name and (not bodies or workloads.elastic(job)):
            try:
                metrics.API_REQUESTS.labels("get", "priorityclass").inc()
                found = self.scheduling.read_priority_class(name, _request_timeout=REQUEST_TIMEOUT)
                priority = int(found.value or 0)
            except ApiException as error:
                if error.status != 404:
                    raise
        return workloads.observe(bodies, priority, wanted)

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
