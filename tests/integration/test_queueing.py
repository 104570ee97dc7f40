"""TrainingJobs admitted by the real Kueue (testbed.kueue): quota decides which job runs and at
what size, a waiting job creates no pod, and quota comes back when a job goes or ends.

Each test has its own KWOK GPU pool, ResourceFlavor, ClusterQueue and LocalQueue: the flavor's
node labels and toleration are the only thing that steers the pods onto the pool, so a pod on
the pool shows that the admitted flavor was injected."""

import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kube_jobs import Job, JobMaker, job_manifest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed import faults
from testbed.kueue import Kueue
from testbed.kwok import POOL_LABEL, NodePool, kwok_toleration
from testbed.operator import OperatorProcess
from testbed.wait import wait_for
from torchkube.api import labels as lbl
from torchkube.api.contract import PrepareReport

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

KUEUE = ("kueue.x-k8s.io", "v1beta2")
SOURCE = {"path": "/opt/corpus"}
GPUS = 8


class Queue:
    """A LocalQueue in the test's namespace over a ClusterQueue with ``workers`` workers'
    worth of GPUs on one flavor: the pool's nodes."""

    def __init__(
        self, api: Any, namespace: str, pool: NodePool, workers: int, cpu: str = "100"
    ) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.name = f"q-{secrets.token_hex(3)}"
        self.flavor = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": self.name},
            "spec": {"nodeLabels": {POOL_LABEL: pool.name}, "tolerations": [kwok_toleration()]},
        }
        quota = [
            {"name": "cpu", "nominalQuota": cpu},
            {"name": "memory", "nominalQuota": "1Ti"},
            {"name": "nvidia.com/gpu", "nominalQuota": str(workers * GPUS)},
        ]
        self.cluster_queue = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": self.name},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [{"name": self.name, "resources": quota}],
                    }
                ],
            },
        }
        self.custom.create_cluster_custom_object(*KUEUE, "resourceflavors", self.flavor)
        self.custom.create_cluster_custom_object(*KUEUE, "clusterqueues", self.cluster_queue)
        local = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": self.name},
            "spec": {"clusterQueue": self.name},
        }
        self.custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", local)

    def delete(self) -> None:
        for delete in (
            lambda: self.custom.delete_namespaced_custom_object(
                *KUEUE, self.namespace, "localqueues", self.name
            ),
            lambda: self.custom.delete_cluster_custom_object(*KUEUE, "clusterqueues", self.name),
            lambda: self.custom.delete_cluster_custom_object(*KUEUE, "resourceflavors", self.name),
        ):
            try:
                delete()
            except ApiException as error:
                if error.status != 404:
                    raise

    def workload(self, job: Job) -> dict[str, Any] | None:
        found = self.custom.list_namespaced_custom_object(
            *KUEUE, self.namespace, "workloads", label_selector=f"{lbl.JOB_NAME}={job.name}"
        )["items"]
        return found[0] if found else None


@dataclass
class Queues:
    """Makes a test's queues (each on a pool of its own) and its queued jobs."""

    api: Any
    namespace: str
    isolated_pool: Callable[..., NodePool]
    make_job: JobMaker
    made: list[Queue]

    def queue(self, workers: int, cpu: str = "100") -> tuple[Queue, NodePool]:
        pool = self.isolated_pool(nodes=6, gpus_per_node=GPUS)
        self.made.append(Queue(self.api, self.namespace, pool, workers, cpu))
        return self.made[-1], pool

    def job(
        self, name: str, queue: Queue, pool: NodePool, elastic: bool = False, **spec: Any
    ) -> Job:
        """A job labelled for ``queue`` whose own spec does not choose the pool: only the
        flavor Kueue assigns puts its pods there; ``elastic`` resized under quota."""
        body = job_manifest(name, pool, **spec)
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue.name}
        if elastic:
            body["metadata"]["annotations"] = {"kueue.x-k8s.io/elastic-job": "true"}
        body["spec"]["scheduling"].pop("nodeSelector")
        body["spec"]["scheduling"]["tolerations"] = []
        return self.make_job.create(body)


@pytest.fixture
def queues(
    api_client: Any,
    namespace: str,
    kueue: Kueue,
    operator: OperatorProcess,
    isolated_pool: Callable[..., NodePool],
    make_job: JobMaker,
) -> Iterator[Queues]:
    made = Queues(api_client, namespace, isolated_pool, make_job, [])
    yield made
    for q in made.made:
        q.delete()


def wait_queued(job: Job, timeout: float = 30, saying: str = "") -> dict[str, Any]:
    """The job's status once it is Queued and its Queued condition's message holds `saying`:
    Kueue says why a Workload waits only after its first admission attempt, which follows
    the Workload's creation by a scheduling cycle."""

    def queued() -> dict[str, Any] | None:
        status = job.status()
        if status.get("phase") != "Queued":
            return None
        conditions = [c for c in status.get("conditions", []) if c["type"] == "Queued"]
        return status if conditions and saying in conditions[0].get("message", "") else None

    found: dict[str, Any] = job.wait(queued, timeout, f"phase Queued saying {saying!r}")
    return found


