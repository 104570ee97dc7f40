"""Topology placement: does ``spec.scheduling.topology`` put a job's workers in one rack or
block, how long does it take to start, and what does a job wait with when no rack has room —
with the real Kueue's topology-aware scheduling and without Kueue (the scheduler's pod
affinity), against the same jobs without a topology request, in the same run.

Run: ``python -m bench.topology_placement`` (≈ 10 min on 2 cores with the defaults: 3 trials
per way and size, 3 lost-node trials per way, 3 fragmentation trials per way, one outside
Kueue).

The cluster: 64 KWOK nodes of 8 GPUs labelled 4 blocks × 4 racks × 4 nodes
(``example.com/block``: ``b0``…``b3``, ``example.com/rack``: ``b0-r0``…``b3-r3``, values
unique across blocks because the plain path compares the rack label's value alone), one kwok
process per block. Kueue v0.17.0 (testbed.kueue) beside it with a Topology of the levels block,
rack, ``kubernetes.io/hostname``, a ResourceFlavor of the 64 nodes pointing at it, a
ClusterQueue holding all 512 GPUs (a job never waits for quota) and a LocalQueue.

A worker takes a whole node (8 GPUs) unless its size says otherwise, so where it runs says
what placed it. The sizes
and what they ask (``--sizes``), chosen so that each asks for something the layout has:

- **4 workers, required rack**: a rack is 4 nodes, so the job fills one rack exactly;
- **16 workers, required block**: a block is 16 nodes, one block exactly;
- **64 workers of 2 GPUs, required block**: four workers a node, so a block holds the job
  exactly (64 whole-node workers would be the whole cluster, which no block has room for):
  what asking costs at 64 workers, the scheduler's inter-pod affinity over 64 pods and
  Kueue's placement of 64, packed.

Four ways, rotated trial by trial (bench.common.rotated), size by size: **without Kueue,
topology** (the job's pod-affinity term, torchkube/operator/topology.py), **without Kueue,
none** (the same job without ``scheduling.topology``), **Kueue, topology** (the job names the
LocalQueue: its Workload's worker pod set carries the ``topologyRequest``, pods gated until
Kueue's TopologyUngater names their node) and **Kueue, none** (queued, no request). Per trial:
apply → every worker seen Running (a watch), the domains the workers' nodes are in at the
size's level (in one domain or not), the 1-minute load average at the trial's start.

**A lost node**: a job of three whole-node workers (``required: rack`` on the ways that ask,
so its rack keeps one node free) loses one worker's node — the Node deleted, as a cloud
provider removes a machine. torchkube force-deletes the lost pod and creates its replacement at
once; without Kueue the replacement's pod affinity keeps it beside the survivors, with Kueue
its node comes from the Workload's assignment, from which Kueue swaps the deleted node out for
another in the rack (its node hot swap). Timed: the delete request → the replacement Running;
recorded: the racks the workers run in after it. The node is re-created after each trial.

**Fragmentation**: one node of every rack is held by other work, so the cluster has 48 free
nodes but no rack with room for a 4-worker ``required: rack`` job (``pendingTimeoutSeconds:
5``). The holders are other TrainingJobs of one whole-node worker, queued in the same
ClusterQueue (a Kueue cluster's usual tenants; the path without Kueue places around them just
the same). The job waits, and the benchmark records what it waits with: without Kueue the
first worker lands in some rack, as many as fit follow it, the rest stay Pending, and the
``PodsUnschedulable`` condition names the level and the rack; with Kueue no pod is made and the
``Queued`` condition carries Kueue's words. Then one rack is freed (its holder job deleted):
without Kueue the rack the job's workers are in (the one the condition names: the job is bound
to it), with Kueue a rack in turn (any will do: nothing of the job is placed). Timed: the
delete request → all 4 workers Running.

Then, Kueue's way alone, the same racks held by bare pods outside Kueue (no queue): Kueue's
topology-aware scheduling counts what they use, but a queued Workload it found no room for is
looked at again only when something in its queue changes (another Workload admitted,
finished or deleted, the queue itself), not when a pod outside it ends. The trial records
whether the job started within ``--outside-kueue-cap`` seconds of the rack being freed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.common import Figure, Results, command_line, load_average, log, rotated, spread
from bench.kube import BENCH_LABEL, PodTimes, PodWatch, Stack, job_body, stack
from bench.operator_scale import all_running
from bench.queued_start import KUEUE_API, QUEUE, ensure_local_queue, is_active
from testbed import faults
from testbed.kueue import Kueue
from testbed.kwok import GPU_RESOURCE, NodePool, kwok_toleration
from testbed.wait import wait_for
from torchkube.api import GROUP, PLURAL, VERSION
from torchkube.api import labels as lbl
from torchkube.operator import conditions as cond
from torchkube.operator import workloads

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
LEVELS = {"block": BLOCK, "rack": RACK}
"""A size's level by its short name (``--sizes``)."""
NODE_GROUP = "topology"
"""The value of bench.kube.BENCH_LABEL on every node: the jobs' and the flavor's selector."""
GPUS_PER_NODE = 8
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TOPOLOGY = "block-rack-node"
"""Kueue's Topology: its name is what Kueue's messages name."""
PENDING_TIMEOUT_S = 5
"""The fragmentation job's ``pendingTimeoutSeconds``: how soon the plain path reports."""

