"""scheduling.topology without Kueue, against the real scheduler and KWOK nodes labelled by
rack: the workers land in one rack, a replacement lands beside them, a full rack is named, and
the status names the rack a job occupies, or the racks of a job spread over two.

Each rack is a node pool of its own; a worker takes a whole node (8 GPUs), so where each one
runs says what the scheduler was asked. Without the topology term the scheduler spreads them:
three workers on three racks of four empty nodes share one rack by chance 6 % of the time.
"""

import contextlib
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kube_jobs import Job, JobMaker, job_manifest
from kubernetes import client

from testbed import faults
from testbed.cluster import Cluster
from testbed.kueue import Kueue
from testbed.kwok import NodePool, kwok_toleration
from torchkube.api import labels as lbl
from torchkube.cli.main import main

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RACK = "example.com/rack"
TAS_GROUP = "example.com/tas-group"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
HOSTNAME = "kubernetes.io/hostname"
LEVELS = (RACK, HOSTNAME)


def rack_of(node: str, pools: list[NodePool]) -> str:
    return next(pool.name for pool in pools if node in pool.node_names())


def test_workers_share_a_rack_and_a_replacement_lands_beside_them(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pools = [isolated_pool(nodes=4, labels={RACK: f"rack-{i}"}) for i in range(3)]
    job = make_job(
        "packed", pools, replicas={"min": 3, "max": 3}, scheduling={"topology": {"level": RACK}}
    )
    workers = job.wait_running(3)
    placed = {rack_of(w.spec.node_name, pools) for w in workers}
    assert len(placed) == 1, f"workers spread over racks: {sorted(placed)}"

    victim = workers[0]
    faults.fail_pod(api_client, victim.metadata.name, job.namespace, exit_code=137)
    failed_at = time.monotonic()
    slot = int(victim.metadata.labels[lbl.REPLICA_INDEX])
    job.wait(lambda: job.replacements(slot, victim.metadata.name), 30, "a replacement")
    workers = job.wait_running(3)
    print(f"replacement Running {time.monotonic() - failed_at:.1f}s after the failure")
    now = {rack_of(w.spec.node_name, pools) for w in workers}
    assert now == placed, f"the replacement left the job's rack: {sorted(now)} != {sorted(placed)}"


def test_a_full_rack_is_named_in_the_condition(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool]
) -> None:
    pools = [isolated_pool(nodes=2, labels={RACK: f"rack-{i}"}) for i in range(2)]
    job = make_job(
        "crowded",
        pools,
        replicas={"min": 2, "max": 3},
        scheduling={"topology": {"level": RACK}, "pendingTimeoutSeconds": 2},
    )
    workers = job.wait(
        lambda: len(job.running_workers()) == 2 and job.running_workers(), 60, "two running"
    )
    assert len({rack_of(w.spec.node_name, pools) for w in workers}) == 1

    def reported() -> dict[str, Any] | None:
        found = [c for c in job.status().get("conditions", []) if c["type"] == "PodsUnschedulable"]
        return found[0] if found and found[0]["status"] == "True" else None

    message = job.wait(reported, 60, "PodsUnschedulable")["message"]
    assert "1 of 3 workers cannot be scheduled" in message, message
    assert "pod affinity" in message, message
    assert f"the {RACK} domain of the nodes the job's workers run on" in message, message
    for worker in workers:
        assert worker.spec.node_name in message, message


def written(slots: list[int]) -> str:
    """One or two slots as status.topology.slots writes them: ``2``, ``0-1``, ``0,2``."""
    if len(slots) == 2:
        return f"{slots[0]}{'-' if slots[1] == slots[0] + 1 else ','}{slots[1]}"
    return ",".join(map(str, slots))


def rack_label(node: str, pools: list[NodePool]) -> str:
    """The rack label's value on ``node``: what status.topology names."""
    return next(pool.labels[RACK] for pool in pools if node in pool.node_names())


def topology_condition(job: Job) -> dict[str, Any] | None:
    return next(
        (c for c in job.status().get("conditions", []) if c["type"] == "TopologySpread"), None
    )