def place(job: Job) -> tuple[int, int] | None:
    """The job's place in its LocalQueue and ClusterQueue, as its status reports it."""
    queue = job.status().get("queue") or {}
    if "positionInLocalQueue" not in queue:
        return None
    return queue["positionInLocalQueue"], queue.get("positionInClusterQueue")


def reconciles(operator: OperatorProcess) -> float:
    """Reconciles the operator process has finished so far (from its metrics)."""
    for line in operator.metrics().splitlines():
        if line.startswith("torchkube_reconcile_duration_seconds_count"):
            return float(line.split()[-1])
    return 0.0


def test_quota_admits_one_whole_job_and_queues_the_others_in_line_until_it_is_gone(
    queues: Queues, operator: OperatorProcess
) -> None:
    q, pool = queues.queue(6)
    first = queues.job("first", q, pool, replicas={"min": 4, "max": 4})
    running = first.wait_running(4)
    assert {pod.spec.node_name for pod in running} <= set(pool.node_names())
    assert all(pod.spec.node_selector == {POOL_LABEL: pool.name} for pod in running)

    second = queues.job("second", q, pool, replicas={"min": 4, "max": 4})
    status = wait_queued(second)
    queued = next(c for c in status["conditions"] if c["type"] == "Queued")
    assert queued["status"] == "True" and q.name in queued["message"], queued
    workload = q.workload(second)
    assert workload is not None
    owner = workload["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainingJob", "second", True)
    assert workload["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == owner["uid"]
    workers = next(s for s in workload["spec"]["podSets"] if s["name"] == "worker")
    assert workers["count"] == 4 and "minCount" not in workers
    assert second.pods("worker") == [] and second.pods(lbl.ROLE_RENDEZVOUS) == []

    operator.kill()  # a new operator process creates nothing for it either
    operator.start()
    wait_for(lambda: reconciles(operator) >= 2, 30, what="the new operator to reconcile both jobs")
    assert second.pods("worker") == [] and second.pods(lbl.ROLE_RENDEZVOUS) == []
    assert second.status()["phase"] == "Queued"

    third = queues.job("third", q, pool, replicas={"min": 4, "max": 4})
    wait_for(
        lambda: (place(second), place(third)) == ((0, 0), (1, 1)),
        40,
        what="Kueue's visibility API to place second next and third after it",
        describe_last=lambda: f"second {place(second)}, third {place(third)}",
    )

    first.delete()
    second.wait_running(4, timeout=60)
    assert second.status()["queue"]["admittedWorkers"] == 4
    assert second.status()["queue"].get("positionInLocalQueue") is None
    wait_for(
        lambda: place(third) == (0, 0),
        40,
        what="third to move up to next in line",
        describe_last=lambda: f"third {place(third)}",
    )


@pytest.mark.parametrize("resized", [False, True], ids=["fixed-range", "resized-under-quota"])
def test_partial_admission_starts_an_elastic_job_at_what_the_quota_leaves(
    queues: Queues, resized: bool
) -> None:
    """Both kinds start at the 2 workers the quota leaves; one resized under quota (Kueue's
    workload slices) also grows to its target once the quota frees."""
    q, pool = queues.queue(6)
    fixed = queues.job("fixed", q, pool, replicas={"min": 4, "max": 4})
    fixed.wait_running(4)
    elastic = queues.job("elastic", q, pool, elastic=resized, replicas={"min": 2, "max": 4})
    elastic.wait_running(2, timeout=60)
    status = elastic.status()
    assert status["queue"]["admittedWorkers"] == 2 and status["workers"].endswith("/2"), status
    assert len(elastic.live_workers()) == 2
    if resized:
        fixed.delete()
        elastic.wait_running(4, timeout=60)
        assert elastic.status()["queue"]["admittedWorkers"] == 4


def test_a_finished_job_returns_its_quota(queues: Queues) -> None:
    q, pool = queues.queue(4)
    done = queues.job("done", q, pool, replicas={"min": 4, "max": 4})
    workers = done.wait_running(4)
    waiting = queues.job("waiting", q, pool, replicas={"min": 4, "max": 4})
    wait_queued(waiting)
    for pod in workers:
        faults.succeed_pod(queues.api, pod.metadata.name, queues.namespace)

    def finished() -> bool:
        workload = q.workload(done) or {}
        conditions = (workload.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Finished" and c["status"] == "True" for c in conditions)

    wait_for(finished, 30, what="the finished job's Workload to be Finished")
    waiting.wait_running(4, timeout=60)


def test_prepared_data_returns_the_prepare_pods_quota_and_the_next_job_starts(
    queues: Queues,
) -> None:
    """CPU quota for one job's rendezvous store and prepare pod (100m + 500m): a second job
    (its store: 100m) waits while the first prepares its data, and is admitted once the
    prepare pod succeeded and its quota was reported reclaimable."""
    q, pool = queues.queue(4, cpu="600m")
    prep = queues.job("prep", q, pool, replicas={"min": 2, "max": 2}, data={"source": SOURCE})
    pod = prep.wait(
        lambda: next((p for p in prep.pods(lbl.ROLE_PREPARE) if p.status.phase == "Running"), None),
        60,
        "prepare pod Running",
    )
    waiting = queues.job("waiting", q, pool, replicas={"min": 2, "max": 2})
    wait_queued(waiting, saying="insufficient unused quota for cpu")
    report = PrepareReport(
        source="image:/opt/corpus", tokenizer="bytes", documents=4, train_tokens=4_000,
        val_tokens=400, vocab_size=257,
    )  # fmt: skip
    faults.succeed_pod(
        queues.api, pod.metadata.name, queues.namespace, message=json.dumps(report.to_wire())
    )
    prep.wait_running(2)
    waiting.wait_running(2, timeout=60)
    reclaimable = (q.workload(prep) or {}).get("status", {}).get("reclaimablePods")
    assert reclaimable == [{"name": "prepare", "count": 1}]


@pytest.fixture
def priority_classes(api_client: Any) -> Iterator[Callable[[int], str]]:
    scheduling = client.SchedulingV1Api(api_client)
    made: list[str] = []

    def make(value: int) -> str:
        name = f"p{value}-{secrets.token_hex(3)}"
        scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
        made.append(name)
        return name

    yield make
    for name in made:
        scheduling.delete_priority_class(name)


def test_a_higher_priority_job_preempts_a_running_one_which_resumes_after_it(
    queues: Queues, priority_classes: Callable[[int], str]
) -> None:
    q, pool = queues.queue(4)
    low, high = priority_classes(10), priority_classes(1000)
    fixed = {"min": 4, "max": 4}
    victim = queues.job("victim", q, pool, replicas=fixed, scheduling={"priorityClassName": low})
    stopped = victim.wait_running(4)
    urgent = queues.job("urgent", q, pool, replicas=fixed, scheduling={"priorityClassName": high})
    status = wait_queued(victim, timeout=60)
    queued = next(c for c in status["conditions"] if c["type"] == "Queued")
    assert queued["reason"] == "Preempted", queued
    urgent.wait_running(4, timeout=60)
    for pod in stopped:  # stopped the way a suspend stops them: SIGTERM, labelled released
        assert pod.metadata.name not in {p.metadata.name for p in victim.live_workers()}
    status = victim.status()
    assert status.get("restarts", 0) == 0 and not status.get("failures"), status
    victim.wait_event("Preempted")

    urgent.delete()
    victim.wait_running(4, timeout=60)
    status = victim.status()
    assert status.get("restarts", 0) == 0 and status["queue"]["admittedWorkers"] == 4


def test_a_job_taken_off_the_queue_or_deleted_while_queued_holds_no_quota(
    queues: Queues,
) -> None:
    q, pool = queues.queue(4)
    fixed = {"min": 4, "max": 4}
    parked = queues.job("parked", q, pool, replicas=fixed)
    parked.wait_running(4)
    waiting = queues.job("waiting", q, pool, replicas=fixed)
    wait_queued(waiting)
    workload = q.workload(parked)
    assert workload is not None
    q.custom.patch_namespaced_custom_object(  # what `kueuectl stop workload` does
        *KUEUE, queues.namespace, "workloads", workload["metadata"]["name"],
        {"spec": {"active": False}},
    )  # fmt: skip
    status = wait_queued(parked)
    assert next(c for c in status["conditions"] if c["type"] == "Queued")["reason"] == "Evicted"
    waiting.wait_running(4, timeout=60)
    assert parked.live_workers() == [] and parked.status().get("restarts", 0) == 0

    parked.delete()  # while queued: its Workload goes with it, no finalizer holds it
    wait_for(lambda: q.workload(parked) is None, 30, what="the deleted job's Workload to go")


def test_an_elastic_job_grows_when_quota_frees_and_shrinking_returns_quota_at_once(
    queues: Queues,
) -> None:
    q, pool = queues.queue(6)
    elastic = queues.job(
        "elastic", q, pool, elastic=True, replicas={"min": 1, "max": 6, "desired": 2}
    )
    elastic.wait_running(2)
    other = queues.job("other", q, pool, replicas={"min": 4, "max": 4})
    other.wait_running(4)

    elastic.patch({"replicas": {"min": 1, "max": 6, "desired": 4}})

    def slices() -> list[dict[str, Any]]:
        return q.custom.list_namespaced_custom_object(
            *KUEUE, queues.namespace, "workloads", label_selector=f"{lbl.JOB_NAME}=elastic"
        )["items"]

    wait_for(lambda: len(slices()) == 2, 30, what="a scale-up slice")
    assert len(elastic.live_workers()) == 2  # no room yet: it goes on at 2
    other.delete()
    elastic.wait_running(4, timeout=60)
    assert elastic.status()["queue"]["admittedWorkers"] == 4

    elastic.patch({"replicas": {"min": 1, "max": 6, "desired": 1}})
    third = queues.job("third", q, pool, replicas={"min": 5, "max": 5})
    third.wait_running(5, timeout=60)  # the 3 workers given back made room
    assert len(elastic.live_workers()) == 1
