"""Operator scale, side by side: apply a job → every worker pod created, and every one Running,
for torchkube and Kubeflow's training-operator on one cluster, idle and under load.

Run: ``python -m bench.operator_scale`` (≈ 1 h; ``--quick`` for one trial of each, smaller
fleet). ``--no-peers`` measures torchkube alone.

On the real control plane (kube-apiserver, scheduler, controller-manager built from source)
with KWOK nodes (100 × 8 GPUs for single jobs; 512 × 8 GPUs for the fleet). Node creation is
not timed. Both operators run at once, as processes with the admin kubeconfig; jobs alternate
between the contenders in an order that rotates size by size, round by round, each in a fresh
namespace, so a burst of load from elsewhere lands on all. Each trial waits for a quiet cluster
(``bench.kube.wait_quiet``: the last trial's teardown would otherwise be charged to whoever
follows it), starts a watch on the namespace's worker pods, creates the job through the API
(what ``kubectl apply`` sends) and reads off, from the watch:

- **answered**: job create sent → its answer (the bare client's apply is its pods' creates);
- **first created**: → the first worker pod seen (the operator's reaction: its watch of the
  job, its plan, its first create's round trip);
- **created**: job create sent → the last worker pod seen by the watch (the operator's work);
- **bound**: → the last worker seen with a node (+ kube-scheduler, whose own client is
  limited to 50 requests/s unless raised: the control plane's part ends here);
- **Running**: → the last worker seen ``Running`` (+ KWOK playing the kubelets; here its
  processes share the control plane's cores, where kubelets would run on their own nodes).

Where the CPU went from apply to all Running is counted per process (control plane, KWOK,
each operator) with the cores they got together, and the floor: the rest of the work at that
share, the time an operator that cost nothing would take (``where_cpu_went``).

Every single-job figure is taken twice: ``idle`` and ``loaded`` (one busy process per core
beside the cluster for the whole condition; see :mod:`bench.load`). A torchkube job of N
workers is N worker pods plus its rendezvous store pod; a PyTorchJob of N is a Master and N-1
Workers, their pods carrying the same training (the trainer's command and environment, the
checkpoint claim mounted). created, bound and Running are the worker pods' (Kubeflow's N-1
Workers: its Master is counted apart, since training-operator creates Master and Workers in
either order); **all pods Running** adds the rest (torchkube's store, Kubeflow's Master).

Scenarios (``--only``):

- ``single``: 8, 64 and 512 workers, sizes interleaved; Kubeflow twice, with its default
  client limits (v1.8.1: 20 requests/s, bursts of 30, which pace its 512-worker start) and with
  them raised (v1.9.3's ``--kube-api-qps=500 --kube-api-burst=1000``; ``--no-raised-peer``
  leaves it out), each confined to a namespace of its own;
- ``fast-scheduler``: 512 workers with kube-scheduler's client rate raised to 500/s (as large
  production clusters configure it), so the operators' own share of the time is visible;
- ``fleet``: 64 jobs × 64 workers (4,096 pods) on 512 nodes, one operator at a time, each
  freshly started, after one warm-up start of the whole fleet that is not counted
  (:func:`fleet_starts`): time to all Running, CPU seconds and API requests per pod, peak RSS,
  then the reconcile rate and CPU per minute over a steady state (it must stay flat).

Costs come from each operator itself: torchkube's ``torchkube_api_requests_total`` (writes;
it reads from watch caches) and reconcile histogram count; Kubeflow's client-go
``rest_client_requests_total`` and controller-runtime's ``controller_runtime_reconcile_total``;
CPU seconds from ``/proc/<pid>/stat``, peak RSS from ``VmHWM``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from bench import kubeflow, watchers
from bench.common import (
    LIMIT,
    Figure,
    Reference,
    Results,
    Target,
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
    QUIET_MARGIN_CORES,
    QUIET_WINDOW_S,
    PodTimes,
    PodWatch,
    Stack,
    gpu_pools,
    stack,
)
from bench.load import CONDITIONS, cpu_load

TARGET_RUNNING_IDLE_8 = 0.3
TARGET_CREATED_512 = 5.0
TARGET_RATIO = {8: 1.0, 64: 1.0, 512: 2.0}
"""How many times faster than Kubeflow torchkube must bring every worker to Running."""
TARGET_OF_LIMIT = 1.1
"""torchkube's all-Running time at most this many times the bare client's (the physical
limit: the same pods created with no operator), at every size."""
FAST_SCHEDULER_QPS = 500
STEADY_FLATNESS = 1.25
"""The steady state's reconcile rate in its last third may exceed its first third's by this
factor at most: a rate that grows is a timer or a requeue that piles up."""
Key = tuple[str, str, int]
"""(operator, condition, workers)"""
Player = TypeVar("Player")


def counted_pods(
    seen: dict[str, PodTimes], which: Callable[[PodTimes], bool] | None
) -> list[PodTimes]:
    return [pod for pod in seen.values() if which is None or which(pod)]


def last_of(
    watch: PodWatch,
    pods: int,
    instant: Callable[[PodTimes], float | None],
    timeout: float,
    what: str,
    which: Callable[[PodTimes], bool] | None,
) -> float:
    """Once ``pods`` of the watched pods (those ``which`` accepts, else all) have an
    ``instant``, the latest of them."""

    def latest(seen: dict[str, PodTimes]) -> float | None:
        times = [t for p in counted_pods(seen, which) if (t := instant(p)) is not None]
        return max(times) if len(times) >= pods else None

    return watch.wait(latest, timeout, what)


def all_created(
    watch: PodWatch,
    pods: int,
    timeout: float,
    what: str,
    which: Callable[[PodTimes], bool] | None = None,
) -> float:
    """When the watch saw the last of ``pods`` pods (those ``which`` accepts, else all)."""
    return last_of(watch, pods, lambda p: p.seen, timeout, f"{pods} pods of {what}", which)


def first_created(watch: PodWatch, which: Callable[[PodTimes], bool] | None = None) -> float:
    """When the watch saw the first of the pods (those ``which`` accepts, else all): the apply
    → the first worker is the operator's reaction (its watch of the job, its plan, the first
    create's round trip), the rest of all created its burst of creates."""
    with watch.cond:
        return min(p.seen for p in counted_pods(watch.pods, which))


