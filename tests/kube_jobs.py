"""TrainingJobs under test in a real cluster: the one manifest builder and the one handle the
integration and end-to-end tests share."""

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from training_jobs import manifest

from testbed.kwok import POOL_LABEL, NodePool, kwok_toleration
from testbed.volumes import prebound_volume
from testbed.wait import wait_for
from torchkube.api import GROUP, PLURAL, VERSION
from torchkube.api import labels as lbl


def job_manifest(name: str, pools: NodePool | Sequence[NodePool], **spec: Any) -> dict[str, Any]:
    """A TrainingJob whose workers take a whole KWOK node each (8 GPUs) of ``pools``.

    ``spec`` fields replace the defaults; a ``scheduling`` given is merged over the KWOK
    toleration and pool selection, and the store is kept to the workers' nodes (its own
    ``rendezvous.store`` placement) unless one is given."""
    chosen = [pools] if isinstance(pools, NodePool) else list(pools)
    placement: dict[str, Any] = {}
    if len(chosen) == 1:
        placement["nodeSelector"] = {POOL_LABEL: chosen[0].name}
    else:
        names = [pool.name for pool in chosen]
        term = {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": names}]}
        placement["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    scheduling = {"tolerations": [kwok_toleration()], **placement, **spec.get("scheduling", {})}
    rendezvous = spec.get("rendezvous", {})
    kept = {key: scheduling[key] for key in ("nodeSelector", "affinity") if scheduling.get(key)}
    store = {**kept, **rendezvous.get("store", {})}
    placed = {"rendezvous": {**rendezvous, "store": store}, "scheduling": scheduling}
    return manifest(name, {"resources": {"gpus": 8}, **spec, **placed})


class Job:
    """A TrainingJob under test, with the reads the assertions need."""

    def __init__(self, api: Any, namespace: str, name: str) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace, self.name = namespace, name

    @classmethod
    def create(cls, api: Any, namespace: str, body: dict[str, Any]) -> "Job":
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body
        )
        return cls(api, namespace, body["metadata"]["name"])

    def get(self) -> dict[str, Any]:
        body: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name
        )
        return body

    def get_or_none(self) -> dict[str, Any] | None:
        """The job, or None once it is gone."""
        try:
            return self.get()
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def status(self) -> dict[str, Any]:
        return dict((self.get_or_none() or {}).get("status") or {})

    def patch(self, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name, {"spec": spec}
        )

    def delete(self, timeout: float = 120) -> None:
        """Delete the job and wait until every pod it had is gone (their GPUs free again)."""
        self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name, propagation_policy="Background"
        )
        selector = f"{lbl.JOB_NAME}={self.name}"

        def gone() -> bool:
            return not self.core.list_namespaced_pod(self.namespace, label_selector=selector).items

        self.wait(gone, timeout, "its pods to be gone")

    def pods(self, role: str = "worker") -> list[Any]:
        selector = f"{lbl.JOB_NAME}={self.name},{lbl.ROLE}={role}"
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def live_workers(self) -> list[Any]:
        """Workers that are or will be running (failed ones stay around for diagnosis)."""
        return [
            p
            for p in self.pods()
            if p.status.phase in ("Pending", "Running") and p.metadata.deletion_timestamp is None
        ]

    def replacements(self, slot: int, victim: str) -> list[Any]:
        """Live workers in ``slot`` other than ``victim``: what replaced it."""
        return [
            p
            for p in self.live_workers()
            if p.metadata.labels[lbl.REPLICA_INDEX] == str(slot) and p.metadata.name != victim
        ]

    def running_workers(self) -> list[Any]:
        return [p for p in self.live_workers() if p.status.phase == "Running"]

    def events(self) -> list[Any]:
        selector = f"involvedObject.name={self.name},involvedObject.kind=TrainingJob"
        return list(self.core.list_namespaced_event(self.namespace, field_selector=selector).items)

    def wait_event(self, reason: str, timeout: float = 15, containing: str = "") -> list[Any]:
        """The job's events of ``reason`` (whose message holds ``containing``), waited for: the
        operator sends a plan's events after its status and pod writes, so a test that saw the
        status or the pods may look a moment before the event is there."""
        return self.wait(
            lambda: [
                e for e in self.events() if e.reason == reason and containing in (e.message or "")
            ],
            timeout,
            f"a {reason} event" + (f" naming {containing}" if containing else ""),
        )

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        return wait_for(
            predicate,
            timeout,
            what=f"{what} ({self.namespace}/{self.name})",
            describe_last=lambda: (
                f"status={self.status()} pods="
                f"{[(p.metadata.name, p.status.phase, p.spec.node_name) for p in self.pods()]}"
            ),
        )

    def wait_running(self, count: int, timeout: float = 60) -> list[Any]:
        def ready() -> list[Any] | None:
            running = self.running_workers()
            if (
                len(running) == count
                and len(self.live_workers()) == count
                and self.status().get("phase") == "Running"
            ):
                return running
            return None

        result: list[Any] = self.wait(ready, timeout, f"{count} running workers")
        return result


class JobMaker:
    """Creates a test's jobs, each with its checkpoint claim bound to a prebound volume under
    ``folder``; ``volumes`` are what the test leaves to delete."""

    def __init__(self, api: Any, namespace: str, folder: Path) -> None:
        self.api, self.namespace, self.folder = api, namespace, folder
        self.volumes: list[str] = []

    def __call__(self, name: str, pools: NodePool | Sequence[NodePool], **spec: Any) -> Job:
        return self.create(job_manifest(name, pools, **spec))

    def create(self, body: dict[str, Any]) -> Job:
        claim = f"{body['metadata']['name']}-checkpoints"
        path = str(self.folder / claim)
        self.volumes.append(prebound_volume(self.api, self.namespace, claim, path))
        return Job.create(self.api, self.namespace, body)
