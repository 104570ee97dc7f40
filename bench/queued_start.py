"""Queued start, side by side: apply a job that names a Kueue queue → its Workload admitted →
every worker pod Running, for torchkube's TrainingJob and Kubeflow's PyTorchJob through the
same real Kueue on one cluster, and the physical limit beside them: a client with no operator
that makes the same Workload and, once it is admitted, the same pods.

Run: ``python -m bench.queued_start`` (≈ 15 min on 2 cores with the defaults: 3 trials of 8
and 64 workers, 2 of 512, per contender). ``--no-raised-peer`` leaves out Kubeflow with its
client limits raised.

A scenario of its own, not one of bench.operator_scale's: the cluster carries Kueue (v0.17.0,
built from source, testbed.kueue) configured with both integrations, its native one for
Kubeflow (``integrations.frameworks: [kubeflow.org/pytorchjob]``, whose webhook suspends a
queued PyTorchJob until Kueue admits it) and torchkube's TrainingJob as an external framework
(the operator makes and follows its Workload), and every trial adds a clock, the Workload's
admission, that the unqueued figures do not have.

One ResourceFlavor for the KWOK GPU nodes (100 × 8 GPUs, their label injected into admitted
pods), one ClusterQueue holding all of their GPUs as quota (one job at a time: quota never makes
a job wait, so the figures are the path through Kueue, not a queue's order), a LocalQueue in
each job's namespace, made and seen Active before the trial. Jobs alternate between the
contenders size by size, round by round; each trial reads off, from watches on the namespace's
Workloads and worker pods:

- **admitted**: job create sent → its Workload first seen ``Admitted`` (the operator's or
  Kueue's jobframework's Workload made, Kueue's scheduler admits it);
- **created**: → the last worker pod seen;
- **Running**: → the last worker seen ``Running`` (Kubeflow's workers: its N-1 Workers);
- **all pods Running**: → the last pod of the job seen ``Running`` (torchkube's rendezvous
  store and Kubeflow's Master too).

The load average is taken at each trial's start and end; the peers' client limits, which pace
them, are written beside the figures (bench/kubeflow.py).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from bench import kubeflow
from bench.common import (
    LIMIT,
    Figure,
    Results,
    command_line,
    fmt,
    leaving_out,
    load_average,
    log,
    record_dir_of,
    rotated,
    spread,
)
from bench.contenders import BARE_HOW, PEER, Contender, contenders, quiet, settle
from bench.kube import (
    BENCH_LABEL,
    QUIET_MARGIN_CORES,
    QUIET_WINDOW_S,
    PodWatch,
    Stack,
    WorkloadWatch,
    gpu_pools,
    stack,
)
from bench.operator_scale import COLD_WATCHES, all_created, all_running, warmed_by, warmer
from testbed.kueue import PYTORCHJOB, Kueue
from testbed.kwok import kwok_toleration
from testbed.wait import wait_for
from torchkube.operator import workloads

KUEUE_API = (workloads.API_GROUP, workloads.API_VERSION)
QUEUE = "bench"
"""The ClusterQueue, the ResourceFlavor and every LocalQueue are named so."""
GPUS_PER_NODE = 8


def queue_objects(label: str, value: str, nodes: int) -> list[tuple[str, dict[str, Any]]]:
    """(plural, body) of the cluster-scoped objects, in the order they must be made: the
    ResourceFlavor of the GPU nodes labelled ``label=value`` (injected into admitted pods with
    the KWOK toleration) and a ClusterQueue with all ``nodes`` nodes' GPUs as quota and room
    to spare for CPU and memory (the store pod asks for some: every requested resource must be
    covered, or Kueue admits nothing)."""
    flavor = {
        "apiVersion": "/".join(KUEUE_API),
        "kind": "ResourceFlavor",
        "metadata": {"name": QUEUE},
        "spec": {"nodeLabels": {label: value}, "tolerations": [kwok_toleration()]},
    }
    quota = [
        {"name": "cpu", "nominalQuota": "1000"},
        {"name": "memory", "nominalQuota": "10Ti"},
        {"name": "nvidia.com/gpu", "nominalQuota": str(nodes * GPUS_PER_NODE)},
    ]
    cluster_queue = {
        "apiVersion": "/".join(KUEUE_API),
        "kind": "ClusterQueue",
        "metadata": {"name": QUEUE},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": [q["name"] for q in quota],
                    "flavors": [{"name": QUEUE, "resources": quota}],
                }
            ],
        },
    }
    return [("resourceflavors", flavor), ("clusterqueues", cluster_queue)]


def local_queue() -> dict[str, Any]:
    return {
        "apiVersion": "/".join(KUEUE_API),
        "kind": "LocalQueue",
        "metadata": {"name": QUEUE},
        "spec": {"clusterQueue": QUEUE},
    }


def is_active(body: Any) -> bool:
    """Kueue's ``Active`` condition on a LocalQueue or ClusterQueue: it admits from it."""
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