WITHOUT, WITHOUT_NONE = "without Kueue, topology", "without Kueue, none"
KUEUE, KUEUE_NONE = "Kueue, topology", "Kueue, none"
WAYS = (WITHOUT, WITHOUT_NONE, KUEUE, KUEUE_NONE)
ASKING = {WITHOUT_NONE: WITHOUT, KUEUE_NONE: KUEUE}
"""Each way without a topology request and the way that asks for one on the same path."""


# ----------------------------------------------------------------------------- the layout
@dataclass(frozen=True)
class Size:
    """A job of the placement case: ``workers`` workers of ``gpus`` GPUs each (a whole node
    by default) asking ``mode`` at the level named ``level`` (``rack`` or ``block``)."""

    workers: int
    level: str
    mode: str
    gpus: int = GPUS_PER_NODE

    @property
    def label(self) -> str:
        each = "" if self.gpus == GPUS_PER_NODE else f" of {self.gpus} GPUs"
        return f"{self.workers} workers{each}, {self.mode} {self.level}"

    @property
    def key(self) -> str:
        return LEVELS[self.level]

    def fits(self, racks: int, nodes: int) -> bool:
        """Whether one domain of the level has room for the job on empty nodes (a rack is
        ``nodes`` nodes, a block ``racks`` racks): the goal of 100 % in one domain holds only
        then."""
        room = nodes if self.level == "rack" else racks * nodes
        return self.workers <= room * (GPUS_PER_NODE // self.gpus)


def parse_sizes(text: str) -> list[Size]:
    """``4:rack:required,64:block:required:2``: workers, level, mode and optionally the GPUs
    of each worker (a whole node without)."""
    sizes = []
    for part in text.split(","):
        workers, level, mode, *gpus = part.split(":")
        each = int(gpus[0]) if gpus else GPUS_PER_NODE
        if level not in LEVELS or mode not in ("required", "preferred") or len(gpus) > 1:
            raise argparse.ArgumentTypeError(
                f"{part}: workers:level:mode[:gpus], level rack|block, mode required|preferred"
            )
        if each < 1 or GPUS_PER_NODE % each:
            raise argparse.ArgumentTypeError(f"{part}: GPUs a worker must divide {GPUS_PER_NODE}")
        sizes.append(Size(int(workers), level, mode, each))
    return sizes


def layout(blocks: int, racks: int, nodes: int) -> list[NodePool]:
    """One pool per rack, labelled with its block and rack; a block's racks share one kwok
    process (its failure domain), so 4 blocks cost 4 processes, not 16."""
    return [
        NodePool(
            name=f"b{b}-r{r}",
            nodes=nodes,
            gpus_per_node=GPUS_PER_NODE,
            domain=f"b{b}",
            labels={BENCH_LABEL: NODE_GROUP, BLOCK: f"b{b}", RACK: f"b{b}-r{r}"},
        )
        for b in range(blocks)
        for r in range(racks)
    ]


def node_labels(pools: Iterable[NodePool]) -> dict[str, dict[str, str]]:
    """Each node's labels as the pools give them: where a worker's node is, without asking
    the API trial after trial."""
    return {node: dict(pool.labels) for pool in pools for node in pool.node_names()}


def domains_of(
    nodes: Iterable[str], labels: Mapping[str, Mapping[str, str]], level: str
) -> list[str]:
    """The distinct values of ``level`` on ``nodes``, sorted; a node without the label (or
    unknown) counts as a domain of its own, named by the node, so it can never make a job
    look packed."""
    return sorted({labels.get(node, {}).get(level) or f"?{node}" for node in nodes})


def in_one_domain(
    nodes: Iterable[str], labels: Mapping[str, Mapping[str, str]], level: str
) -> bool:
    """Whether all the workers' nodes share one value of ``level`` (no node: not placed)."""
    return len(domains_of(nodes, labels, level)) == 1


# ----------------------------------------------------------------------------- Kueue
def kueue_objects(nodes: int) -> list[tuple[str, dict[str, Any]]]:
    """(plural, body) of the cluster-scoped objects in the order they must be made: the
    Topology (block, rack, node), the ResourceFlavor of the benchmark's nodes pointing at it
    and a ClusterQueue with all their GPUs (and room to spare for CPU and memory: the store
    pod asks for some, and every requested resource must be covered)."""
    version = "/".join(KUEUE_API)
    levels = [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]
    flavor = {
        "nodeLabels": {BENCH_LABEL: NODE_GROUP},
        "tolerations": [kwok_toleration()],
        "topologyName": TOPOLOGY,
    }
    quota = [
        {"name": "cpu", "nominalQuota": "1000"},
        {"name": "memory", "nominalQuota": "10Ti"},
        {"name": GPU_RESOURCE, "nominalQuota": str(nodes * GPUS_PER_NODE)},
    ]
    groups = [
        {
            "coveredResources": [q["name"] for q in quota],
            "flavors": [{"name": QUEUE, "resources": quota}],
        }
    ]
    meta = {"name": QUEUE}
    return [
        ("topologies", {"apiVersion": version, "kind": "Topology",
                        "metadata": {"name": TOPOLOGY},
                        "spec": {"levels": levels}}),
        ("resourceflavors", {"apiVersion": version, "kind": "ResourceFlavor", "metadata": meta,
                             "spec": flavor}),
        ("clusterqueues", {"apiVersion": version, "kind": "ClusterQueue", "metadata": meta,
                           "spec": {"namespaceSelector": {}, "resourceGroups": groups}}),
    ]  # fmt: skip


def make_tas_queue(bench: Stack, nodes: int) -> None:
    """The Topology, flavor and ClusterQueue, the last seen Active before any trial."""
    custom = client.CustomObjectsApi(bench.api)
    for plural, body in kueue_objects(nodes):
        custom.create_cluster_custom_object(*KUEUE_API, plural, body)
    wait_for(
        lambda: is_active(custom.get_cluster_custom_object(*KUEUE_API, "clusterqueues", QUEUE)),
        60,
        what=f"ClusterQueue {QUEUE} to be Active",
    )


# ----------------------------------------------------------------------------- jobs
def trial_job(name: str, size: Size, way: str, pending_timeout: int | None = None) -> Any:
    """The benchmark's TrainingJob (bench.kube.job_body: whole-node workers on the
    benchmark's nodes) asking for ``size``'s topology unless ``way`` asks none, queued in the
    LocalQueue on Kueue's ways."""
    body = job_body(name, size.workers, gpus=size.gpus, group=NODE_GROUP)
    scheduling = body["spec"]["scheduling"]
    if way in (WITHOUT, KUEUE):
        scheduling["topology"] = {"level": size.key, "mode": size.mode}
    if pending_timeout is not None:
        scheduling["pendingTimeoutSeconds"] = pending_timeout
    if way in (KUEUE, KUEUE_NONE):
        body["metadata"]["labels"] = {QUEUE_LABEL: QUEUE}
    return body


def workers_of(name: str) -> str:
    return f"{lbl.JOB_NAME}={name},{lbl.ROLE}={lbl.ROLE_WORKER}"


def running_nodes(pods: PodWatch, name: str) -> list[str]:
    """The nodes of the job's live workers."""
    with pods.cond:
        return [p.node for p in pods.live(job=name) if p.node]


def condition(bench: Stack, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
    """The job's condition ``kind`` while it is True."""
    job = bench.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    found = [c for c in (job.get("status") or {}).get("conditions", []) if c["type"] == kind]
    return found[0] if found and found[0].get("status") == "True" else None


def finish(bench: Stack, namespace: str) -> None:
    """The namespace's TrainingJobs deleted, and their pods and Workloads gone: capacity and
    quota back before the next trial (Kueue releases a Workload's topology assignment when it
    goes). The namespace stays, with its claim and LocalQueue, for the next trial."""
    custom, core = bench.custom, bench.core
    custom.delete_collection_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, propagation_policy="Background"
    )

    def gone() -> bool:
        kinds = [(GROUP, VERSION, PLURAL)]
        kinds.append((workloads.API_GROUP, workloads.API_VERSION, workloads.PLURAL))
        if core.list_namespaced_pod(namespace, limit=1).items:
            return False
        return not any(
            custom.list_namespaced_custom_object(group, version, namespace, plural, limit=1)[
                "items"
            ]
            for group, version, plural in kinds
        )

    wait_for(gone, 180, interval=0.5, what=f"the jobs, pods and Workloads of {namespace} gone")


# ----------------------------------------------------------------------------- placement
class Placement:
    """The placement case's figures, filled trial by trial."""

    def __init__(self, results: Results, sizes: list[Size], labels: dict[str, dict[str, str]]):
        self.results, self.sizes, self.labels = results, sizes, labels
        self.running: dict[tuple[str, str], Figure] = {}
        self.domains: dict[tuple[str, str], Figure] = {}
        for size in sizes:
            for way in WAYS:
                title = f"{size.label}, {way}"
                self.running[(way, size.label)] = results.figure(
                    f"{title}: apply → all Running", "s"
                )
                self.domains[(way, size.label)] = results.figure(
                    f"{title}: {size.level}s the workers ran in", ""
                )

    def trial(self, bench: Stack, namespace: str, way: str, size: Size, serial: int,
              record: bool = True) -> None:  # fmt: skip
        name = f"t{serial}"
        body = trial_job(name, size, way)
        timeout = 180 + 2 * size.workers
        with PodWatch(bench.api, namespace, workers_of(name)) as pods:
            load = load_average()
            started = time.monotonic()
            bench.create_job(namespace, body)
            running = all_running(pods, size.workers, timeout, f"{size.label}, {way}") - started
            nodes = running_nodes(pods, name)
        domains = domains_of(nodes, self.labels, size.key)
        log(
            f"{size.label}, {way}: all Running {running:.2f}s in {len(domains)} "
            f"{size.level}(s), load {load:.1f}" + ("" if record else " (warm-up, not recorded)")
        )
        finish(bench, namespace)
        if not record:
            return
        self.running[(way, size.label)].add(running, load)
        self.domains[(way, size.label)].add(len(domains), load)
        self.results.extra.setdefault("placement", []).append(
            {
                "way": way,
                "size": size.label,
                "workers": size.workers,
                "level": size.key,
                "mode": size.mode,
                "all_running_s": round(running, 3),
                "domains": domains,
                "in_one_domain": in_one_domain(nodes, self.labels, size.key),
                "nodes": sorted(nodes),
                "load_at_start": load,
            }
        )

    def table(self) -> None:
        """Per size and way: how many trials ran in one domain, the domains and the time."""
        trials = self.results.extra.get("placement", [])
        rows = []
        for size in self.sizes:
            for way in WAYS:
                mine = [t for t in trials if t["way"] == way and t["size"] == size.label]
                packed = sum(t["in_one_domain"] for t in mine)
                running = self.running[(way, size.label)]
                rows.append(
                    [
                        size.label,
                        way,
                        f"{packed} of {len(mine)}",
                        spread(self.domains[(way, size.label)]),
                        spread(running),
                        ", ".join(f"{x:.1f}" for x in running.loads),
                    ]
                )
        headers = ["job", "way", "in one domain", "domains", "apply → all Running", "load"]
        self.results.tables["placement: workers in one domain, apply → all Running"] = (
            headers,
            rows,
        )


# ----------------------------------------------------------------------------- a lost node
LOST_NODE_CAP_S = 240
"""How long a trial waits for the lost worker's replacement to run before it gives up."""


class LostNode:
    """The lost-node case: a job of a rack's nodes but one (``--lost-node-workers``,
    ``required: rack`` on the ways that ask) loses a worker's node — the Node deleted, as a
    cloud provider removes a machine: torchkube replaces the lost pod at once (Kueue's
    topology-aware scheduling swaps the node out of the Workload's assignment at once too).
    Timed: the delete request → the replacement Running beside the survivors; and the racks
    the workers run in after it. The node is re-created (same name and labels) once the
    trial's job is gone."""

    def __init__(
        self, results: Results, size: Size, labels: dict[str, dict[str, str]],
        pools: list[NodePool],
    ) -> None:  # fmt: skip
        self.results, self.size, self.labels = results, size, labels
        self.pool_of = {node: pool.name for pool in pools for node in pool.node_names()}
        self.back: dict[str, Figure] = {}
        self.racks: dict[str, Figure] = {}
        for way in WAYS:
            title = f"lost node, {size.label}, {way}"
            self.back[way] = results.figure(f"{title}: node deleted → replacement Running", "s")
            self.racks[way] = results.figure(f"{title}: racks after the replacement", "")

    def trial(self, bench: Stack, namespace: str, way: str, serial: int) -> None:
        name, workers = f"n{serial}", self.size.workers
        with PodWatch(bench.api, namespace, workers_of(name)) as pods:
            bench.create_job(namespace, trial_job(name, self.size, way))
            all_running(pods, workers, 180, f"lost node, {self.size.label}, {way}")
            with pods.cond:
                before = {p.uid: p.node for p in pods.live(job=name)}
            packed = in_one_domain(before.values(), self.labels, RACK)
            lost = sorted(node for node in before.values() if node)[0]
            load = load_average()
            deleted_at = time.monotonic()
            faults.delete_node(bench.api, lost, wait=False)
            try:
                back = (
                    pods.wait(
                        lambda seen: replaced(seen, before, lost, workers),
                        LOST_NODE_CAP_S,
                        "the replacement",
                    )
                    - deleted_at
                )
            except TimeoutError as exc:
                log(f"lost node, {way}: {exc}")
                back = None
            with pods.cond:
                after = {p.uid: p.node for p in pods.live(job=name)}
        racks = domains_of([n for n in after.values() if n], self.labels, RACK)
        lost_rack = rack_of(self.labels, lost)
        log(
            f"lost node, {self.size.label}, {way}: {lost} ({lost_rack}) deleted, replacement "
            + ("not Running" if back is None else f"Running {back:.2f}s later")
            + f", workers in {len(racks)} rack(s): {', '.join(racks)}, load {load:.1f}"
        )
        finish(bench, namespace)
        bench.cluster.ensure_pool_nodes(self.pool_of[lost])
        bench.cluster.wait_pool_ready(self.pool_of[lost])
        if back is not None:
            self.back[way].add(back, load)
            self.racks[way].add(len(racks), load)
        self.results.extra.setdefault("lost_node", []).append(
            {
                "way": way,
                "job": self.size.label,
                "packed_before": packed,
                "lost_node": lost,
                "lost_rack": lost_rack,
                "replacement_running_s": None if back is None else round(back, 3),
                "racks_after": racks,
                "stayed_in_rack": racks == [lost_rack],
                "workers_replaced": len(set(after) - set(before)),
                "load_at_delete": load,
            }
        )

    def table(self) -> None:
        trials = self.results.extra.get("lost_node", [])
        rows = []
        for way in WAYS:
            mine = [t for t in trials if t["way"] == way]
            stayed = sum(t["stayed_in_rack"] for t in mine)
            rows.append(
                [
                    way,
                    f"{stayed} of {len(mine)}",
                    spread(self.racks[way]),
                    spread(self.back[way]),
                    ", ".join(f"{x:.1f}" for x in self.back[way].loads),
                ]
            )
        headers = ["way", "all in the lost node's rack", "racks", "deleted → Running", "load"]
        title = f"lost node: {self.size.label}, one worker's node deleted"
        self.results.tables[title] = (headers, rows)


def replaced(
    seen: Mapping[str, PodTimes], before: Mapping[str, str | None], lost: str, workers: int
) -> float | None:
    """When the job is whole again after ``lost`` went: ``workers`` live workers all Running,
    none on ``lost``, at least one new (not in ``before``, by uid); the instant the last new
    one was seen Running. None until then."""
    live = [p for p in seen.values() if p.deleted is None and p.terminated is None]
    fresh = [p for p in live if p.uid not in before]
    if len(live) != workers or not fresh or any(p.running is None for p in live):
        return None
    if any(p.node == lost for p in live):
        return None
    return max(p.running or 0.0 for p in fresh)


def lost_node(
    bench: Stack, namespace: str, results: Results, pools: list[NodePool], args: argparse.Namespace
) -> None:
    """The lost-node case, the four ways rotated trial by trial."""
    if not args.lost_node_trials:
        return
    size = Size(args.lost_node_workers, "rack", "required")
    case = LostNode(results, size, node_labels(pools), pools)
    serial = 0
    for trial in range(args.lost_node_trials):
        for way in rotated(WAYS, trial):
            serial += 1
            case.trial(bench, namespace, way, serial)
    case.table()


# ----------------------------------------------------------------------------- fragmentation
JOB_HOLDS, POD_HOLDS = "queued jobs", "pods outside Kueue"
"""What holds one node of every rack in the fragmentation case: other TrainingJobs admitted
through the same ClusterQueue (a Kueue cluster's usual tenants), or bare pods Kueue does not
manage (which its topology-aware scheduling counts, but whose end it is not told of)."""


def holding_pod(node: str) -> dict[str, Any]:
    """A bare pod holding all of ``node``'s GPUs, outside any queue."""
    gpus = {GPU_RESOURCE: str(GPUS_PER_NODE)}
    container = {
        "name": "hold",
        "image": "busybox",
        "resources": {"requests": gpus, "limits": gpus},
    }
    spec = {
        "nodeSelector": {HOST: node},
        "tolerations": [kwok_toleration()],
        "containers": [container],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"hold-{node}"},
            "spec": spec}  # fmt: skip


