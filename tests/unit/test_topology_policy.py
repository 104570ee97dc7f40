"""scheduling.topology without Kueue: the workers' pod affinity toward each other on the
domain's node label, and what the PodsUnschedulable condition says when the domain is full."""

from typing import Any

import pytest
from planner import condition, make_job, pod, run, running_status, store
from training_jobs import training_job

from torchkube.api import labels as lbl
from torchkube.operator import builders, queueing, topology, workloads
from torchkube.operator.workloads import QueueObservation
from torchkube.policy.queue import QUEUE_LABEL

RACK = "example.com/rack"
TO_WORKERS = {
    "labelSelector": {"matchLabels": {lbl.JOB_NAME: "demo", lbl.ROLE: lbl.ROLE_WORKER}},
    "topologyKey": RACK,
}
STUCK = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/6 nodes are available: 2 node(s) didn't match pod affinity rules.",
}


def worker_affinity(**scheduling: Any) -> dict[str, Any]:
    job = training_job(scheduling=scheduling)
    affinity: dict[str, Any] = builders.worker_pod(job, 0, "a1").get("spec", {}).get("affinity")
    return affinity or {}


def test_required_packs_every_worker_beside_the_others() -> None:
    affinity = worker_affinity(topology={"level": RACK})
    assert affinity == {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TO_WORKERS]}
    }


def test_preferred_is_the_strongest_preference() -> None:
    affinity = worker_affinity(topology={"level": RACK, "mode": "preferred"})
    preferred = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [{"weight": 100, "podAffinityTerm": TO_WORKERS}]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAffinity"]


def test_the_users_affinity_is_kept_and_extended() -> None:
    own_term = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}
    node_rule = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
    }
    users = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [own_term]},
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": node_rule},
    }
    job = training_job(scheduling={"affinity": users, "topology": {"level": RACK}})
    affinity = builders.worker_pod(job, 0, "a1", avoid_nodes=["n7"])["spec"]["affinity"]
    required = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == [own_term, TO_WORKERS]
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == node_rule
    avoid = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert avoid[0]["preference"]["matchExpressions"][0]["values"] == ["n7"]
    assert users["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [own_term]


def test_no_topology_no_pod_affinity() -> None:
    assert "podAffinity" not in worker_affinity()


def test_only_workers_are_packed() -> None:
    scheduling = {"topology": {"level": RACK}}
    source = {"claim": {"name": "corpus", "path": "texts"}}
    job = training_job(
        scheduling=scheduling, data={"source": source}, failurePolicy={"recovery": "live"}
    )
    servers = (builders.rendezvous_pod(job, "s1"), builders.lighthouse_pod(job, "l1"))
    for made in (*servers, builders.prepare_pod(job, 1)):
        assert "podAffinity" not in made["spec"].get("affinity", {}), made["metadata"]["name"]


def test_a_full_domain_is_named_with_what_to_do() -> None:
    job = make_job(
        running_status(), replicas={"min": 2, "max": 3}, scheduling={"topology": {"level": RACK}}
    )
    stuck = pod(2, phase="Pending", node=None, conditions=[STUCK], age=90)
    result = run(job, [pod(0, node="n1"), pod(1, node="n2"), stuck, store()])
    message = condition(result, "PodsUnschedulable")["message"]
    assert "didn't match pod affinity rules" in message, message
    assert f"the {RACK} domain of the nodes the job's workers run on (n1, n2)" in message, message
    assert "scheduling.topology.mode to preferred" in message, message


@pytest.mark.parametrize("mode", ["preferred", None])
def test_no_hint_where_the_domain_cannot_be_why(mode: str | None) -> None:
    scheduling = {"topology": {"level": RACK, "mode": mode}} if mode else {}
    job = make_job(running_status(), replicas={"min": 2, "max": 3}, scheduling=scheduling)
    stuck = pod(2, phase="Pending", node=None, conditions=[STUCK], age=90)
    result = run(job, [pod(0), pod(1), stuck, store()])
    assert "scheduling.topology" not in condition(result, "PodsUnschedulable")["message"]


def test_no_domain_to_name_before_a_worker_is_placed() -> None:
    job = training_job(scheduling={"topology": {"level": RACK}})
    assert topology.unschedulable_hint(job, [pod(0, phase="Pending", node=None)]) == ""


def test_a_queued_jobs_workers_ask_kueue_for_the_domain_numbered_by_slot() -> None:
    job = training_job(scheduling={"topology": {"level": RACK}})
    pod_sets = {s["name"]: s for s in workloads.pod_sets(job)}
    request = pod_sets[workloads.WORKERS]["topologyRequest"]
    assert request == {"required": RACK, "podIndexLabel": lbl.REPLICA_INDEX}
    assert "topologyRequest" not in pod_sets[workloads.STORE]
    plain = {s["name"]: s for s in workloads.pod_sets(training_job())}
    assert "topologyRequest" not in plain[workloads.WORKERS]


def kueue_placed(job_spec: dict[str, Any], assigned: bool) -> list[dict[str, Any]]:
    """The pods a job admitted by Kueue creates, placed as the admission says."""
    job = make_job(running_status(), replicas={"min": 2, "max": 2}, **job_spec)
    job = job.model_copy(update={"metadata": {**job.metadata, "labels": {QUEUE_LABEL: "q"}}})
    body = workloads.workload(job, workloads.Priority())
    worker = {"name": "worker", "count": 2, "flavors": {"nvidia.com/gpu": "racks"}}
    if assigned:
        worker["topologyAssignment"] = {
            "levels": [RACK],
            "domains": [{"values": ["r1"], "count": 2}],
        }
    body["status"] = {
        "conditions": [{"type": "Admitted", "status": "True"}],
        "admission": {
            "clusterQueue": "gpus",
            "podSetAssignments": [worker, {"name": "store", "count": 1, "flavors": {}}],
        },
    }
    queue = QueueObservation(workload=workloads.read(body))
    workers = [builders.worker_pod(job, slot, f"s{slot}") for slot in (0, 1)]
    store = builders.rendezvous_pod(job, "s9")
    flavors = {"racks": {"spec": {"nodeLabels": {"pool": "gpus"}}}}
    return queueing.placed([*workers, store], queue, flavors)


def test_pods_kueue_placed_by_topology_wait_for_its_ungater() -> None:
    worker, _, store = kueue_placed({"scheduling": {"topology": {"level": RACK}}}, True)
    assert worker["spec"]["schedulingGates"] == [{"name": workloads.TOPOLOGY_GATE}]
    assert worker["metadata"]["labels"][workloads.POD_SET_LABEL] == "worker"
    annotations = worker["metadata"]["annotations"]
    assert annotations[workloads.TOPOLOGY_ANNOTATIONS["required"]] == RACK
    assert annotations[workloads.WORKLOAD_ANNOTATION].startswith("trainingjob-demo-")
    assert worker["spec"]["nodeSelector"] == {"pool": "gpus"}
    assert "schedulingGates" not in store["spec"]


def test_without_a_topology_assignment_no_pod_is_gated() -> None:
    pods = kueue_placed({"scheduling": {"topology": {"level": RACK}}}, False)
    assert all("schedulingGates" not in pod["spec"] for pod in pods)