def make_queues(bench: Stack, nodes: int, label: str, value: str) -> None:
    custom = client.CustomObjectsApi(bench.api)
    for plural, body in queue_objects(label, value, nodes):
        custom.create_cluster_custom_object(*KUEUE_API, plural, body)
    wait_for(
        lambda: is_active(custom.get_cluster_custom_object(*KUEUE_API, "clusterqueues", QUEUE)),
        60,
        what=f"ClusterQueue {QUEUE} to be Active",
    )


def ensure_local_queue(bench: Stack, namespace: str) -> None:
    """The namespace's LocalQueue, made if missing and seen Active (Kueue knows it) before a
    job is queued in it: a job queued first would wait for Kueue's retry, which is no part of
    either operator's path."""
    custom = client.CustomObjectsApi(bench.api)
    with contextlib.suppress(client.ApiException):  # 409: made for an earlier trial
        custom.create_namespaced_custom_object(*KUEUE_API, namespace, "localqueues", local_queue())
    wait_for(
        lambda: is_active(
            custom.get_namespaced_custom_object(*KUEUE_API, namespace, "localqueues", QUEUE)
        ),
        60,
        what=f"LocalQueue {namespace}/{QUEUE} to be Active",
    )


def quota_free(cluster_queue: Any) -> bool:
    """No Workload holds or waits for the ClusterQueue's quota: an earlier trial's Workload is
    deleted after its job (by the garbage collector, then Kueue's cache), so a trial started
    before that would time the previous job's release as its own admission."""
    status = cluster_queue.get("status") or {}
    held = ("reservingWorkloads", "admittedWorkloads", "pendingWorkloads")
    return not any(status.get(count) for count in held)


def wait_quota_free(bench: Stack) -> None:
    custom = client.CustomObjectsApi(bench.api)
    wait_for(
        lambda: quota_free(custom.get_cluster_custom_object(*KUEUE_API, "clusterqueues", QUEUE)),
        120,
        interval=0.2,
        what=f"ClusterQueue {QUEUE} to hold no Workload",
    )


Key = tuple[str, int]
"""(contender, workers)"""


