"""scheduling.topology: the workers' pod affinity toward each other on the domain's node label,
what the PodsUnschedulable condition says when the domain is full, and where the workers are
(status.topology, the TopologySpread condition, the metrics)."""

from datetime import timedelta
from typing import Any

import pytest
from planner import condition, make_job, pod, run, running_status, store
from prometheus_client import REGISTRY, generate_latest
from training_jobs import NOW, training_job

from torchkube.api import labels as lbl
from torchkube.api.status import MAX_TOPOLOGY_DOMAINS, UNLABELLED_DOMAIN, TopologyStatus
from torchkube.operator import builders, metrics, queueing, topology, workloads
from torchkube.operator.planner import Plan
from torchkube.operator.pods import NodeHealth, node_health, slim
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
    assert topology.unschedulable_hint(job, [pod(0, phase="Pending", node=None)], {}) == ""


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
    flavors = {"racks": {"spec": {"nodeLabels": {"pool": "gpus"}}}}
    queue = QueueObservation(workload=workloads.read(body), flavors=flavors)
    workers = [builders.worker_pod(job, slot, f"s{slot}") for slot in (0, 1)]
    store = builders.rendezvous_pod(job, "s9")
    return queueing.placed([*workers, store], queue)


def test_pods_kueue_placed_by_topology_wait_for_its_ungater() -> None:
    worker, _, store = kueue_placed({"scheduling": {"topology": {"level": RACK}}}, True)
    assert worker["spec"]["schedulingGates"] == [{"name": workloads.TOPOLOGY_GATE}]
    assert worker["metadata"]["labels"][workloads.POD_SET_LABEL] == "worker"
    annotations = worker["metadata"]["annotations"]
    assert annotations[workloads.TOPOLOGY_ANNOTATIONS["required"]] == RACK
    assert annotations[workloads.WORKLOAD_ANNOTATION].startswith("trainingjob-demo-")
    assert worker["spec"]["nodeSelector"] == {"pool": "gpus"}
    assert "schedulingGates" not in store["spec"]


def test_pods_kueue_placed_on_a_topology_flavour_unasked_are_gated_unconstrained() -> None:
    """A job asking no topology, admitted on a flavour with a Topology: Kueue assigned its
    pods nodes all the same (implicit TAS), so they wait for its ungater, marked unconstrained
    as jobframework marks them — ungated, the scheduler would place them elsewhere and
    Kueue would count them twice: on their assigned nodes and where they run."""
    worker, _, store = kueue_placed({}, True)
    assert worker["spec"]["schedulingGates"] == [{"name": workloads.TOPOLOGY_GATE}]
    annotations = worker["metadata"]["annotations"]
    assert annotations[workloads.UNCONSTRAINED_ANNOTATION] == "true"
    assert not set(workloads.TOPOLOGY_ANNOTATIONS.values()) & set(annotations)
    assert "schedulingGates" not in store["spec"]


def test_without_a_topology_assignment_no_pod_is_gated() -> None:
    pods = kueue_placed({"scheduling": {"topology": {"level": RACK}}}, False)
    assert all("schedulingGates" not in pod["spec"] for pod in pods)


# --- where the workers are: status.topology and TopologySpread -----------------------------


def node(rack: str | None) -> NodeHealth:
    """A Ready node in ``rack`` (None: a node without the rack label)."""
    return NodeHealth(True, NOW - timedelta(hours=1), {RACK: rack} if rack else {})


NODES = {"a1": node("rack-a"), "a2": node("rack-a"), "b1": node("rack-b"), "x1": node(None)}


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        ([pod(0, node="a1"), pod(1, node="a2")], {"rack-a": [0, 1]}),
        ([pod(1, node="a1"), pod(0, node="b1")], {"rack-a": [1], "rack-b": [0]}),
        # A Pending worker bound to a node holds its place there; one not placed yet, none.
        ([pod(0, phase="Pending", node="b1"), pod(1, phase="Pending", node=None)], {"rack-b": [0]}),
        ([pod(0, node="a1"), pod(1, node="x1")], {"rack-a": [0], UNLABELLED_DOMAIN: [1]}),
        # Gone from the node cache: lost with its node, not placed elsewhere.
        ([pod(0, node="a1"), pod(1, node="gone")], {"rack-a": [0]}),
        # On its way out, or ended: no longer there.
        ([pod(0, node="a1"), pod(1, node="b1", deleting=True)], {"rack-a": [0]}),
        ([pod(0, node="a1"), pod(1, phase="Failed", node="b1", exit_code=1)], {"rack-a": [0]}),
    ],
)
def test_workers_are_counted_in_their_nodes_domains_by_slot(
    workers: list[dict[str, Any]], expected: dict[str, list[int]]
) -> None:
    slimmed = [slim(worker) for worker in workers]
    assert topology.occupied(slimmed, NODES, RACK) == expected