def test_the_status_names_the_rack_a_packed_job_occupies(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool]
) -> None:
    pools = [isolated_pool(nodes=2, labels={RACK: f"rack-{i}"}) for i in range(2)]
    job = make_job(
        "placed", pools, replicas={"min": 2, "max": 2}, scheduling={"topology": {"level": RACK}}
    )
    workers = job.wait_running(2)
    racks = sorted({rack_label(w.spec.node_name, pools) for w in workers})
    assert len(racks) == 1, f"workers spread over racks: {racks}"
    expected = {"level": RACK, "domains": racks, "domainCount": 1, "slots": {racks[0]: "0-1"}}
    job.wait(lambda: job.status().get("topology") == expected, 15, f"status.topology {expected}")
    spread = topology_condition(job)
    assert spread is None or spread["status"] == "False", spread


def test_a_preferred_job_too_big_for_a_rack_is_spread_and_says_so(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], kubeconfig: Path
) -> None:
    """Three workers of a whole node each, two racks of two nodes: two share a rack, the third
    runs in the other, and the status says where and what is missing; ``torchkube describe``
    lists each worker's rack in slot order (the ranks' order)."""
    pools = [isolated_pool(nodes=2, labels={RACK: f"rack-{i}"}) for i in range(2)]
    job = make_job(
        "spread",
        pools,
        replicas={"min": 3, "max": 3},
        scheduling={"topology": {"level": RACK, "mode": "preferred"}},
    )
    workers = job.wait_running(3)
    per_rack = Counter(rack_label(w.spec.node_name, pools) for w in workers)
    assert sorted(per_rack.values()) == [1, 2], per_rack
    [home] = [rack for rack, n in per_rack.items() if n == 2]
    [other] = [rack for rack, n in per_rack.items() if n == 1]
    slots: dict[str, list[int]] = {}
    for w in workers:
        slot = int(w.metadata.labels[lbl.REPLICA_INDEX])
        slots.setdefault(rack_label(w.spec.node_name, pools), []).append(slot)
    expected = {
        "level": RACK,
        "domains": sorted(per_rack),
        "domainCount": 2,
        "slots": {rack: written(sorted(held)) for rack, held in slots.items()},
    }
    job.wait(lambda: job.status().get("topology") == expected, 15, f"status.topology {expected}")

    def reported() -> dict[str, Any] | None:
        found = topology_condition(job)
        return found if found and found["status"] == "True" else None

    condition = job.wait(reported, 15, "TopologySpread=True")
    assert condition["reason"] == "SpreadOverDomains", condition
    message = condition["message"]
    assert f"run in 2 {RACK} domains: {home} (2 workers), {other} (1 worker)" in message, message
    assert f"Missing: room in {home} for 1 more worker" in message, message
    assert "scheduling.topology.mode required" in message, message
    job.wait_event("SpreadOverDomains", containing=home)

    target = ["--kubeconfig", str(kubeconfig), "-n", job.namespace]
    described = CliRunner().invoke(main, ["describe", job.name, *target])
    assert described.exit_code == 0, described.output
    rows = described.stdout.split("Pods:\n")[1].split("\nEvents:")[0].splitlines()
    header, *cells = (row.split() for row in rows)
    assert header[5:7] == ["NODE", "DOMAIN"], header
    by_slot = sorted(workers, key=lambda w: int(w.metadata.labels[lbl.REPLICA_INDEX]))
    expected = [[w.spec.node_name, rack_label(w.spec.node_name, pools)] for w in by_slot]
    assert [row[5:7] for row in cells if row[1] == lbl.ROLE_WORKER] == expected, rows


def test_kueue_places_a_queued_job_in_the_one_rack_that_fits_it(
    make_job: JobMaker,
    isolated_pool: Callable[..., NodePool],
    api_client: Any,
    namespace: str,
    kueue: Kueue,
) -> None:
    """Through Kueue's topology-aware scheduling the rack is chosen for the whole job before a
    pod is placed: of racks of one, one and three nodes, a job of three workers goes to the
    third, where the plain path's first worker lands in a full rack 2 times in 5."""
    group = f"tas-{secrets.token_hex(3)}"
    pools = [
        isolated_pool(nodes=n, labels={RACK: f"{group}-rack{i}", TAS_GROUP: group})
        for i, n in enumerate((1, 1, 3))
    ]
    with tas_queue_made(api_client, namespace, group, workers=3):
        job = make_job.create(queued_packed_job("tas", pools, group, RACK, workers=3))
        workers = job.wait_running(3, timeout=90)
        racks = {rack_of(w.spec.node_name, pools) for w in workers}
        assert racks == {pools[2].name}, f"workers on {sorted(racks)}, not the 3-node rack"
        for worker in workers:  # Kueue's TopologyUngater named each worker's node, the lowest level
            selector = worker.spec.node_selector or {}
            assert selector.get("kubernetes.io/hostname") == worker.spec.node_name, selector
            assert not worker.spec.scheduling_gates


