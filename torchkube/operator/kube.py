"""The operator's writes to the Kubernetes API: idempotent, counted, and parallel where it pays.

Reads come from kopf's watch caches; only writes go through here. Every call is counted in
``torchkube_api_requests_total`` so a benchmark can check requests per created pod.
"""

import logging
import secrets
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchkube.api.trainingjob import GROUP, KIND, PLURAL, VERSION
from torchkube.operator import metrics

log = logging.getLogger(__name__)
T = TypeVar("T")

_CREATE: dict[str, str] = {
    "Pod": "create_namespaced_pod",
    "Service": "create_namespaced_service",
    "PersistentVolumeClaim": "create_namespaced_persistent_volume_claim",
}


class Kube:
    """Thin, idempotent writes: AlreadyExists on create and NotFound on delete are success."""

    def __init__(self, api_client: client.ApiClient, concurrency: int) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kube")

    def _call(self, verb: str, resource: str, fn: Callable[[], T]) -> T:
        metrics.API_REQUESTS.labels(verb, resource).inc()
        return fn()

    def create(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create a namespaced object; returns it, or None if it already existed."""
        kind, ns = body["kind"], body["metadata"]["namespace"]
        method = getattr(self.core, _CREATE[kind])
        try:
            created = self._call("create", kind.lower(), lambda: method(ns, body))
        except ApiException as error:
            if error.status == 409:
                return None
            raise
        result: dict[str, Any] = self.core.api_client.sanitize_for_serialization(created)
        return result

    def create_all(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        if len(bodies) <= 1:
            return [self.create(body) for body in bodies]
        return list(self.pool.map(self.create, bodies))

    def delete_pod(self, namespace: str, name: str, force: bool) -> None:
        options = client.V1DeleteOptions(grace_period_seconds=0 if force else None)
        try:
            self._call(
                "delete",
                "pod",
                lambda: self.core.delete_namespaced_pod(name, namespace, body=options),
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, bool]]) -> None:
        list(self.pool.map(lambda item: self.delete_pod(namespace, *item), pods))

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        patch = {"metadata": {"labels": labels}}
        try:
            self._call(
                "patch", "pod", lambda: self.core.patch_namespaced_pod(name, namespace, patch)
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status subresource; returns the updated job."""
        result = self._call(
            "patch",
            "trainingjobs/status",
            lambda: self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": status}
            ),
        )
        return dict(result)  # type: ignore[call-overload]

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self._call(
                "delete",
                "trainingjobs",
                lambda: self.custom.delete_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background"
                ),
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def event(self, job: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Record a core/v1 Event on the job, so ``kubectl describe tj`` shows it."""
        meta = job["metadata"]
        now = datetime.now(UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                name=f"{meta['name']}.{secrets.token_hex(8)}", namespace=meta["namespace"]
            ),
            involved_object=client.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}",
                kind=KIND,
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
            ),
            type=type_,
            reason=reason,
            message=message[:1024],
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component="torchkube-operator"),
            reporting_component="torchkube.io/operator",
            reporting_instance="torchkube-operator",
        )
        try:
            self._call(
                "create",
                "event",
                lambda: self.core.create_namespaced_event(meta["namespace"], body),
            )
        except ApiException as error:
            log.warning("could not record event %s on %s: %s", reason, meta["name"], error.reason)