def holding_job(node: str) -> dict[str, Any]:
    """A queued TrainingJob of one whole-node worker pinned to ``node``: another team's job."""
    body = job_body(f"hold-{node}", 1, gpus=GPUS_PER_NODE, group=NODE_GROUP)
    body["spec"]["scheduling"]["nodeSelector"][HOST] = node
    body["metadata"]["labels"] = {QUEUE_LABEL: QUEUE}
    return body


class Holders:
    """One node of every rack held by other work (``kind``: :data:`JOB_HOLDS` or
    :data:`POD_HOLDS`), in a namespace of its own (none of the trials' watches or deletions
    see it)."""

    def __init__(self, bench: Stack, namespace: str, nodes: list[str], kind: str) -> None:
        self.bench, self.namespace, self.nodes, self.kind = bench, namespace, nodes, kind

    def hold(self, node: str) -> None:
        """A holder on ``node``, once the one before it (same name) is gone."""
        wait_for(lambda: self.gone(node), 180, interval=0.5, what=f"hold-{node} gone")
        if self.kind == JOB_HOLDS:
            self.bench.create_job(self.namespace, holding_job(node))
        else:
            self.bench.core.create_namespaced_pod(self.namespace, holding_pod(node))

    def gone(self, node: str) -> bool:
        """No holder of ``node`` left: neither its job nor its pod."""
        name = f"hold-{node}"
        if self.kind == JOB_HOLDS:
            jobs = self.bench.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, field_selector=f"metadata.name={name}"
            )["items"]
            pods = self.bench.core.list_namespaced_pod(
                self.namespace, label_selector=workers_of(name)
            )
            return not jobs and not pods.items
        pods = self.bench.core.list_namespaced_pod(
            self.namespace, field_selector=f"metadata.name={name}"
        )
        return not pods.items

    def holding(self) -> set[str]:
        """The nodes a holder runs on (its pod Running)."""
        pods = self.bench.core.list_namespaced_pod(self.namespace).items
        return {
            p.spec.node_name
            for p in pods
            if (p.metadata.labels or {}).get(lbl.ROLE) != lbl.ROLE_RENDEZVOUS
            and p.status.phase == "Running"
            and p.metadata.deletion_timestamp is None
        }

    def wait_held(self, nodes: list[str]) -> None:
        wait_for(
            lambda: set(nodes) <= self.holding(),
            180,
            interval=0.5,
            what=f"{self.kind} holding {len(nodes)} node(s)",
        )

    def fill(self) -> None:
        for node in self.nodes:
            self.hold(node)
        self.wait_held(self.nodes)

    def release(self, node: str) -> None:
        """The holder of ``node`` gone: its job deleted (its pods and Workload go with it), or
        its pod deleted with grace 0."""
        if self.kind == JOB_HOLDS:
            self.bench.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, f"hold-{node}",
                propagation_policy="Background",
            )  # fmt: skip
        else:
            self.bench.core.delete_namespaced_pod(
                f"hold-{node}", self.namespace, grace_period_seconds=0
            )

    def clear(self) -> None:
        """Every holder gone, so the next kind can fill the racks."""
        if self.kind == POD_HOLDS:
            self.bench.core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)
        finish(self.bench, self.namespace)