def placed(mode: str, *nodes: str, **status: Any) -> Plan:
    """A running job of ``len(nodes)`` workers, one on each of ``nodes``, planned."""
    job = make_job(
        running_status(**status),
        replicas={"min": len(nodes), "max": len(nodes)},
        scheduling={"topology": {"level": RACK, "mode": mode}},
    )
    workers = [pod(slot, node=where) for slot, where in enumerate(nodes)]
    return run(job, [*workers, store(node="a1")], nodes=NODES)


@pytest.mark.parametrize(
    ("nodes", "slots"),
    [
        (("a1", "a2"), {"rack-a": "0-1"}),
        (("a1", "b1", "a2"), {"rack-a": "0,2", "rack-b": "1"}),
        (("x1", "b1"), {UNLABELLED_DOMAIN: "0", "rack-b": "1"}),
    ],
)
def test_the_status_lists_the_domains_sorted_once_each_with_their_slots(
    nodes: tuple[str, ...], slots: dict[str, str]
) -> None:
    result = placed("required", *nodes)
    assert result.status.to_wire()["topology"] == {
        "level": RACK,
        "domains": sorted(slots),
        "domainCount": len(slots),
        "slots": slots,
    }


@pytest.mark.parametrize(
    ("slots", "text"),
    [([0, 1, 2, 3], "0-3"), ([0, 2, 3, 7], "0,2-3,7"), ([5], "5"), ([], "")],
)
def test_slots_are_written_as_ranges(slots: list[int], text: str) -> None:
    assert topology.slot_ranges(slots) == text


def test_a_scattered_slot_list_is_cut_at_a_comma() -> None:
    text = topology.slot_ranges(list(range(0, 400, 2)), limit=20)
    assert text == "0,2,4,6,8,10,12,14,…", text


def test_a_packed_job_has_no_spread_condition() -> None:
    result = placed("preferred", "a1", "a2")
    assert all(c.type != "TopologySpread" for c in result.status.conditions)
    assert not [e for e in result.events if e.reason == topology.SPREAD]


def test_a_spread_job_says_where_and_what_would_pack_it_again() -> None:
    result = placed("preferred", "a1", "b1", "a2")
    spread = condition(result, "TopologySpread")
    assert (spread["status"], spread["reason"]) == ("True", "SpreadOverDomains")
    message = spread["message"]
    assert f"3 workers on nodes run in 2 {RACK} domains: rack-a (2 workers), rack-b (1 worker)" in (
        message
    ), message
    assert "Missing: room in rack-a for 1 more worker" in message, message
    assert "scheduling.topology.mode required" in message, message
    [event] = [e for e in result.events if e.reason == topology.SPREAD]
    assert event.type == "Warning" and event.message == message
    again = placed("preferred", "a1", "b1", "a2", conditions=result.status.to_wire()["conditions"])
    assert not [e for e in again.events if e.reason == topology.SPREAD], "warned twice"


def test_a_required_job_spread_is_not_told_to_require() -> None:
    message = condition(placed("required", "a1", "b1"), "TopologySpread")["message"]
    assert "Missing: room in rack-a for 1 more worker" in message, message
    assert "mode required" not in message, message


def test_workers_on_unlabelled_nodes_are_outside_the_domain() -> None:
    message = condition(placed("preferred", "x1", "x1", "b1"), "TopologySpread")["message"]
    assert f"{UNLABELLED_DOMAIN} (2 workers on nodes without {RACK}), rack-b (1 worker)" in (
        message
    ), message
    assert "room in rack-b for 2 more workers" in message, message


