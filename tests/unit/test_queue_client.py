"""The operator's reads of Kueue's API, over real HTTP to a stub that answers as the
apiserver would: the priority a job's first Workload carries, its place in line, and how
the place's reads are shared and survive a visibility API that does not answer."""

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client
from stub_http import Reply, StubServer
from training_jobs import training_job

from torchkube.api import TrainingJob
from torchkube.operator import queue_client as queue_client_module
from torchkube.operator import workloads
from torchkube.operator.queue_client import QueueClient
from torchkube.operator.workloads import Priority, QueuePosition
from torchkube.policy.queue import QUEUE_LABEL

NAMESPACE, QUEUE = "ns", "team-a"
WORKLOADS = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/workloads"
PENDING = workloads.pending_workloads_path(NAMESPACE, QUEUE)
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
BROKEN = object()
"""A route whose server fails: the connection closes without an answer."""


def priority_class(name: str, value: int, default: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name}, "value": value, "globalDefault": default}


class Apiserver:
    """Answers GETs from ``routes`` (path without query → JSON body; absent: 404)."""

    def __init__(self) -> None:
        self.routes: dict[str, Any] = {WORKLOADS: {"items": []}}
        self.stub = StubServer(self.answer)

    def answer(self, path: str) -> Reply | None:
        body = self.routes.get(path.split("?")[0])
        if body is BROKEN:
            raise ConnectionAbortedError("the server fails mid-request")
        return None if body is None else Reply(json.dumps(body).encode(), "application/json")

    def asked(self, path: str) -> int:
        return sum(1 for asked in self.stub.requests if asked.split("?")[0] == path)


@pytest.fixture
def apiserver() -> Iterator[Apiserver]:
    served = Apiserver()
    yield served
    served.stub.close()


def queue_client(url: str) -> QueueClient:
    configuration = client.Configuration()
    configuration.host = url
    return QueueClient(client.ApiClient(configuration))


def queued(**spec: Any) -> TrainingJob:
    job = training_job(**spec)
    labels = {QUEUE_LABEL: QUEUE, **(job.metadata.get("labels") or {})}
    return job.model_copy(update={"metadata": {**job.metadata, "labels": labels}})


def planned() -> TrainingJob:
    """A queued job the operator has planned for: it has a status, and its Workload."""
    return queued(status={"phase": "Pending", "observedGeneration": 1})


def test_a_first_workloads_priority_is_found_in_jobframeworks_order(
    apiserver: Apiserver,
) -> None:
    apiserver.routes[PRIORITY_CLASSES] = {
        "items": [
            priority_class("batch", 100, default=True),
            priority_class("low", 50, default=True),  # two defaults: the lowest, as Kueue
            priority_class("high", 1000),
        ]
    }
    apiserver.routes[f"{PRIORITY_CLASSES}/high"] = priority_class("high", 1000)
    research = "/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses/research"
    apiserver.routes[research] = {"metadata": {"name": "research"}, "value": 7}
    queues = queue_client(apiserver.stub.url)

    assert queues.observe(queued()).priority == Priority(50, "low")
    named = queued(scheduling={"priorityClassName": "high"})
    assert queues.observe(named).priority == Priority(1000, "high")
    labelled = named.model_copy(
        update={
            "metadata": {
                **named.metadata,
                "labels": {**named.metadata["labels"], workloads.PRIORITY_CLASS_LABEL: "research"},
            }
        }
    )
    assert queues.observe(labelled).priority == Priority(7, "research", "WorkloadPriorityClass")
    assert Priority(7, "research", "WorkloadPriorityClass").ref() == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "research",
    }
    missing = queued(scheduling={"priorityClassName": "gone"})
    assert queues.observe(missing).priority == Priority()
    apiserver.routes[PRIORITY_CLASSES] = {"items": [priority_class("high", 1000)]}
    assert queues.observe(queued()).priority == Priority()


def test_places_in_line_are_read_once_per_queue_and_are_optional(apiserver: Apiserver) -> None:
    job = planned()
    name = workloads.workload_name(job)
    body = workloads.workload(job, Priority())
    body["status"] = {"conditions": [{"type": "QuotaReserved", "status": "False"}]}
    apiserver.routes[WORKLOADS] = {"items": [body]}
    apiserver.routes[PENDING] = {
        "items": [
            {"metadata": {"name": "trainingjob-other-aaaaa"}, "positionInLocalQueue": 0},
            {
                "metadata": {"name": name},
                "positionInLocalQueue": 1,
                "positionInClusterQueue": 4,
            },
        ]
    }
    queues = queue_client(apiserver.stub.url)

    first, second = queues.observe(job), queues.observe(job)
    assert first.position == second.position == QueuePosition(1, 4)
    assert first.places_served and apiserver.asked(PENDING) == 1  # shared for 2 s

    del apiserver.routes[PENDING]  # Kueue's visibility API not served
    unserved = queue_client(apiserver.stub.url).observe(job)
    assert unserved.position is None and not unserved.places_served
    assert unserved.workload is not None and unserved.workload.name == name

    apiserver.routes[PENDING] = {"items": []}  # served, the job not listed yet
    not_yet = queue_client(apiserver.stub.url).observe(job)
    assert not_yet.position is None and not_yet.places_served

    apiserver.routes[PENDING] = BROKEN  # failing: no place, and the reconcile goes on
    failing = queue_client(apiserver.stub.url).observe(job)
    assert failing.position is None and not failing.places_served
    assert failing.workload is not None