class Fragmentation:
    """Every rack one node short: a job that needs a whole rack waits; a rack freed, it
    starts."""

    def __init__(self, results: Results, pools: list[NodePool]) -> None:
        self.results = results
        self.labels = node_labels(pools)
        self.size = Size(pools[0].nodes, "rack", "required")
        self.held = {pool.labels[RACK]: pool.node_names()[0] for pool in pools}
        """The node of each rack its holder runs on."""
        self.waited: dict[str, Figure] = {}
        self.started: dict[str, Figure] = {}
        for way in (WITHOUT, KUEUE):
            title = f"every rack one node short, {self.size.label}, {way}"
            self.waited[way] = results.figure(f"{title}: apply → the wait reported", "s")
            self.started[way] = results.figure(
                f"{title}: a rack's queued job deleted → all Running", "s"
            )

    def reported(self, bench: Stack, namespace: str, name: str, way: str) -> str:
        """The condition the job waits with, once it says why: PodsUnschedulable without
        Kueue; with Kueue, Queued once it carries Kueue's topology words."""
        if way == WITHOUT:
            found = condition(bench, namespace, name, cond.PODS_UNSCHEDULABLE)
            return str(found["message"]) if found else ""
        found = condition(bench, namespace, name, cond.QUEUED)
        message = str(found["message"]) if found else ""
        return message if "topology" in message else ""

    def to_free(self, way: str, racks: list[str], turn: int) -> str:
        """The rack that lets the job start: without Kueue the one its running workers hold
        (its other workers must join them there), with Kueue the next one in turn."""
        if way == WITHOUT and racks:
            return racks[0]
        return sorted(self.held)[turn % len(self.held)]

    def trial(
        self, bench: Stack, namespace: str, holders: Holders, way: str, serial: int, turn: int,
        cap: float,
    ) -> None:  # fmt: skip
        """Apply, wait for the reason, free a rack, time the start (at most ``cap`` seconds:
        a job that does not start by then is recorded as not started)."""
        name, size = f"f{serial}", self.size
        body = trial_job(name, size, way, pending_timeout=PENDING_TIMEOUT_S)
        with PodWatch(bench.api, namespace, workers_of(name)) as pods:
            load = load_average()
            started = time.monotonic()
            bench.create_job(namespace, body)
            message = wait_for(
                lambda: self.reported(bench, namespace, name, way),
                120,
                interval=0.5,
                what=f"{way}: the job's wait reported",
            )
            waited = time.monotonic() - started
            placed = running_nodes(pods, name)
            racks = sorted({rack_of(self.labels, n) for n in placed})
            rack = self.to_free(way, racks, turn)
            freed_at = time.monotonic()
            holders.release(self.held[rack])
            running = started_within(pods, size.workers, cap)
            nodes = running_nodes(pods, name)
        after = None if running is None else running - freed_at
        domains = domains_of(nodes, self.labels, RACK) if running is not None else []
        log(
            f"fragmentation ({holders.kind}), {way}: waited with {message!r} ({waited:.1f}s; "
            f"running meanwhile: {len(placed)}); {rack} freed → "
            + (f"all Running {after:.2f}s in {domains}" if after is not None else "not started")
            + f" (cap {cap:.0f}s)"
        )
        if holders.kind == JOB_HOLDS and after is not None:
            self.waited[way].add(waited, load)
            self.started[way].add(after, load)
        self.results.extra.setdefault("fragmentation", []).append(
            {
                "way": way,
                "held_by": holders.kind,
                "message": message,
                "reported_after_s": round(waited, 3),
                "workers_running_while_waiting": len(placed),
                "racks_while_waiting": racks,
                "freed_rack": rack,
                "freed_to_all_running_s": None if after is None else round(after, 3),
                "cap_s": cap,
                "domains": domains,
                "load_at_start": load,
            }
        )
        finish(bench, namespace)
        holders.hold(self.held[rack])
        holders.wait_held([self.held[rack]])


