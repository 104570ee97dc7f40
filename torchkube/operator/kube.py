"""The operator's writes to the Kubernetes API: idempotent, counted, bounded in time, and
parallel where it pays.

Reads come from kopf's watch caches; only writes go through here. Every call is counted in
``torchkube_api_requests_total`` so a benchmark can check requests per created pod, and every
call has a timeout: a hung connection must cost a retry, never a stuck worker.
"""

import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchkube.api import labels as lbl
from torchkube.api.trainingjob import GROUP, KIND, PLURAL, VERSION
from torchkube.operator import metrics

log = logging.getLogger(__name__)

_COLLECTION: dict[str, str] = {
    "Pod": "/api/v1/namespaces/{namespace}/pods",
    "Service": "/api/v1/namespaces/{namespace}/services",
    "PersistentVolumeClaim": "/api/v1/namespaces/{namespace}/persistentvolumeclaims",
}
"""Where each kind the operator creates is posted."""
_PATCH: dict[str, str] = {
    "Service": "patch_namespaced_service",
    "PersistentVolumeClaim": "patch_namespaced_persistent_volume_claim",
}

REQUEST_TIMEOUT = (5.0, 30.0)
"""(connect, read) seconds for every request."""

EVENT_CACHE_SIZE = 4096
"""Events remembered for aggregation (a repeat bumps ``count`` instead of a new object)."""
EVENT_RETRY_DELAYS = (0.2, 1.0)
"""Seconds before each retry of an event the apiserver refused for the moment (429, 5xx):
a failure's event is sent for the plan that records it, or never (the next plan finds the
failure recorded and says nothing of it)."""


def resource_version(body: Mapping[str, Any] | None) -> int:
    """An object's resourceVersion as a number (0: none), to tell which of two reads of it is
    newer."""
    try:
        return int((body or {}).get("metadata", {}).get("resourceVersion", 0))
    except ValueError:
        return 0


def api_message(error: ApiException) -> str:
    """The apiserver's own sentence from a refusal (its Status object's message)."""
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.body or error.reason)


@dataclass(frozen=True)
class CreateResult:
    """What became of one create: the object, or why the apiserver refused it."""

    body: dict[str, Any] | None = None
    existed: bool = False
    refused: ApiException | None = None


@dataclass
class _RecordedEvent:
    name: str
    count: int