def all_bound(watch: PodWatch, which: Callable[[PodTimes], bool] | None = None) -> float:
    """When the scheduler's last binding was seen: created → bound is the scheduler's share,
    bound → Running the node's."""
    with watch.cond:
        return max(p.bound or 0.0 for p in counted_pods(watch.pods, which))


def all_running(
    watch: PodWatch,
    pods: int,
    timeout: float,
    what: str,
    which: Callable[[PodTimes], bool] | None = None,
) -> float:
    """When the watch saw the last of ``pods`` pods (those ``which`` accepts, else all)
    Running."""
    what = f"{pods} Running pods of {what}"
    return last_of(watch, pods, lambda p: p.running, timeout, what, which)


SPENT = {
    "control_plane": "API server, etcd, scheduler, controller-manager",
    "kwok": "KWOK (the nodes)",
    "operator": "the operator",
    "peer": "the other operators",
    "cores": "cores all of them got",
    "floor": "all Running at that share if the operator cost nothing",
}
"""Where the CPU went from apply to all Running (``where_cpu_went``), as the table names it."""


def where_cpu_went(used: dict[str, float], seconds: float) -> dict[str, float]:
    """CPU seconds by part from the per-process counts ``used`` (components by name,
    ``operator`` and ``peer``), the cores they got together over ``seconds``, and the floor:
    the time the rest of the work takes at that share, with an operator that costs nothing.
    Under load the busy processes take what is left, so the floor says what no operator
    could beat on this machine."""
    operator, peer = used.get("operator", 0.0), used.get("peer", 0.0)
    kwok = used.get("kwok", 0.0)
    total = sum(used.values())
    control_plane = total - operator - peer - kwok
    cores = total / seconds if seconds > 0 else 0.0
    return {
        "control_plane": control_plane,
        "kwok": kwok,
        "operator": operator,
        "peer": peer,
        "cores": cores,
        "floor": (total - operator) / cores if cores else 0.0,
    }


def side_by_side(condition: str, workers: int, ours: Figure, peers: list[Figure]) -> list[str]:
    """A table row: every operator's median [min – max], then each peer's ratio of medians
    (peer ÷ torchkube: how many times faster torchkube is)."""
    ratios = [
        fmt(theirs.stats.median / ours.stats.median, "x")
        if ours.stats and theirs.stats and ours.stats.median > 0
        else "–"
        for theirs in peers
    ]
    return [condition, str(workers), spread(ours), *(spread(t) for t in peers), *ratios]