class QueuedStart:
    """The figures of each contender and size, filled trial by trial."""

    def __init__(self, results: Results, sizes: list[int], players: list[Contender]) -> None:
        self.results, self.sizes, self.players = results, sizes, players
        self.admitted: dict[Key, Figure] = {}
        self.created: dict[Key, Figure] = {}
        self.running: dict[Key, Figure] = {}
        self.every_pod: dict[Key, Figure] = {}
        self.kueue_cpu: dict[Key, list[float]] = {}
        self.operator_cpu: dict[Key, list[float]] = {}
        for n in sizes:
            for player in players:
                key, title = (player.name, n), f"{n} workers through Kueue"
                self.admitted[key] = results.figure(
                    f"{title}: apply → Workload admitted, {player.name}", "s"
                )
                self.created[key] = results.figure(
                    f"{title}: apply → all created, {player.name}", "s"
                )
                self.running[key] = results.figure(
                    f"{title}: apply → all Running, {player.name}", "s"
                )
                self.every_pod[key] = results.figure(
                    f"{title}: apply → all pods Running, {player.name}", "s"
                )
                self.kueue_cpu[key], self.operator_cpu[key] = [], []

    def trial(self, bench: Stack, contender: Contender, workers: int, record: bool = True) -> None:
        namespace = contender.home or bench.namespace(f"queued{workers}")
        ensure_local_queue(bench, namespace)
        wait_quota_free(bench)
        name = f"job{workers}"
        worker_pods, every = contender.pod_counts(workers)
        is_worker = contender.is_worker
        with (
            PodWatch(bench.api, namespace, contender.pod_selector) as pods,
            WorkloadWatch(bench.api, namespace) as queued,
        ):
            quiet_wait = quiet(bench, self.players)
            cpu_before = contender.cpu_seconds()
            load = load_average()
            kueue_before = bench.component_cpu_seconds().get("kueue", 0.0)
            started = time.monotonic()
            contender.submit(bench, namespace, name, workers, queue=QUEUE)
            timeout = 120 + workers
            admitted = queued.wait_admitted(timeout, contender.name) - started
            what = f"{contender.name}'s job of {workers}"
            created = all_created(pods, worker_pods, timeout, what, is_worker) - started
            running = all_running(pods, worker_pods, timeout, what, is_worker) - started
            kueue = bench.component_cpu_seconds().get("kueue", 0.0) - kueue_before
            every_pod = all_running(pods, every, timeout, what) - started
            load_end = load_average()
        settle(contender)
        cpu = contender.cpu_seconds() - cpu_before
        log(
            f"{contender.name}, {workers} workers through Kueue: admitted {admitted:.2f}s, "
            f"created {created:.2f}s, Running {running:.2f}s (all {every} pods "
            f"{every_pod:.2f}s), Kueue CPU {kueue:.2f}s, "
            f"operator CPU {cpu:.2f}s, load {load:.1f} → {load_end:.1f}"
            + ("" if record else " (warm-up, not recorded)")
        )
        if record:
            key = (contender.name, workers)
            self.admitted[key].add(admitted, load)
            self.created[key].add(created, load)
            self.running[key].add(running, load)
            self.every_pod[key].add(every_pod, load)
            self.kueue_cpu[key].append(kueue)
            self.operator_cpu[key].append(cpu)
            self.results.extra.setdefault("trials", []).append(
                {
                    "operator": contender.name,
                    "workers": workers,
                    "admitted_s": round(admitted, 3),
                    "all_created_s": round(created, 3),
                    "all_running_s": round(running, 3),
                    "worker_pods": worker_pods,
                    "pods": every,
                    "all_pods_running_s": round(every_pod, 3),
                    "kueue_cpu_s": round(kueue, 2),
                    "operator_cpu_s": round(cpu, 2),
                    "load_at_start": load,
                    "load_at_end": load_end,
                    "quiet_wait_s": round(quiet_wait, 1),
                }
            )
        bench.delete_namespace(namespace, force=True, keep=contender.home is not None)

    def table(self) -> None:
        """Every contender's medians and ranges side by side, and each peer's ratio of
        Running medians to torchkube's."""
        rows = []
        peers = [p.name for p in self.players if p.name not in ("torchkube", LIMIT)]
        for n in self.sizes:
            ours = self.running[("torchkube", n)]
            for player in self.players:
                key = (player.name, n)
                if not self.running[key].stats:
                    continue
                loads = self.running[key].loads
                rows.append(
                    [
                        str(n),
                        player.name,
                        spread(self.admitted[key]),
                        spread(self.created[key]),
                        spread(self.running[key]),
                        spread(self.every_pod[key]),
                        self._ratio(player.name, self.running[key], ours, peers),
                        fmt(median_of(self.kueue_cpu[key]), "s"),
                        fmt(median_of(self.operator_cpu[key]), "s"),
                        f"{min(loads):.1f}–{max(loads):.1f}",
                    ]
                )
        self.results.tables[
            "apply → Workload admitted → all workers Running, through Kueue: median [min – max]"
        ] = (
            [
                "workers",
                "job of",
                "admitted",
                "all created",
                "all workers Running",
                "all pods Running",
                "÷ torchkube",
                "Kueue CPU",
                "operator CPU",
                "load",
            ],
            rows,
        )

    @staticmethod
    def _ratio(name: str, theirs: Figure, ours: Figure, peers: list[str]) -> str:
        """A peer's median ÷ torchkube's; for the limit, torchkube's ÷ the limit's."""
        if name in peers:
            return ratio_of_medians(theirs, ours)
        if name == LIMIT:
            return f"torchkube ÷ it: {ratio_of_medians(ours, theirs)}"
        return ""


def ratio_of_medians(theirs: Figure, ours: Figure) -> str:
    """How many times torchkube's median the peer's is (``–`` when either is missing)."""
    if not (theirs.stats and ours.stats) or ours.stats.median <= 0:
        return "–"
    return fmt(theirs.stats.median / ours.stats.median, "x")


