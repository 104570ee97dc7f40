"""Dispatched start: a TrainingJob applied on a MultiKueue manager → all its workers Running on
the worker cluster MultiKueue chose, against the same job applied directly on a worker cluster,
in the same run, contenders in rotated order.

Run: ``python -m bench.multikueue_start`` (≈ 4 min on 2 cores with the defaults: 3 trials of
8 and 64 workers per contender, after one unrecorded 8-worker job each).

The test bed's layout (testbed.multikueue): a manager cluster and two worker clusters, each its
own control plane with the real Kueue v0.17.0 and a torchkube operator, the manager's
ClusterQueue behind a MultiKueue admission check, each worker's ClusterQueue holding its KWOK
pool's GPUs. A job asks for one GPU per worker, so 64 workers fill one worker's 8 nodes × 8
GPUs; every trial runs in namespaces of its own, each worker cluster with a volume for the
job's checkpoint claim.

- **through MultiKueue**: the job (``spec.managedBy: kueue.x-k8s.io/multikueue``) created on
  the manager → its Workload there (the manager's operator) → admitted on the manager, copied to
  both workers, admitted on one → the job's copy created there (MultiKueue) → its pods (the
  worker's operator) → all Running;
- **directly on a worker**: the same job without ``managedBy``, created on a worker cluster
  and queued in its LocalQueue.

Each trial reads, from pod watches on both worker clusters, the instant the last worker pod
was first seen and first seen Running, from the moment the create was sent; the load average
is taken at each trial's start.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.common import Figure, Results, command_line, load_average, log, rotated, spread
from bench.kube import PodWatch, job_body
from bench.operator_scale import all_created, all_running
from testbed.cluster import Cluster, ClusterConfig
from testbed.crds import install_crd
from testbed.kueue import Kueue
from testbed.kwok import kwok_toleration
from testbed.multikueue import QUEUE, QUEUE_LABEL, MultiKueue, MultiKueueLayout, start_multikueue
from testbed.operator import OperatorProcess
from testbed.volumes import delete_volume, prebound_volume
from testbed.wait import wait_for
from torchkube.api import GROUP, PLURAL, VERSION
from torchkube.api import labels as lbl
from torchkube.api.spec import MANAGED_BY_MULTIKUEUE

DISPATCHED, DIRECT = "through MultiKueue", "directly on a worker"
WAYS = (DISPATCHED, DIRECT)
WORKER_PODS = f"{lbl.ROLE}={lbl.ROLE_WORKER}"


def trial_job(name: str, workers: int, dispatched: bool) -> dict[str, Any]:
    """The benchmark's TrainingJob (bench.kube.job_body: one GPU a worker, the API's defaults
    otherwise), queued in the layout's LocalQueue, placed by the worker's ResourceFlavor
    alone, its checkpoint claim its own; with ``dispatched``, for MultiKueue."""
    body = job_body(name, workers)
    spec = body["spec"]
    spec.pop("checkpoint")
    spec["scheduling"] = {"tolerations": [kwok_toleration()]}
    spec["rendezvous"] = {}
    if dispatched:
        spec["managedBy"] = MANAGED_BY_MULTIKUEUE
    body["metadata"]["labels"] = {QUEUE_LABEL: QUEUE}
    return body


class Bed:
    """The manager, its workers and an operator on each, for the whole run."""

    def __init__(self, scratch: Path, nodes: int) -> None:
        self.scratch = scratch
        self.manager = Cluster(ClusterConfig(workdir=scratch / "manager")).start()
        self.operators: list[OperatorProcess] = []
        try:
            install_crd(self.manager.api_client())
            self.kueue = Kueue(self.manager).start()
            layout = MultiKueueLayout(nodes_per_worker=nodes, workdir=scratch / "workers")
            self.multikueue: MultiKueue = start_multikueue(self.manager, self.kueue, layout)
            kubeconfigs = [("manager", self.manager.kubeconfig, self.manager.log_dir)]
            kubeconfigs += [
                (name, w.kubeconfig, w.cluster.log_dir)
                for name, w in self.multikueue.workers.items()
            ]
            for _, kubeconfig, logs in kubeconfigs:
                operator = OperatorProcess(kubeconfig, logs / "operator.log")
                self.operators.append(operator.start())
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for operator in self.operators:
            operator.stop()
        if hasattr(self, "multikueue"):
            self.multikueue.stop()
        if hasattr(self, "kueue"):
            self.kueue.stop()
        self.manager.stop()


class DispatchedStart:
    """The figures of each way and size, filled trial by trial."""

    def __init__(self, results: Results, sizes: list[int]) -> None:
        self.results, self.sizes = results, sizes
        self.created: dict[tuple[str, int], Figure] = {}
        self.running: dict[tuple[str, int], Figure] = {}
        for n in sizes:
            for way in WAYS:
                title = f"{n} workers, {way}"
                self.created[(way, n)] = results.figure(f"{title}: apply → all created", "s")
                self.running[(way, n)] = results.figure(f"{title}: apply → all Running", "s")

    def trial(self, bed: Bed, way: str, workers: int, serial: int, record: bool = True) -> None:
        multikueue = bed.multikueue
        namespace = f"mk{serial}"
        name = f"job{workers}"
        multikueue.add_namespace(namespace)
        claim = f"{name}-checkpoints"
        volumes = [
            (w, prebound_volume(w.api_client(), namespace, claim, str(bed.scratch / namespace)))
            for w in multikueue.workers.values()
        ]
        first = next(iter(multikueue.workers.values()))
        target = bed.manager if way == DISPATCHED else first.cluster
        watches = [
            PodWatch(w.api_client(), namespace, WORKER_PODS) for w in multikueue.workers.values()
        ]
        for watch in watches:
            watch.__enter__()
        try:
            load = load_average()
            started = time.monotonic()
            client.CustomObjectsApi(target.api_client()).create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, trial_job(name, workers, way == DISPATCHED)
            )
            timeout = 120 + workers
            ran = wait_for(
                lambda: next((w for w in watches if _count(w) >= workers), None),
                timeout,
                what=f"{workers} worker pods of the job {way}",
            )
            created = all_created(ran, workers, timeout, way) - started
            running = all_running(ran, workers, timeout, way) - started
        finally:
            for watch in watches:
                watch.__exit__(None, None, None)
        log(
            f"{way}, {workers} workers: all created {created:.2f}s, all Running "
            f"{running:.2f}s, load {load:.1f}" + ("" if record else " (warm-up, not recorded)")
        )
        if record:
            self.created[(way, workers)].add(created, load)
            self.running[(way, workers)].add(running, load)
            self.results.extra.setdefault("trials", []).append(
                {
                    "way": way,
                    "workers": workers,
                    "all_created_s": round(created, 3),
                    "all_running_s": round(running, 3),
                    "load_at_start": load,
                }
            )
        client.CustomObjectsApi(target.api_client()).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
        for worker in multikueue.workers.values():
            _wait_no_pods(worker.api_client(), namespace)
        multikueue.remove_namespace(namespace)
        client.CoreV1Api(bed.manager.api_client()).delete_namespace(namespace)
        for worker, volume in volumes:
            delete_volume(worker.api_client(), volume)

    def table(self) -> None:
        rows = []
        for n in self.sizes:
            for way in WAYS:
                running = self.running[(way, n)]
                rows.append(
                    [
                        str(n),
                        way,
                        spread(self.created[(way, n)]),
                        spread(running),
                        str(len(running.values)),
                        ", ".join(f"{x:.1f}" for x in running.loads),
                    ]
                )
        self.results.tables["apply → all workers Running on the worker cluster"] = (
            ["workers", "applied", "all created", "all Running", "trials", "load per trial"],
            rows,
        )


def _wait_no_pods(api: Any, namespace: str) -> None:
    """Capacity back: the namespace's pods gone from a worker cluster."""
    core = client.CoreV1Api(api)
    wait_for(
        lambda: not core.list_namespaced_pod(namespace).items,
        120,
        what=f"the pods of {namespace} gone",
    )