class SideBySide:
    """Single-job figures per operator, condition and size, filled trial by trial; then each
    of torchkube's gets the peer's same-run median as reference, and the ratios a table."""

    def __init__(
        self,
        results: Results,
        sizes: list[int],
        players: list[Contender],
        conditions: list[str],
        label: str = "",
    ) -> None:
        self.results, self.players = results, players
        self.names = [player.name for player in players]
        self.sizes, self.conditions, self.label = sizes, conditions, label
        self.answered: dict[Key, Figure] = {}
        self.first: dict[Key, Figure] = {}
        self.created: dict[Key, Figure] = {}
        self.running: dict[Key, Figure] = {}
        self.every_pod: dict[Key, Figure] = {}
        self.bound: dict[Key, Figure] = {}
        self.per_pod: dict[Key, Figure] = {}
        self.cpu: dict[Key, Figure] = {}
        self.spent: dict[Key, list[dict[str, float]]] = {key: [] for key in self.keys()}
        for key in self.keys():
            name, condition, n = key
            ours = name == "torchkube"
            title = f"{n} workers{label}, {condition}"
            self.answered[key] = results.figure(f"{title}: apply → answered, {name}", "s")
            self.first[key] = results.figure(f"{title}: apply → first worker created, {name}", "s")
            self.created[key] = results.figure(
                f"{title}: apply → all created, {name}",
                "s",
                target=Target(TARGET_CREATED_512) if ours and n == 512 and not label else None,
            )
            self.bound[key] = results.figure(f"{title}: apply → all bound, {name}", "s")
            idle_8 = ours and n == 8 and condition == "idle"
            self.running[key] = results.figure(
                f"{title}: apply → all Running, {name}",
                "s",
                target=Target(TARGET_RUNNING_IDLE_8) if idle_8 else None,
            )
            self.every_pod[key] = results.figure(f"{title}: apply → all pods Running, {name}", "s")
        for key in self.keys():
            name, condition, n = key
            title = f"{n} workers{label}, {condition}"
            self.per_pod[key] = results.figure(
                f"{title}: API requests per worker pod, {name}", "req"
            )
            self.cpu[key] = results.figure(f"{title}: operator CPU, {name}", "s")

    def _cpu_used(
        self, bench: Stack, contender: Contender, before: dict[str, float] | None = None
    ) -> dict[str, float]:
        """CPU seconds so far of every component and both operators (the one whose job this
        is as ``operator``); since ``before`` when given."""
        used = bench.component_cpu_seconds()
        for player in self.players:
            part = "operator" if player is contender else "peer"
            used[part] = used.get(part, 0.0) + player.cpu_seconds()
        if before is None:
            return used
        return {part: seconds - before.get(part, 0.0) for part, seconds in used.items()}

    def keys(self) -> list[Key]:
        return [(m, c, n) for c in self.conditions for n in self.sizes for m in self.names]

    def trial(
        self,
        bench: Stack,
        contender: Contender,
        workers: int,
        condition: str,
        record: bool = True,
    ) -> None:
        namespace = contender.home or bench.namespace(f"scale{workers}")
        name = f"job{workers}"
        worker_pods, pods = contender.pod_counts(workers)
        is_worker = contender.is_worker
        with PodWatch(bench.api, namespace, contender.pod_selector) as watch:
            quiet_wait = quiet(bench, self.players)
            closed_before = bench.closed_pod_watches()
            log_before = watchers.log_size(bench.apiserver_log)
            requests_before, cpu_before = contender.requests(), contender.cpu_seconds()
            load = load_average()
            used_before = self._cpu_used(bench, contender)
            started = time.monotonic()
            contender.submit(bench, namespace, name, workers)
            answered = time.monotonic() - started
            timeout = 120 + workers
            what = f"{contender.name}'s job of {workers}"
            created = all_created(watch, worker_pods, timeout, what, is_worker) - started
            first = first_created(watch, is_worker) - started
            running = all_running(watch, worker_pods, timeout, what, is_worker) - started
            used = self._cpu_used(bench, contender, used_before)
            every_pod = all_running(watch, pods, timeout, what) - started
            bound = all_bound(watch, is_worker) - started
            extra = len(watch.pods) - pods
        closed = bench.closed_pod_watches() - closed_before
        closers = watchers.closed_since(bench.apiserver_log, log_before)
        settle(contender)
        requests = contender.requests() - requests_before
        cpu = contender.cpu_seconds() - cpu_before
        log(
            f"{contender.name}, {condition}, {workers} workers{self.label}: answered "
            f"{answered:.3f}s, first created {first:.3f}s, created {created:.2f}s, "
            f"bound {bound:.2f}s, Running {running:.2f}s (all {pods} pods "
            f"{every_pod:.2f}s), {requests:.0f} requests,"
            f" CPU {cpu:.2f}s, {closed:.0f} pod watches closed by the API server"
            + (f" ({watchers.said(closers)})" if closers else "")
            + (f", {extra} EXTRA pods" if extra else "")
            + ("" if record else " (warm-up, not recorded)")
        )
        if record:
            key = (contender.name, condition, workers)
            self.answered[key].add(answered, load)
            self.first[key].add(first, load)
            self.created[key].add(created, load)
            self.running[key].add(running, load)
            self.every_pod[key].add(every_pod, load)
            self.bound[key].add(bound, load)
            self.per_pod[key].add(requests / workers, load)
            self.cpu[key].add(cpu, load)
            self.spent[key].append(where_cpu_went(used, running))
            self.results.extra.setdefault("trials", []).append(
                {
                    "scenario": self.label.strip(", ") or "single",
                    "operator": contender.name,
                    "condition": condition,
                    "workers": workers,
                    "answered_s": round(answered, 3),
                    "first_created_s": round(first, 3),
                    "all_created_s": round(created, 3),
                    "all_bound_s": round(bound, 3),
                    "all_running_s": round(running, 3),
                    "worker_pods": worker_pods,
                    "pods": pods,
                    "all_pods_running_s": round(every_pod, 3),
                    "extra_pods": extra,
                    "requests": requests,
                    "operator_cpu_s": round(cpu, 2),
                    "closed_pod_watches": closed,
                    "closed_pod_watchers": closers,
                    "cpu_to_running_s": {k: round(v, 2) for k, v in used.items()},
                    "load": load,
                    "quiet_wait_s": round(quiet_wait, 1),
                }
            )
        bench.delete_namespace(namespace, force=True, keep=contender.home is not None)

    def compare(self) -> None:
        """Kubeflow's same-run median (its default configuration) becomes the reference of
        torchkube's figure; the ratio of medians (peer ÷ torchkube: how many times faster) is
        a figure per peer configuration, the default's judged against its target; one table
        shows every operator's medians and ranges, another the bound times, another where the
        CPU went."""
        self.cpu_table()
        self.every_pod_table()
        self.against_limit()
        peers = [name for name in self.names if name not in ("torchkube", LIMIT)]
        if PEER not in peers:
            return
        rows, bound_rows = [], []
        for condition in self.conditions:
            for n in self.sizes:
                ours = self.running[("torchkube", condition, n)]
                theirs = [self.running[(peer, condition, n)] for peer in peers]
                if not (ours.stats and all(t.stats for t in theirs)):
                    continue
                bound_rows.append(
                    side_by_side(
                        condition,
                        n,
                        self.bound[("torchkube", condition, n)],
                        [self.bound[(peer, condition, n)] for peer in peers],
                    )
                )
                verdicts = []
                for peer, figure in zip(peers, theirs, strict=True):
                    assert figure.stats is not None and ours.stats is not None
                    median = figure.stats.median
                    judged = peer == PEER and n in TARGET_RATIO and not self.label
                    if peer == PEER:
                        ours.reference = Reference(
                            median, f"{PEER} {kubeflow.RELEASE}, same run: {fmt(median, 's')}"
                        )
                    ratio = self.results.figure(
                        f"{n} workers{self.label}, {condition}: {peer} ÷ torchkube, all Running",
                        "x",
                        target=Target(TARGET_RATIO[n], "min") if judged else None,
                    )
                    ratio.add(median / ours.stats.median, ours.loads[-1])
                    if peer == PEER:
                        verdicts.append(ratio.verdict() or "–")
                rows.append([*side_by_side(condition, n, ours, theirs), *verdicts])
        ratios = [f"{peer} ÷ torchkube" for peer in peers]
        self.results.tables[f"apply → all workers Running{self.label}: median [min – max]"] = (
            ["load", "workers", "torchkube", *peers, *ratios, "target"],
            rows,
        )
        self.results.tables[
            f"apply → all workers bound to a node{self.label} (the scheduler's part done; "
            "Running adds the nodes'): median [min – max]"
        ] = (["load", "workers", "torchkube", *peers, *ratios], bound_rows)

    def every_pod_table(self) -> None:
        """Every contender's workers and all its pods side by side: a job's other pods
        (torchkube's rendezvous store, Kubeflow's Master) can come before or after its
        workers, and a Master created last holds the training back as much as a worker."""
        rows = []
        for condition in self.conditions:
            for n in self.sizes:
                cells = []
                for name in self.names:
                    key = (name, condition, n)
                    cells += [spread(self.running[key]), spread(self.every_pod[key])]
                rows.append([condition, str(n), *cells])
        header = [f"{name}: {part}" for name in self.names for part in ("workers", "all pods")]
        self.results.tables[
            f"apply → all workers Running and all pods Running{self.label}: median [min – max]"
        ] = (["load", "workers", *header], rows)

    def against_limit(self) -> None:
        """torchkube ÷ the bare client (the same pods, no operator), of the medians, against
        :data:`TARGET_OF_LIMIT`: how far from what the cluster alone allows."""
        if LIMIT not in self.names:
            return
        for condition in self.conditions:
            for n in self.sizes:
                ours = self.running[("torchkube", condition, n)]
                limit = self.running[(LIMIT, condition, n)]
                if not (ours.stats and limit.stats and limit.stats.median > 0):
                    continue
                ratio = self.results.figure(
                    f"{n} workers{self.label}, {condition}: torchkube ÷ {LIMIT}, all Running",
                    "x",
                    target=Target(TARGET_OF_LIMIT),
                )
                ratio.add(ours.stats.median / limit.stats.median, ours.loads[-1])

    def cpu_table(self) -> None:
        """Medians over the trials of where the CPU went from apply to all Running: what the
        cluster itself spends on N workers, what each operator adds, and the floor."""
        rows = []
        for key in self.keys():
            name, condition, n = key
            if not self.spent[key]:
                continue
            medians = {
                part: statistics.median(trial[part] for trial in self.spent[key]) for part in SPENT
            }
            cells = [
                f"{medians[part]:.2f}" if part == "cores" else fmt(medians[part], "s")
                for part in SPENT
            ]
            rows.append([condition, str(n), name, *cells])
        self.results.tables[
            f"where the CPU went, apply → all Running{self.label}: CPU seconds, medians"
        ] = (["load", "workers", "job of", *SPENT.values()], rows)