def started_within(pods: PodWatch, workers: int, cap: float) -> float | None:
    """When the last of ``workers`` was seen Running, or None when they were not by ``cap``."""
    try:
        return float(all_running(pods, workers, cap, "the freed job"))
    except TimeoutError:
        return None


def rack_of(labels: Mapping[str, Mapping[str, str]], node: str) -> str:
    return labels[node][RACK]


def fragmentation(
    bench: Stack, namespace: str, results: Results, pools: list[NodePool], args: argparse.Namespace
) -> None:
    """The fragmentation case: racks held by queued jobs, both ways rotated, then (Kueue
    only) by pods outside Kueue."""
    if not (args.fragmentation_trials or args.outside_kueue_trials):
        return
    case = Fragmentation(results, pools)
    home = bench.namespace("holders")
    ensure_local_queue(bench, home)
    serial = 0
    nodes = list(case.held.values())
    holders = Holders(bench, home, nodes, JOB_HOLDS)
    holders.fill()
    for trial in range(args.fragmentation_trials):
        for way in rotated((WITHOUT, KUEUE), trial):
            serial += 1
            case.trial(bench, namespace, holders, way, serial, trial, cap=300)
    holders.clear()
    if args.outside_kueue_trials:
        holders = Holders(bench, home, nodes, POD_HOLDS)
        holders.fill()
        for trial in range(args.outside_kueue_trials):
            serial += 1
            case.trial(bench, namespace, holders, KUEUE, serial, trial, cap=args.outside_kueue_cap)
        holders.clear()