def _count(watch: PodWatch) -> int:
    with watch.cond:
        return len(watch.pods)


def run(args: argparse.Namespace, results: Results, scratch: Path) -> None:
    bed = Bed(scratch, args.nodes)
    try:
        results.notes.append(
            f"the workers came up in {bed.multikueue.started_in_s:.1f} s (started side by "
            "side, until the manager saw both Active)"
        )
        side = DispatchedStart(results, args.sizes)
        serial = 0
        for way in WAYS:  # warm-up: first-use costs of fresh operators and Kueues
            serial += 1
            side.trial(bed, way, 8, serial, record=False)
        for trial in range(args.trials):
            for n in args.sizes:
                for way in rotated(WAYS, trial):
                    serial += 1
                    side.trial(bed, way, n, serial)
        side.table()
    finally:
        bed.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.multikueue_start", description=__doc__)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 64])
    parser.add_argument("--trials", type=int, default=3, help="per way and size")
    parser.add_argument("--nodes", type=int, default=8, help="8-GPU nodes per worker cluster")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = Results(
        "multikueue_start", command_line("bench.multikueue_start", argv), config=dict(vars(args))
    )
    results.notes += [
        "all created / all Running: from the job's create request to the last worker pod first "
        "seen, and first seen Running, on the worker cluster that ran it (watches on both); "
        "one 8-worker warm-up job per way is not counted; the two ways alternate, the first "
        "of each trial rotating; load: 1-minute load average at each trial's start",
        "Kueue v0.17.0 built from source on each cluster, as a process; the manager's "
        "ClusterQueue has a MultiKueue admission check over both workers (dispatcher: all at "
        "once, Kueue's default), each worker a ClusterQueue over its KWOK pool; a torchkube "
        "operator on each cluster; the same ResourceFlavor name and LocalQueue everywhere",
    ]
    with tempfile.TemporaryDirectory(prefix="torchkube-bench-") as scratch:
        run(args, results, Path(scratch))
    results.write()


if __name__ == "__main__":
    main()