def run_single(args: argparse.Namespace, results: Results, scratch: Path) -> None:
    sizes = args.sizes
    trials = {n: (args.trials_large if n >= 256 else args.trials_small) for n in sizes}
    pools = gpu_pools(args.nodes, args.domains)
    configs = (kubeflow.DEFAULT, kubeflow.RAISED) if args.raised_peer else (kubeflow.DEFAULT,)
    with (
        stack(pools, scratch) as bench,
        contenders(bench, args.peers, configs, limit=args.limit) as players,
    ):
        results.extra["cluster_idle_cores"] = round(bench.idle_cores, 2)
        side = SideBySide(results, sizes, players, args.conditions)
        for player in players:  # warm-up: first-use costs of a fresh operator
            side.trial(bench, player, 8, "idle", record=False)
        side.trial(bench, warmer(players), max(sizes), "idle", record=False)
        for condition in args.conditions:
            with cpu_load(condition) as busy:
                log(f"condition {condition}: {busy} busy processes beside the cluster")
                for round_ in range(max(trials.values())):
                    for n in sizes:
                        if round_ < trials[n]:
                            for player in rotated(players, round_ + sizes.index(n)):
                                side.trial(bench, player, n, condition)
        side.compare()


def run_fast_scheduler(args: argparse.Namespace, results: Results, scratch: Path) -> None:
    pools = gpu_pools(args.nodes, args.domains)
    with (
        stack(pools, scratch, scheduler_client_qps=FAST_SCHEDULER_QPS) as bench,
        contenders(bench, args.peers, limit=args.limit) as players,
    ):
        results.extra["cluster_idle_cores"] = round(bench.idle_cores, 2)
        label = f", scheduler at {FAST_SCHEDULER_QPS} req/s"
        side = SideBySide(results, [512], players, ["idle"], label)
        for player in players:
            side.trial(bench, player, 8, "idle", record=False)
        side.trial(bench, warmer(players), 512, "idle", record=False)
        for trial in range(args.trials_large):
            for player in rotated(players, trial):
                side.trial(bench, player, 512, "idle")
        side.compare()