class Kube:
    """Thin, idempotent writes: AlreadyExists on create and NotFound on delete are success."""

    def __init__(self, api_client: client.ApiClient, concurrency: int) -> None:
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kube")
        self._events: OrderedDict[tuple[str, ...], _RecordedEvent] = OrderedDict()
        self._events_lock = threading.Lock()

    def _call(
        self, verb: str, resource: str, method: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        """Send one request, counted and bounded in time; the response's JSON as a dict.

        The response is parsed as plain JSON instead of the client's model objects: the
        operator only ever wants the dict, and building a V1Pod to turn it back into one costs
        more CPU than the rest of a pod's create (docs/benchmarks.md); by orjson, like the pod
        watch's events (``informer.follow``)."""
        metrics.API_REQUESTS.labels(verb, resource).inc()
        response = method(*args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs)
        data = response.data  # read in full, so the connection goes back to the pool
        return orjson.loads(data) if data else {}

    def create(self, body: dict[str, Any]) -> CreateResult:
        """Create a namespaced object; a conflict means it exists already, any other 4xx is a
        refusal the caller reports (quota, admission, an invalid spec)."""
        kind, ns = body["kind"], body["metadata"]["namespace"]
        try:
            created = self._call("create", kind.lower(), self._post, _COLLECTION[kind], ns, body)
        except ApiException as error:
            if error.status == 409:
                return CreateResult(existed=True)
            if error.status is not None and 400 <= error.status < 500 and error.status != 429:
                return CreateResult(refused=error)
            raise
        return CreateResult(body=created)

    def _post(
        self, collection: str, namespace: str, body: dict[str, Any], _request_timeout: Any, **_: Any
    ) -> Any:
        """POST ``body`` as it is, for :meth:`_call` (which counts it, bounds it in time and
        parses the answer). The client's generated create methods validate a dict into its
        model objects and dump them back before sending: half of a pod create's CPU in the
        operator, for a body that is already the JSON it sends
        (tests/unit/test_kube_creates.py). Nor does the body pass the client's sanitizer,
        which copies it key by key to turn model objects into JSON. Answers like theirs with
        ``_preload_content`` off: the raw response, or an ApiException for a refusal."""
        method, url, headers, _no_body, form = self.api.param_serialize(
            method="POST",
            resource_path=collection,
            path_params={"namespace": namespace},
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(
            method, url, headers, body, form, _request_timeout=_request_timeout
        )
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response

    def create_all(self, bodies: list[dict[str, Any]]) -> list[CreateResult]:
        if len(bodies) <= 1:
            return [self.create(body) for body in bodies]
        return list(self.pool.map(self.create, bodies))

    def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._call("patch", kind.lower(), getattr(self.core, _PATCH[kind]), name, namespace, patch)

    def delete_pod(self, namespace: str, name: str, force: bool, why: str | None = None) -> None:
        """Delete a pod; ``why`` labels it first (see ``labels.RELEASED``)."""
        options = client.V1DeleteOptions(grace_period_seconds=0 if force else None)
        try:
            if why:
                self.label_pod(namespace, name, {lbl.RELEASED: why}, missing_ok=False)
            delete = self.core.delete_namespaced_pod
            self._call("delete", "pod", delete, name, namespace, body=options)
        except ApiException as error:
            if error.status != 404:
                raise

    def delete_pods(
        self, namespace: str, pods: Iterable[tuple[str, bool]], why: dict[str, str]
    ) -> None:
        list(
            self.pool.map(
                lambda item: self.delete_pod(namespace, item[0], item[1], why.get(item[0])), pods
            )
        )

    def label_pod(
        self, namespace: str, name: str, labels: dict[str, str], missing_ok: bool = True
    ) -> None:
        patch = {"metadata": {"labels": labels}}
        try:
            self._call("patch", "pod", self.core.patch_namespaced_pod, name, namespace, patch)
        except ApiException as error:
            if error.status != 404 or not missing_ok:
                raise

    def label_pods(self, namespace: str, labels: dict[str, dict[str, str]]) -> None:
        list(self.pool.map(lambda item: self.label_pod(namespace, *item), labels.items()))

    def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        """Merge-patch the status subresource (``status``: a merge patch, see
        ``status.merge_patch``); returns the updated job.

        With ``resource_version`` the patch applies only to that version of the job (409
        otherwise): an operator that lost its Lease without knowing cannot overwrite what the
        new leader wrote."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self._call(
            "patch",
            "trainingjobs/status",
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            body,
        )

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job as the apiserver has it now (None: there is none)."""
        try:
            return self._call(
                "get",
                "trainingjobs",
                self.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
            )
        except ApiException as error:
            if error.status != 404:
                raise
            return None

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self._call(
                "delete",
                "trainingjobs",
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                propagation_policy="Background",
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def event(
        self,
        job: dict[str, Any],
        type_: str,
        reason: str,
        message: str,
        at: datetime | None = None,
    ) -> None:
        """Record a core/v1 Event on the job, so ``kubectl describe tj`` shows it, as of
        ``at`` (default: now).

        A repeat of an event this process recorded (same job, type, reason and message) bumps
        its ``count`` and ``lastTimestamp``, as the kubelet's recorder does, instead of adding
        one more object per repeat."""
        meta = job["metadata"]
        message = message[:1024]
        key = (str(meta.get("uid")), meta["namespace"], type_, reason, message)
        now = at or datetime.now(UTC)
        with self._events_lock:
            known = self._events.get(key)
            if known is not None:
                known.count += 1
                self._events.move_to_end(key)
        for delay in (*EVENT_RETRY_DELAYS, None):
            try:
                if known is not None and self._bump_event(meta["namespace"], known, now):
                    return
                name = f"{meta['name']}.{secrets.token_hex(8)}"
                self._create_event(job, name, type_, reason, message, now)
                with self._events_lock:
                    self._events[key] = _RecordedEvent(name, 1)
                    while len(self._events) > EVENT_CACHE_SIZE:
                        self._events.popitem(last=False)
                return
            except ApiException as error:
                transient = error.status == 429 or (error.status or 0) >= 500
                if delay is None or not transient:
                    log.warning(
                        "could not record event %s on %s: %s", reason, meta["name"], error.reason
                    )
                    return
                time.sleep(delay)
            except (urllib3.exceptions.HTTPError, OSError) as error:  # a record, not a step
                log.warning("could not record event %s on %s: %s", reason, meta["name"], error)
                return

    def _bump_event(self, namespace: str, known: _RecordedEvent, now: datetime) -> bool:
        patch = {"count": known.count, "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
        try:
            bump = self.core.patch_namespaced_event
            self._call("patch", "event", bump, known.name, namespace, patch)
        except ApiException as error:
            if error.status == 404:  # expired (events live an hour): start a new one
                return False
            raise
        return True

    def _create_event(
        self,
        job: dict[str, Any],
        name: str,
        type_: str,
        reason: str,
        message: str,
        now: datetime,
    ) -> None:
        meta = job["metadata"]
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=name, namespace=meta["namespace"]),
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
            message=message,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component="torchkube-operator"),
            reporting_component="torchkube.io/operator",
            reporting_instance="torchkube-operator",
        )
        self._call("create", "event", self.core.create_namespaced_event, meta["namespace"], body)