# ----------------------------------------------------------------------------- the run
def run(args: argparse.Namespace, results: Results, scratch: Path) -> None:
    pools = layout(args.blocks, args.racks, args.nodes)
    nodes = sum(pool.nodes for pool in pools)
    with stack(pools, scratch) as bench:
        kueue = Kueue(bench.cluster).start()
        try:
            make_tas_queue(bench, nodes)
            namespace = bench.namespace("topo")
            ensure_local_queue(bench, namespace)
            serial = 0
            placement = Placement(results, args.sizes, node_labels(pools))
            results.extra["sizes"] = [
                {"job": size.label, "level": size.key, "room": size.fits(args.racks, args.nodes)}
                for size in args.sizes
            ]
            for way in WAYS:  # warm-up: first-use costs of the operator and Kueue
                serial += 1
                placement.trial(bench, namespace, way, args.sizes[0], serial, record=False)
            for trial in range(args.trials):
                for size in args.sizes:
                    for way in rotated(WAYS, trial):
                        serial += 1
                        placement.trial(bench, namespace, way, size, serial)
            placement.table()
            lost_node(bench, namespace, results, pools, args)
            fragmentation(bench, namespace, results, pools, args)
        finally:
            kueue.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.topology_placement",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes("4:rack:required,16:block:required,64:block:required:2"),
        help="workers:level:mode[:gpus] of each placement job (level rack or block; gpus a "
        "worker, a whole node without)",
    )
    parser.add_argument("--trials", type=int, default=3, help="per way and size")
    parser.add_argument(
        "--fragmentation-trials", type=int, default=3, help="per way, racks held by queued jobs"
    )
    parser.add_argument(
        "--outside-kueue-trials",
        type=int,
        default=1,
        help="Kueue's way with the racks held by pods outside Kueue",
    )
    parser.add_argument(
        "--outside-kueue-cap",
        type=float,
        default=90,
        help="seconds a job may take to start once such a rack is freed",
    )
    parser.add_argument(
        "--lost-node-trials", type=int, default=3, help="per way, one worker's node deleted"
    )
    parser.add_argument(
        "--lost-node-workers",
        type=int,
        default=3,
        help="the lost-node job's workers: fewer than a rack's nodes, so the rack has room",
    )
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--racks", type=int, default=4, help="per block")
    parser.add_argument("--nodes", type=int, default=4, help="8-GPU nodes per rack")
    return parser.parse_args(argv)