def test_kueue_places_a_job_asking_no_topology_on_a_topology_flavour_once(
    make_job: JobMaker,
    isolated_pool: Callable[..., NodePool],
    api_client: Any,
    namespace: str,
    kueue: Kueue,
) -> None:
    """A flavour with a Topology places every pod set it admits, asked or not: the workers of
    a job that asks for no topology wait for Kueue's ungater too (unconstrained) and run on
    the nodes Kueue assigned, where Kueue counts them — not on nodes the scheduler picked
    beside Kueue's count, which made Kueue see those nodes fuller than they are."""
    group = f"free-{secrets.token_hex(3)}"
    pools = [isolated_pool(nodes=2, labels={RACK: f"{group}-rack", TAS_GROUP: group})]
    with tas_queue_made(api_client, namespace, group, workers=2):
        body = job_manifest("free", pools, replicas={"min": 2, "max": 2})
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": group}
        job = make_job.create(body)
        for worker in job.wait_running(2, timeout=90):
            selector = worker.spec.node_selector or {}
            assert selector.get("kubernetes.io/hostname") == worker.spec.node_name, selector
            annotations = worker.metadata.annotations or {}
            assert annotations.get("kueue.x-k8s.io/podset-unconstrained-topology") == "true"


def test_under_kueue_consecutive_slots_share_a_rack(
    make_job: JobMaker,
    isolated_pool: Callable[..., NodePool],
    api_client: Any,
    namespace: str,
    kueue: Kueue,
) -> None:
    """Ranks follow slots (tests/elastic/test_rank_order.py), and Kueue gives the slots in
    topology order (the Workload's podIndexLabel): a job of six whole-node workers asking for
    one group of three racks of two nodes has slots 0 and 1 in the first rack, 2 and 3 in the
    second, 4 and 5 in the third — so every rank's data-parallel neighbour shares its rack.
    Placed by chance, one placement in 90 would do that."""
    group = f"rank-{secrets.token_hex(3)}"
    pools = [
        isolated_pool(nodes=2, labels={RACK: f"{group}-rack{rack}", TAS_GROUP: group})
        for rack in range(3)
    ]
    with tas_queue_made(api_client, namespace, group, workers=6, levels=(TAS_GROUP, *LEVELS)):
        job = make_job.create(queued_packed_job("ranks", pools, group, TAS_GROUP, workers=6))
        workers = job.wait_running(6, timeout=90)
        by_slot = sorted(workers, key=lambda w: int(w.metadata.labels[lbl.REPLICA_INDEX]))
        racks = [rack_label(w.spec.node_name, pools) for w in by_slot]
        assert racks == [f"{group}-rack{i // 2}" for i in range(6)], racks