class Fleet:
    """The many-jobs figures of one contender: its start, and for an operator what the start
    cost it and its steady state afterwards (the bare client has neither)."""

    def __init__(
        self, results: Results, name: str, jobs: int, per_job: int, operator: bool = True
    ) -> None:
        title = f"{jobs} jobs × {per_job} workers, {name}"
        self.name, self.jobs, self.per_job, self.operator = name, jobs, per_job, operator
        self.running = results.figure(f"{title}: all Running", "s")
        self.every_pod = results.figure(f"{title}: all pods Running", "s")
        self.created = results.figure(f"{title}: all created", "s")
        self.closed_watches = results.figure(
            f"{title}: pod watches the API server closed", "watches"
        )
        self.kwok_cpu = results.figure(f"{title}: KWOK CPU (the nodes' kubelets)", "s")
        self.results = results
        if not operator:
            return
        self.cpu_per_pod = results.figure(f"{title}: operator CPU per pod", "ms")
        self.requests_per_pod = results.figure(f"{title}: API requests per pod", "req")
        self.rss = results.figure(f"{title}: operator peak RSS", "MiB")
        self.steady_reconciles = results.figure(
            f"{title}: steady state, reconciles per minute", "/min"
        )
        self.steady_cpu = results.figure(f"{title}: steady state, operator CPU per minute", "s")
        self.flatness = results.figure(
            f"{title}: steady state, reconcile rate last third ÷ first third",
            "x",
            target=Target(STEADY_FLATNESS),
        )

    def trial(
        self,
        bench: Stack,
        contender: Contender,
        players: list[Contender],
        steady_minutes: float,
        record: bool = True,
    ) -> None:
        """One start of every job at once, on a quiet cluster (``players``' operators counted);
        the steady state after it when ``steady_minutes``. Not ``record``: the warm-up, kept
        apart in the record's ``fleet_warm_up`` and in no figure."""
        total = self.jobs * self.per_job
        worker_pods, pods = (self.jobs * n for n in contender.pod_counts(self.per_job))
        is_worker = contender.is_worker
        contender.restart(bench)
        namespace = bench.namespace("fleet")
        with PodWatch(bench.api, namespace, contender.pod_selector) as watch:
            quiet_wait = quiet(bench, players)
            closed_before = bench.closed_pod_watches()  # not the last trial's teardown's
            log_before = watchers.log_size(bench.apiserver_log)
            requests_before, cpu_before = contender.requests(), contender.cpu_seconds()
            kwok_before = bench.component_cpu_seconds().get("kwok", 0.0)
            load = load_average()
            started = time.monotonic()
            for index in range(self.jobs):
                contender.submit(bench, namespace, f"job{index:02d}", self.per_job)
            what = contender.name
            created = all_created(watch, worker_pods, 900, what, is_worker) - started
            running = all_running(watch, worker_pods, 900, what, is_worker) - started
            every_pod = all_running(watch, pods, 900, what) - started
            kwok_cpu = bench.component_cpu_seconds().get("kwok", 0.0) - kwok_before
        closed = bench.closed_pod_watches() - closed_before
        closers = watchers.closed_since(bench.apiserver_log, log_before)
        seen = {
            "operator": contender.name,
            "load": load,
            "quiet_wait_s": round(quiet_wait, 1),
            "closed_pod_watches": closed,
            "closed_pod_watchers": closers,
            "kwok_cpu_s": round(kwok_cpu, 1),
        }
        said = f"{contender.name}: {self.jobs} jobs × {self.per_job}: created {created:.1f}s, "
        said += f"Running {running:.1f}s (all {pods} pods {every_pod:.1f}s, load {load:.1f}, "
        said += f"after {quiet_wait:.0f}s for a quiet cluster; {closed:.0f} pod watches closed "
        said += f"by the API server{f' ({watchers.said(closers)})' if closers else ''}, "
        said += f"KWOK {kwok_cpu:.1f} CPU-s)"
        if not record:
            self.results.extra["fleet_warm_up"] = seen | {"running_s": round(every_pod, 1)}
            log(f"{said} (warm-up, not counted)")
            bench.delete_namespace(namespace, wait=900, force=True)
            return
        self.created.add(created, load)
        self.running.add(running, load)
        self.every_pod.add(every_pod, load)
        self.closed_watches.add(closed, load)
        self.kwok_cpu.add(kwok_cpu, load)
        self.results.extra.setdefault("fleet_trials", []).append(seen)
        if self.operator:
            settle(contender, quiet=5.0, limit=180.0)
            requests = contender.requests() - requests_before
            cpu = contender.cpu_seconds() - cpu_before
            rss = contender.peak_rss() / 2**20
            self.cpu_per_pod.add(cpu * 1000 / total, load)
            self.requests_per_pod.add(requests / total, load)
            self.rss.add(rss, load)
            said += f", CPU {cpu:.1f}s, {requests:.0f} requests, peak RSS {rss:.0f} MiB"
        if self.operator and steady_minutes:
            log(f"{said}; steady state for {steady_minutes:g} min")
            per_minute = self.steady_state(contender, steady_minutes)
            self.results.extra.setdefault("fleet_steady_state", []).append(
                {"operator": contender.name, "per_minute": per_minute}
            )
        else:
            log(said)
        bench.delete_namespace(namespace, wait=900, force=True)

    def steady_state(self, contender: Contender, minutes: float) -> list[dict[str, float]]:
        """Reconciles and CPU seconds minute by minute while nothing changes."""
        samples = []
        reconciles, cpu = contender.reconciles(), contender.cpu_seconds()
        slots = max(3, round(minutes))
        slot = minutes * 60 / slots
        for _ in range(slots):
            time.sleep(slot)
            now_reconciles, now_cpu = contender.reconciles(), contender.cpu_seconds()
            samples.append(
                {
                    "reconciles_per_min": (now_reconciles - reconciles) * 60 / slot,
                    "cpu_s_per_min": (now_cpu - cpu) * 60 / slot,
                }
            )
            reconciles, cpu = now_reconciles, now_cpu
        rates = [s["reconciles_per_min"] for s in samples]
        third = max(1, len(rates) // 3)
        first, last = sum(rates[:third]) / third, sum(rates[-third:]) / third
        self.steady_reconciles.add(sum(rates) / len(rates))
        self.steady_cpu.add(sum(s["cpu_s_per_min"] for s in samples) / len(samples))
        self.flatness.add(last / first if first else (1.0 if not last else float("inf")))
        return samples


def fleet_peer(args: argparse.Namespace) -> kubeflow.PeerConfig:
    """The fleet's one peer: Kubeflow with its client limits raised, unless asked for the
    default configuration (``--no-raised-peer``)."""
    return kubeflow.RAISED if args.raised_peer else kubeflow.DEFAULT


COLD_WATCHES = (
    "a fresh API server gives each pod watch a buffer of ten events, and the first large "
    "burst closes those that do not drain in time"
)
"""Why every start-up benchmark starts a large job before its trials, as its notes say it."""


def warmer(players: Sequence[Contender]) -> Contender:
    """Who starts a large job once before the trials, not counted: the limit, which has no
    operator of its own to warm (torchkube when the limit is left out). A fresh API server
    gives each new pod watch a buffer sized from the events its cache has seen lately
    (``suggestedWatchChannelSize``: ten on a new cluster), so the cluster's first large
    burst closes the watches of every component that cannot drain ten events in time —
    whoever caused it; the watches made after it get larger buffers."""
    return next((p for p in players if p.name == LIMIT), players[0])


def warmed_by(limit: bool) -> str:
    """Who :func:`warmer` picks, as a record's notes name it (``limit``: the run has one)."""
    return f"the {LIMIT}" if limit else "torchkube"


def fleet_starts(
    players: Sequence[Player], trials: int, steady_minutes: float, warm_up: Player
) -> list[tuple[Player, bool, float]]:
    """The fleet's starts in the order they run, each as (who, counted, steady minutes after
    it). First one that is not counted, by ``warm_up`` (see :func:`warmer`). Then every contender
    ``trials`` times, in an order that rotates trial by trial, each operator's steady state
    after its first counted trial only (ten quiet minutes say the same each time, and would
    triple the run)."""
    starts = [(warm_up, False, 0.0)]
    for trial in range(trials):
        for player in rotated(players, trial):
            starts.append((player, True, steady_minutes if trial == 0 else 0.0))
    return starts


def run_fleet(args: argparse.Namespace, results: Results, scratch: Path) -> None:
    """The starts :func:`fleet_starts` lists, the warm-up by :func:`warmer`."""
    pools = gpu_pools(args.fleet_nodes, args.fleet_domains)
    with (
        stack(pools, scratch) as bench,
        contenders(bench, args.peers, (fleet_peer(args),), limit=args.limit) as players,
    ):
        results.extra["cluster_idle_cores"] = round(bench.idle_cores, 2)
        fleets = {
            p.name: Fleet(results, p.name, args.jobs, args.per_job, operator=p.name != LIMIT)
            for p in players
        }
        for player, counted, steady in fleet_starts(
            players, args.trials_fleet, args.steady_minutes, warmer(players)
        ):
            fleets[player.name].trial(bench, player, players, steady, record=counted)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_scale", description=__doc__)
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 64, 512]
    )
    parser.add_argument("--trials-small", type=int, default=5, help="trials of 8 and 64")
    parser.add_argument("--trials-large", type=int, default=3, help="trials of 512")
    parser.add_argument("--nodes", type=int, default=100, help="8-GPU nodes for single jobs")
    parser.add_argument("--domains", type=int, default=2, help="kwok processes for them")
    parser.add_argument(
        "--conditions",
        type=lambda s: s.split(","),
        default=list(CONDITIONS),
        help="idle, loaded, or both (comma-separated)",
    )
    parser.add_argument("--jobs", type=int, default=64, help="jobs at once in the fleet")
    parser.add_argument("--per-job", type=int, default=64, help="workers per fleet job")
    parser.add_argument("--fleet-nodes", type=int, default=512)
    parser.add_argument("--fleet-domains", type=int, default=4)
    parser.add_argument("--trials-fleet", type=int, default=3)
    parser.add_argument("--steady-minutes", type=float, default=10.0)
    parser.add_argument(
        "--only", choices=["single", "fast-scheduler", "fleet"], help="one scenario only"
    )
    parser.add_argument(
        "--no-peers", dest="peers", action="store_false", help="torchkube alone (no Kubeflow)"
    )
    parser.add_argument(
        "--no-raised-peer",
        dest="raised_peer",
        action="store_false",
        help="single jobs: only Kubeflow's default configuration, not also the one with its "
        "client limits raised; the fleet: the default configuration instead of the raised one",
    )
    parser.add_argument(
        "--no-limit",
        dest="limit",
        action="store_false",
        help="leave out the bare client (the same pods created with no operator, the "
        "physical limit)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one trial each, 16 jobs × 16 workers on 64 nodes, 3 steady minutes",
    )
    args = parser.parse_args(argv)
    if unknown := set(args.conditions) - set(CONDITIONS):
        parser.error(f"unknown conditions {sorted(unknown)}; use {CONDITIONS}")
    if args.quick:
        args.trials_small = args.trials_large = args.trials_fleet = 1
        args.jobs, args.per_job, args.fleet_nodes, args.steady_minutes = 16, 16, 64, 3.0
    if args.jobs * args.per_job > args.fleet_nodes * 8:
        parser.error("the fleet needs a GPU per worker: jobs × per-job ≤ 8 × fleet-nodes")
    return leaving_out(parser, args, ["sizes", "conditions", "peers", "raised_peer", "limit"])