def config_of(args: argparse.Namespace) -> dict[str, Any]:
    config = dict(vars(args))
    config["sizes"] = [size.label for size in args.sizes]
    return config


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = Results(
        "topology_placement",
        command_line("bench.topology_placement", argv),
        config=config_of(args),
    )
    nodes = args.blocks * args.racks * args.nodes
    results.notes += [
        "apply → all Running: from the job's create request to the last worker first seen "
        "Running (a watch); one warm-up job of the first size per way is not counted; the "
        "four ways alternate size by size, the first of each trial rotating; load: the 1-minute "
        "load average at each trial's start",
        "in one domain: every worker's node has the same value of the size's level; domains: "
        "how many values the workers' nodes have (for a way without a topology request, at the "
        "level the same job asks for on the other ways)",
        f"{nodes} KWOK nodes of 8 GPUs: {args.blocks} blocks × {args.racks} racks × "
        f"{args.nodes} nodes ({BLOCK}, {RACK}); Kueue v0.17.0 built from source, as a process: "
        f"a Topology {TOPOLOGY!r} of the levels block, rack, {HOST}, a ResourceFlavor of the "
        "nodes pointing at it, one ClusterQueue with all their GPUs (no job waits for quota), "
        "one LocalQueue per namespace",
        f"fragmentation: one node of every rack held by a queued TrainingJob of one whole-node "
        f"worker, the job {args.nodes} workers required rack with pendingTimeoutSeconds "
        f"{PENDING_TIMEOUT_S}; the wait reported: apply → PodsUnschedulable=True (without "
        "Kueue) or Queued=True with Kueue's topology message (Kueue); a rack freed: its holder "
        "job deleted → the job's workers all Running; the freed rack: without Kueue the job's "
        "own (its running workers hold it), with Kueue each trial the next rack",
        f"lost node: a job of {args.lost_node_workers} whole-node workers (required rack on "
        "the ways that ask; a rack has room for one more) Running, the Node of one worker "
        "deleted (the first of their nodes by name); timed: the delete request → a new worker "
        "Running and none on the lost node; the racks the workers run in then; the node "
        "re-created after the trial's job is gone; the four ways rotated",
        f"outside Kueue: the same racks held by bare pods (no queue), Kueue's way alone, a "
        f"rack freed by deleting its pod (grace 0), the job given {args.outside_kueue_cap:.0f} "
        "s to start",
    ]
    with tempfile.TemporaryDirectory(prefix="torchkube-bench-") as scratch:
        run(args, results, Path(scratch))
    results.write()


if __name__ == "__main__":
    main()