def test_under_kueue_a_worker_lost_with_its_node_is_replaced_in_its_rack(
    make_job: JobMaker,
    isolated_pool: Callable[..., NodePool],
    api_client: Any,
    namespace: str,
    kueue: Kueue,
    cluster: Cluster,
) -> None:
    """Kueue's node hot swap: a node of the admitted assignment lost, Kueue finds another
    node for it in the same rack, and the worker torchkube creates in its place (gated until
    Kueue names its node) lands there. Two racks of three nodes, each node a failure domain
    of its own, so one node is lost alone."""
    group = f"swap-{secrets.token_hex(3)}"
    pools = [
        isolated_pool(nodes=1, labels={RACK: f"{group}-rack{rack}", TAS_GROUP: group})
        for rack in range(2)
        for _ in range(3)
    ]
    with tas_queue_made(api_client, namespace, group, workers=2):
        grace = 5
        body = queued_packed_job(
            "swap", pools, group, RACK, workers=2, failurePolicy={"nodeLostGraceSeconds": grace}
        )
        job = make_job.create(body)
        workers = job.wait_running(2, timeout=90)
        [rack] = {rack_label(w.spec.node_name, pools) for w in workers}
        victim = workers[0]
        lost_node = victim.spec.node_name
        faults.make_node_not_ready(cluster, lost_node, wait=True)

        def replaced() -> list[Any] | None:
            running = job.running_workers()
            fresh = [w for w in running if w.metadata.name != victim.metadata.name]
            return running if len(fresh) == 2 and len(running) == 2 else None

        running = job.wait(replaced, grace + 120, "the lost worker replaced")
        racks = {rack_label(w.spec.node_name, pools) for w in running}
        assert racks == {rack}, f"the replacement left rack {rack}: {sorted(racks)}"
        assert lost_node not in {w.spec.node_name for w in running}
        # Kueue's TopologyUngater named the replacement's node from the assignment: had Kueue
        # not swapped the lost node out of it, the replacement would wait for that node.
        [fresh] = [w for w in running if w.metadata.name not in {x.metadata.name for x in workers}]
        selector = fresh.spec.node_selector or {}
        assert selector.get("kubernetes.io/hostname") == fresh.spec.node_name, selector


def queued_packed_job(
    name: str, pools: list[NodePool], group: str, level: str, workers: int, **spec: Any
) -> dict[str, Any]:
    """A job of ``workers`` asking for one ``level`` domain, queued in ``group``'s LocalQueue
    and placed by Kueue alone (no pool affinity of the test's own)."""
    body = job_manifest(
        name,
        pools,
        replicas={"min": workers, "max": workers},
        scheduling={"topology": {"level": level}},
        **spec,
    )
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": group}
    body["spec"]["scheduling"].pop("affinity")
    return body


@contextlib.contextmanager
def tas_queue_made(
    api_client: Any, namespace: str, group: str, workers: int, levels: tuple[str, ...] = LEVELS
) -> Iterator[None]:
    """:func:`tas_queue`'s objects made for the block, deleted after it however it ended."""
    custom = client.CustomObjectsApi(api_client)
    objects = tas_queue(group, workers, levels)
    try:
        for plural, body in objects:
            if plural == "localqueues":
                custom.create_namespaced_custom_object(*KUEUE, namespace, plural, body)
            else:
                custom.create_cluster_custom_object(*KUEUE, plural, body)
        yield
    finally:
        for plural, body in reversed(objects):
            with contextlib.suppress(client.ApiException):
                if plural == "localqueues":
                    custom.delete_namespaced_custom_object(
                        *KUEUE, namespace, plural, body["metadata"]["name"]
                    )
                else:
                    custom.delete_cluster_custom_object(*KUEUE, plural, body["metadata"]["name"])


def tas_queue(
    group: str, workers: int, levels: tuple[str, ...] = LEVELS
) -> list[tuple[str, dict[str, Any]]]:
    """A Topology (by default rack, then node), a ResourceFlavor on the group's nodes that
    points at it, a ClusterQueue with ``workers`` workers' worth of GPUs on it and a
    LocalQueue, all named ``group``."""
    meta = {"name": group}
    quota = [
        {"name": "cpu", "nominalQuota": "100"},
        {"name": "memory", "nominalQuota": "1Ti"},
        {"name": "nvidia.com/gpu", "nominalQuota": str(workers * 8)},
    ]
    return [
        (
            "topologies",
            {
                **kind("Topology"),
                "metadata": meta,
                "spec": {"levels": [{"nodeLabel": k} for k in levels]},
            },
        ),
        (
            "resourceflavors",
            {
                **kind("ResourceFlavor"),
                "metadata": meta,
                "spec": {
                    "nodeLabels": {TAS_GROUP: group},
                    "tolerations": [kwok_toleration()],
                    "topologyName": group,
                },
            },
        ),
        (
            "clusterqueues",
            {
                **kind("ClusterQueue"),
                "metadata": meta,
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [{"name": group, "resources": quota}],
                        }
                    ],
                },
            },
        ),
        ("localqueues", {**kind("LocalQueue"), "metadata": meta, "spec": {"clusterQueue": group}}),
    ]


def kind(name: str) -> dict[str, str]:
    return {"apiVersion": "/".join(KUEUE), "kind": name}