def median_of(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run(args: argparse.Namespace, results: Results, scratch: Path) -> None:
    pools = gpu_pools(args.nodes, args.domains)
    configs = (kubeflow.DEFAULT, kubeflow.RAISED) if args.raised_peer else (kubeflow.DEFAULT,)
    with (
        stack(pools, scratch) as bench,
        contenders(bench, True, configs, limit=args.limit) as players,
    ):
        # Kueue after the PyTorchJob CRD (contenders installed it): its integration's
        # controller starts at once instead of polling for the API.
        kueue = Kueue(bench.cluster, frameworks=[PYTORCHJOB]).start()
        try:
            make_queues(bench, args.nodes, BENCH_LABEL, "scale")
            bench.measure_idle()
            results.extra["cluster_idle_cores"] = round(bench.idle_cores, 2)
            side = QueuedStart(results, args.sizes, players)
            for player in players:  # warm-up: first-use costs of a fresh operator and Kueue
                side.trial(bench, player, 8, record=False)
            side.trial(bench, warmer(players), max(args.sizes), record=False)
            trials = {n: args.trials_large if n >= 256 else args.trials_small for n in args.sizes}
            for round_ in range(max(trials.values())):
                for n in args.sizes:
                    if round_ < trials[n]:
                        for player in rotated(players, round_ + args.sizes.index(n)):
                            side.trial(bench, player, n)
            side.table()
        finally:
            kueue.stop()


def warm_ups(args: argparse.Namespace) -> str:
    """What runs before the trials and is not counted (see ``operator_scale.warmer``)."""
    return (
        "one 8-worker warm-up job per contender is not counted, nor one job of "
        f"{max(args.sizes)} workers by {warmed_by(args.limit)} after them ({COLD_WATCHES})"
    )


def peer_note(raised: bool) -> str:
    note = f"peer client limits: {kubeflow.DEFAULT.describe()}"
    if raised:
        note += (
            f"; {kubeflow.RAISED.describe()}; each Kubeflow configuration watches one namespace "
            "of its own (--namespace: two would otherwise both reconcile every PyTorchJob), "
            "reused job after job, where torchkube's jobs each get a fresh one"
        )
    return note


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.queued_start", description=__doc__)
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 64, 512]
    )
    parser.add_argument("--trials-small", type=int, default=3, help="trials of 8 and 64")
    parser.add_argument("--trials-large", type=int, default=2, help="trials of 512")
    parser.add_argument("--nodes", type=int, default=100, help="8-GPU nodes")
    parser.add_argument("--domains", type=int, default=2, help="kwok processes for them")
    parser.add_argument(
        "--no-raised-peer",
        dest="raised_peer",
        action="store_false",
        help="only Kubeflow's default configuration, not also the one with its client "
        "limits raised",
    )
    parser.add_argument(
        "--no-limit",
        dest="limit",
        action="store_false",
        help="leave out the bare client (the physical limit: a Workload of the same pods, "
        "then the pods once it is admitted, with no operator)",
    )
    return leaving_out(parser, parser.parse_args(argv), ["sizes", "raised_peer", "limit"])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = Results(
        "queued_start", command_line("bench.queued_start", argv), config=dict(vars(args))
    )
    results.notes += [
        "admitted/created/Running: from the job create request to its Workload first seen "
        "Admitted, the last worker pod seen, and seen Running (watches; Kubeflow's workers are "
        "its N-1 Workers, its Master counted apart); all pods Running: every pod of the job "
        f"(torchkube's rendezvous store, Kubeflow's Master); {warm_ups(args)}; load: "
        "1-minute load average at each trial's start "
        "(the table's range; start and end of each trial in the JSON); each trial starts on a "
        f"quiet cluster (its processes, Kueue and the operators within {QUIET_MARGIN_CORES:g} "
        f"cores of the cluster's idle rate for {QUIET_WINDOW_S:g} s, that rate measured at the "
        "cluster's start: the last trial's teardown done)",
        "Kueue v0.17.0 built from source, as a process; integrations.frameworks "
        f"[batch/job, {PYTORCHJOB}] (Kueue's own PyTorchJob integration: its webhook suspends "
        "the job, its jobframework makes the Workload and unsuspends the job once admitted) "
        "and externalFrameworks [TrainingJob.v1alpha1.torchkube.io] (torchkube's operator "
        "makes and follows the Workload); one ResourceFlavor for the KWOK GPU nodes, one "
        "ClusterQueue with all their GPUs as quota (one job at a time never waits for quota), "
        "a LocalQueue per namespace, Active before the trial",
        peer_note(args.raised_peer),
        *(
            [
                f"{LIMIT} (the physical limit): the Workload torchkube makes for the job, its "
                "workers' pod set alone and owned by nothing, created by a client with no "
                "operator, which watches it from that create's version and, once Kueue "
                f"admits it, creates torchkube's own worker pods for the job, {BARE_HOW}, "
                "no client rate limit; torchkube ÷ the limit of the medians"
            ]
            if args.limit
            else []
        ),
        f"PyTorchJob: a Master and N-1 Workers whose pods carry what a torchkube worker of the "
        f"same job does (bench/kubeflow.py); ÷ torchkube = the peer's Running median ÷ "
        f"torchkube's; {PEER} {kubeflow.RELEASE} is the reference",
        "Kueue CPU: CPU seconds of the Kueue process from apply to all Running; operator "
        "CPU: the job's operator from apply until it stops sending requests (medians); "
        "Kueue's own client runs at its default limit (clientConnection 20 requests/s, bursts "
        "of 30), a few requests per job",
    ]
    with tempfile.TemporaryDirectory(prefix="torchkube-bench-") as scratch:
        run(args, results, Path(scratch))
    results.write(record_dir_of(args))


if __name__ == "__main__":
    main()