def notes(args: argparse.Namespace) -> list[str]:
    """What a reader needs to know about the scenarios this run measured (``--only``), and
    nothing about the ones it did not: the fleet runs its operators one after the other, after
    one warm-up start of the whole fleet, idle only."""
    single = args.only in (None, "single", "fast-scheduler")
    fleet = args.only in (None, "fleet")
    out = []
    if single:
        out += [
            "answered: from the job create request to its answer (the bare client's: its "
            "pods' creates); first worker created: to the first worker pod seen by a watch; "
            "created/Running: to the last worker pod seen by a "
            "watch (created) and seen Running (Kubeflow's workers: its N-1 Worker pods, the "
            "Master counted apart); all pods Running: the last of every pod of the job "
            "(torchkube's N workers and its rendezvous store, Kubeflow's Master and N-1 "
            f"Workers, the {LIMIT}'s N pods); node creation is not timed; one 8-worker "
            "warm-up job per operator and cluster is not counted, nor one job of the largest "
            f"size by {warmed_by(args.limit)} after them ({COLD_WATCHES}); pod watches the API "
            "server closed: per "
            "trial in the JSON (apiserver_terminated_watchers_total for pods, from before "
            f"the create until all pods are Running; whose: {watchers.SAID})",
            "both operators run at once on one cluster, jobs alternating in an order that "
            "rotates trial by trial (and size by size), so none always goes first; each "
            "trial starts on a quiet cluster (its processes and the operators within "
            f"{QUIET_MARGIN_CORES:g} cores of the cluster's idle rate for {QUIET_WINDOW_S:g} "
            "s, that rate measured at the cluster's start: the last trial's "
            "teardown done; the wait is in the JSON); idle: nothing else added; loaded: one "
            "busy process per core beside the cluster "
            f"({', '.join(args.conditions)} measured)",
        ]
        if args.limit:
            out.append(
                f"{LIMIT} (the physical limit): torchkube's own worker pods for the job (its "
                "pod builder: same containers, resources, claim, scheduling), created by a "
                f"client with no operator, {BARE_HOW}, no client rate limit; torchkube ÷ "
                f"{LIMIT} of the medians, target ≤ {TARGET_OF_LIMIT}×"
            )
    if fleet:
        out.append(
            f"fleet: {args.jobs} jobs × {args.per_job} workers on {args.fleet_nodes} nodes, "
            "the contenders one after the other in an order that rotates trial by trial "
            "(each operator restarted fresh before its trial, the other one running idle "
            "beside it, the cluster quiet first), every job created at once in a fresh "
            f"namespace, after one warm-up start of every job by {warmed_by(args.limit)}, not "
            f"counted ({COLD_WATCHES}; extra.fleet_warm_up), "
            "idle only (nothing else running); created/Running: from the first create "
            "request to the last worker pod seen by a watch (created) and seen Running "
            "(Kubeflow's workers: each job's N-1 Worker pods, its Master counted apart); all "
            "pods Running: every pod of every job (torchkube's rendezvous stores, Kubeflow's "
            "Masters); after each operator's first trial "
            f"only, the steady state: reconciles and CPU per minute for "
            f"{args.steady_minutes:g} minutes while nothing changes, and the last third's "
            "reconcile rate ÷ the first third's; pod watches the API server closed: its "
            "apiserver_terminated_watchers_total for pods from just before the first create "
            "until all pods are Running (watches it closed "
            "because their client did not drain them in time; KWOK watches again "
            "from resourceVersion 0 and is sent every pod again; whose: "
            f"{watchers.SAID}); KWOK CPU: its processes' CPU seconds from the first create to "
            "all pods Running"
        )
        if args.limit:
            out.append(
                f"{LIMIT} (the physical limit): torchkube's own worker pods of each job, "
                f"created job after job by a client with no operator, {BARE_HOW}, no "
                f"client rate limit; torchkube ÷ {LIMIT} of the medians"
            )
    out.append(
        f"{PEER}: training-operator {kubeflow.RELEASE} built from its Go module by "
        "hack/build-peers.sh, default flags (one controller thread, as its manifests deploy "
        "it), PyTorchJob with a Master and N-1 Workers whose pods carry what a torchkube "
        "worker of the same job does (the trainer's command and environment, the checkpoint "
        "claim mounted; bench/kubeflow.py); ratio = Kubeflow ÷ torchkube, of the medians"
    )
    if fleet and not single:
        out.append(f"peer client limits: {fleet_peer(args).describe()}")
    if single:
        out.append(
            f"peer client limits: {kubeflow.DEFAULT.describe()}"
            + (
                f"; {kubeflow.RAISED.describe()}; in the single-job scenario each Kubeflow "
                "configuration watches one namespace of its own (--namespace: two would "
                "otherwise both reconcile every PyTorchJob), reused job after job, where "
                "torchkube's jobs each get a fresh one"
                if args.raised_peer
                else ""
            )
        )
    out.append(
        "API requests: torchkube's writes (its reads come from watch caches); Kubeflow's "
        "client-go requests of every verb"
    )
    out.append(
        "operator CPU: CPU seconds of the job's operator (/proc/<pid>/stat) from apply until "
        "it has sent no request for 3 s, its request counter polled twice a second and read "
        "alone (torchkube: prometheus_client's name[] filter), so that the operator does not "
        "format its whole exposition for the benchmark inside the time counted (Kubeflow's "
        "Go exposition has no such filter and is read whole)"
    )
    if single:
        out.append(
            "where the CPU went: CPU seconds of each process (/proc/<pid>/stat) from apply to "
            "all Running; control plane = kube-apiserver, etcd, kube-scheduler, "
            "kube-controller-manager; the other operators run too; floor = all of it but the "
            "job's operator ÷ the cores they all got: no operator could bring the workers to "
            "Running sooner at that share"
        )
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = Results(
        "operator_scale" if args.only is None else f"operator_scale_{args.only}",
        command_line("bench.operator_scale", argv),
        config={k: v for k, v in vars(args).items()},
    )
    results.notes += notes(args)
    with tempfile.TemporaryDirectory(prefix="torchkube-bench-") as scratch:
        if args.only in (None, "single"):
            run_single(args, results, Path(scratch))
        if args.only in (None, "fast-scheduler"):
            run_fast_scheduler(args, results, Path(scratch))
        if args.only in (None, "fleet"):
            run_fleet(args, results, Path(scratch))
    results.write(record_dir_of(args))


if __name__ == "__main__":
    main()