def test_jobs_of_one_queue_reconciled_at_once_share_one_read(apiserver: Apiserver) -> None:
    """Reconciles run in threads: those of one LocalQueue's jobs that ask while its list is
    being read wait for that read instead of sending their own."""
    job = planned()
    body = workloads.workload(job, Priority())
    body["status"] = {"conditions": [{"type": "QuotaReserved", "status": "False"}]}
    apiserver.routes[WORKLOADS] = {"items": [body]}
    apiserver.routes[PENDING] = {"items": []}
    slow = apiserver.answer

    def slowly(path: str) -> Reply | None:
        if path.split("?")[0] == PENDING:
            time.sleep(0.5)
        return slow(path)

    apiserver.answer = slowly  # type: ignore[method-assign]
    apiserver.stub.close()
    apiserver.stub = StubServer(apiserver.answer)
    queues = queue_client(apiserver.stub.url)
    with ThreadPoolExecutor(4) as pool:
        seen = list(pool.map(lambda _: queues.observe(job), range(4)))
    assert all(s.places_served for s in seen)
    assert apiserver.asked(PENDING) == 1


FLAVORS = "/apis/kueue.x-k8s.io/v1beta2/resourceflavors"


def admitted(job: TrainingJob) -> dict[str, Any]:
    """The job's Workload, admitted with its workers on flavour h100 and its store on
    cpu-nodes."""
    body = workloads.workload(job, Priority())
    body["status"] = {
        "conditions": [
            {"type": "QuotaReserved", "status": "True"},
            {"type": "Admitted", "status": "True"},
        ],
        "admission": {
            "clusterQueue": "gpus",
            "podSetAssignments": [
                {"name": "worker", "count": 4, "flavors": {"nvidia.com/gpu": "h100"}},
                {"name": "store", "count": 1, "flavors": {"cpu": "cpu-nodes"}},
            ],
        },
    }
    return body


def test_an_admitted_jobs_flavours_are_read_before_planning_and_shared_for_a_while(
    apiserver: Apiserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner places the pods it creates on them (queueing.place); the job's reconciles
    within ``FLAVORS_TTL_SECONDS`` cost no more reads. A deleted flavour is left out."""
    job = planned()
    h100 = {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"gpu": "h100"}}}
    apiserver.routes[WORKLOADS] = {"items": [admitted(job)]}
    apiserver.routes[f"{FLAVORS}/h100"] = h100
    queues = queue_client(apiserver.stub.url)

    first, second = queues.observe(job), queues.observe(job)
    assert first.flavors == second.flavors == {"h100": h100}, "cpu-nodes does not exist"
    assert apiserver.asked(f"{FLAVORS}/h100") == apiserver.asked(f"{FLAVORS}/cpu-nodes") == 1
    monkeypatch.setattr(queue_client_module, "FLAVORS_TTL_SECONDS", 0.0)
    assert queues.observe(job).flavors == {"h100": h100}
    assert apiserver.asked(f"{FLAVORS}/h100") == 2, "read again once stale"


def test_no_flavour_is_read_for_a_job_that_creates_no_pods(apiserver: Apiserver) -> None:
    """Not admitted yet, ended, or being deleted: nothing is placed, nothing is read."""
    job = queued()
    waiting = workloads.workload(job, Priority())
    apiserver.routes[WORKLOADS] = {"items": [waiting]}
    queues = queue_client(apiserver.stub.url)
    assert queues.observe(job).flavors == {}
    apiserver.routes[WORKLOADS] = {"items": [admitted(job)]}
    ended = queued(status={"phase": "Succeeded"})
    deleting = job.model_copy(
        update={"metadata": {**job.metadata, "deletionTimestamp": "2026-11-23T12:00:00Z"}}
    )
    assert queues.observe(ended).flavors == queues.observe(deleting).flavors == {}
    assert not any(asked.startswith(FLAVORS) for asked in apiserver.stub.requests)


def test_a_job_with_no_status_yet_is_observed_without_listing_workloads(
    apiserver: Apiserver,
) -> None:
    """No operator has planned for a job without a status, so no Workload of its UID exists:
    once the apiserver has served the Workload API to this client, that job's observation
    lists none — a list right after the job's create waits on the apiserver's watch cache
    (0.085 s on every new job here), which came before every Workload torchkube made. A job
    with a status, and one following a Workload made for it (MultiKueue's), are listed."""
    queues = queue_client(apiserver.stub.url)
    queues.observe(queued())  # the first: is Kueue's API served at all?
    assert apiserver.asked(WORKLOADS) == 1
    assert queues.observe(queued(uid="u2")).workload is None
    assert apiserver.asked(WORKLOADS) == 1
    started = planned()
    apiserver.routes[WORKLOADS] = {"items": [admitted(started)]}
    assert queues.observe(started).workload is not None
    copy = queued(uid="u3")
    copy.metadata["labels"][workloads.PREBUILT_LABEL] = "made-by-multikueue"
    queues.observe(copy)
    assert apiserver.asked(WORKLOADS) == 3


def test_a_list_after_a_workload_event_asks_for_nothing_older_than_that_event(
    apiserver: Apiserver,
) -> None:
    """Served from the apiserver's watch cache as it stands, instead of waiting until it has
    caught up with etcd (0.04 s here between Kueue's admission and the pods' create)."""
    queues = queue_client(apiserver.stub.url)
    queues.observe(planned(), "4711")
    queues.observe(planned())
    first, second = [r for r in apiserver.stub.requests if r.startswith(WORKLOADS)]
    assert "resourceVersion=4711" in first and "resourceVersionMatch=NotOlderThan" in first
    assert "resourceVersion" not in second, "no event seen: the newest"