def test_packed_again_the_condition_turns_false() -> None:
    spread = placed("preferred", "a1", "b1")
    packed = placed("preferred", "a1", "a2", conditions=spread.status.to_wire()["conditions"])
    after = condition(packed, "TopologySpread")
    assert (after["status"], after["reason"]) == ("False", "OneDomain")
    assert after["message"] == f"the workers run in one {RACK} domain: rack-a"


def test_a_wide_spread_is_listed_up_to_the_cap_and_counted() -> None:
    hosts = {f"h{i:02d}": NodeHealth(True, None, {RACK: f"r{i:02d}"}) for i in range(40)}
    job = make_job(
        running_status(),
        replicas={"min": 40, "max": 40},
        scheduling={"topology": {"level": RACK, "mode": "preferred"}},
    )
    workers = [pod(slot, node=f"h{slot:02d}") for slot in range(40)]
    result = run(job, [*workers, store(node="h00")], nodes=hosts)
    shown = result.status.topology
    assert shown is not None and shown.domain_count == 40
    assert shown.domains == [f"r{i:02d}" for i in range(MAX_TOPOLOGY_DOMAINS)]
    assert "and 32 more;" in condition(result, "TopologySpread")["message"]


def test_without_topology_no_status_and_a_removed_one_clears_both() -> None:
    plain = make_job(running_status())
    assert run(plain, [pod(i, node="a1") for i in range(4)], nodes=NODES).status.topology is None
    spread = placed("preferred", "a1", "b1")
    wire = spread.status.to_wire()
    job = make_job(wire, replicas={"min": 2, "max": 2})
    result = run(job, [pod(0, node="a1"), pod(1, node="b1"), store(node="a1")], nodes=NODES)
    assert result.status.topology is None
    assert condition(result, "TopologySpread")["status"] == "False"


def test_an_ended_job_keeps_where_it_last_ran() -> None:
    last = {"level": RACK, "domains": ["rack-a"], "domainCount": 1, "slots": {"rack-a": "0-1"}}
    job = make_job(
        {**running_status(topology=last), "phase": "Succeeded"},
        scheduling={"topology": {"level": RACK}},
    )
    result = run(job, [pod(0, phase="Succeeded", node="b1", exit_code=0)], nodes=NODES)
    assert result.status.to_wire()["topology"] == last


def test_a_full_domain_is_named_by_its_label_value() -> None:
    job = make_job(
        running_status(), replicas={"min": 2, "max": 3}, scheduling={"topology": {"level": RACK}}
    )
    stuck = pod(2, phase="Pending", node=None, conditions=[STUCK], age=90)
    result = run(job, [pod(0, node="a1"), pod(1, node="a2"), stuck, store()], nodes=NODES)
    message = condition(result, "PodsUnschedulable")["message"]
    assert f"the {RACK} domain of the nodes the job's workers run on (a1, a2), rack-a:" in (
        message
    ), message
    assert "free a node in rack-a, lower replicas" in message, message


def test_the_node_cache_keeps_each_nodes_labels() -> None:
    body = {
        "metadata": {"name": "a1", "labels": {RACK: "rack-a"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert node_health(body).labels == {RACK: "rack-a"}
    assert node_health({"metadata": {"name": "bare"}}).labels == {}


def test_the_metrics_follow_the_status() -> None:
    shown = TopologyStatus(level=RACK, domains=["rack-a", "rack-b"], domain_count=2)
    metrics.TOPOLOGY.set("ns", "spread", shown)
    try:
        text = generate_latest(REGISTRY).decode()
        assert 'torchkube_job_topology_domains{job="spread",namespace="ns"} 2.0' in text
        for rack in ("rack-a", "rack-b"):
            labels = f'domain="{rack}",job="spread",level="{RACK}",namespace="ns"'
            assert f"torchkube_job_topology_domain_info{{{labels}}} 1.0" in text, text
        metrics.TOPOLOGY.set("ns", "spread", None)
        assert 'job="spread"' not in generate_latest(REGISTRY).decode()
    finally:
        metrics.job_gone("ns", "spread")
