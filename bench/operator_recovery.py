"""Operator recovery, side by side: a failed or deleted worker, and a lost node → replacements,
and how fast, for torchkube, Kubeflow's training-operator and the physical limit on one
cluster.

Run: ``python -m bench.operator_recovery`` (≈ 20 min; ``--quick`` for one trial each;
``--no-peers`` without Kubeflow; ``--no-limit`` without the limit).

The limit (``bench.contenders.Replacer``): torchkube's own worker pods created by a bare
client with no operator and replaced by a watch of its own — a pod Failed or deleted gets a
new pod in its slot the moment the watch shows it, the pods of a node NotReady for the grace
are force-deleted and replaced then. It keeps no status and counts nothing: an operator's time
beyond it is what its decisions cost.

On the real control plane with KWOK nodes, all of them running at once:

1. **Failed or deleted worker.** Each operator runs an 8-worker job (1 GPU each) asking for its
   own recovery: torchkube's failure policy, Kubeflow's ``restartPolicy: ExitCode``. Trials
   alternate between the two jobs. One worker's pod is made ``Failed`` with exit code 137
   (``faults.fail_pod``: the kubelet's status write), or force-deleted (``kubectl delete
   --force``). Timed from the fault's API write returning to the replacement pod (same replica
   slot, new uid) seen by a watch, to it seen ``Running``, and to all 8 workers Running again.
2. **Node loss.** A 5-worker job (8 GPUs each, one worker per node) runs on 4 nodes of one
   failure domain plus one node elsewhere. The domain's kwok process is killed: the 4 nodes
   stop heart-beating, the node-lifecycle controller marks them NotReady after its grace
   (20 s on the test cluster). torchkube replaces their workers after the job's
   ``nodeLostGraceSeconds`` (``--grace``); Kubeflow has no such policy, so its job is given
   ``--peer-wait`` seconds after NotReady and what it reached by then is reported. Figures:

   - **operator reaction**: replacement created − node seen NotReady − the job's grace, for
     the last of the 4 replacements (the grace is the user's choice; the rest is ours);
   - **NotReady → all Running**: until all 5 workers are Running on healthy nodes (target:
     ≤ grace + 5 s);
   - **heartbeats stop → all Running**: the whole outage, the cluster's detection included.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
    spread,
)
from bench.contenders import PEER, BareClient, Contender, Resilience, contenders
from bench.kube import NodeWatch, PodTimes, PodWatch, Stack, stack
from testbed import faults
from testbed.kwok import NodePool

TARGET_CREATED = 1.0
TARGET_AFTER_GRACE = 5.0
WORKERS = 8
NODE_JOB_WORKERS = 5
GROUP_LABEL = "bench.torchkube.dev/group"


def stop_replacing(players: list[Contender]) -> None:
    """The limit's replacers stopped before their namespace goes: they would replace every
    pod its deletion takes."""
    for player in players:
        if isinstance(player, BareClient):
            player.stop()


def replacement_of(
    contender: Contender, victim: PodTimes, since: float
) -> Callable[[dict[str, PodTimes]], PodTimes | None]:
    """A predicate: the new pod for ``victim``'s slot (first seen after ``since``)."""
    slot = contender.slot(victim)

    def found(pods: dict[str, PodTimes]) -> PodTimes | None:
        for pod in pods.values():
            if pod.uid != victim.uid and contender.slot(pod) == slot and pod.seen >= since:
                return pod
        return None

    return found


def running_workers(watch: PodWatch) -> int:
    return len([p for p in watch.alive() if p.running])


def all_running(watch: PodWatch, workers: int) -> Callable[[dict[str, PodTimes]], bool]:
    """A predicate: ``workers`` of the watched pods are alive and Running."""
    return lambda _: running_workers(watch) >= workers


@dataclass
class FaultFigures:
    """One operator's figures for one kind of fault."""

    created: Figure
    running: Figure
    whole: Figure

    @classmethod
    def of(cls, results: Results, name: str, fault: str, ours: bool) -> FaultFigures:
        return cls(
            results.figure(
                f"worker {fault} → replacement created, {name}",
                "s",
                target=Target(TARGET_CREATED) if ours else None,
            ),
            results.figure(f"worker {fault} → replacement Running, {name}", "s"),
            results.figure(f"worker {fault} → all {WORKERS} workers Running again, {name}", "s"),
        )


class WorkerFaults:
    """Failed and force-deleted workers, alternating between the operators' jobs."""

    FAULTS = ("Failed", "force-deleted")

    def __init__(self, results: Results, players: list[Contender], whole_timeout: float) -> None:
        self.results, self.players, self.whole_timeout = results, players, whole_timeout
        self.figures = {
            (p.name, fault): FaultFigures.of(results, p.name, fault, p.name == "torchkube")
            for p in players
            for fault in self.FAULTS
        }
        self.requests = {
            p.name: results.figure(f"API requests per replaced worker, {p.name}", "req")
            for p in players
        }

    def run(self, bench: Stack, trials: int) -> None:
        with contextlib.ExitStack() as stack_:
            jobs: dict[str, tuple[str, PodWatch]] = {}
            for player in self.players:
                namespace = bench.namespace("fail")
                watch = stack_.enter_context(PodWatch(bench.api, namespace, player.selector))
                player.submit(
                    bench, namespace, "fail", WORKERS, group="fail", resilient=Resilience()
                )
                jobs[player.name] = namespace, watch
            for player in self.players:
                watch = jobs[player.name][1]
                watch.wait(all_running(watch, WORKERS), 120, "8 Running workers")
            time.sleep(3)  # let the start-up's status writes finish before counting requests
            for trial in range(2 * trials):
                fault = self.FAULTS[trial % 2]
                for player in self.players:
                    namespace, watch = jobs[player.name]
                    self.trial(bench, player, namespace, watch, fault, trial // 2)
            stop_replacing(self.players)
            for namespace, _ in jobs.values():
                bench.delete_namespace(namespace, force=True)

    def trial(
        self,
        bench: Stack,
        player: Contender,
        namespace: str,
        watch: PodWatch,
        fault: str,
        round_: int,
    ) -> None:
        live = sorted((p for p in watch.alive() if p.running is not None), key=lambda p: p.seen)
        victim = live[round_ % len(live)]
        healthy = {p.uid for p in live} - {victim.uid}
        requests_before = player.requests()
        load = load_average()
        called = time.monotonic()
        if fault == "Failed":
            faults.fail_pod(bench.api, victim.name, namespace, exit_code=137)
        else:
            faults.delete_pod(bench.api, victim.name, namespace, force=True)
        t0 = time.monotonic()
        pod = watch.wait(replacement_of(player, victim, called), 60, f"a replacement of {victim}")
        watch.wait(lambda pods: pods[pod.uid].running, 60, "the replacement Running")
        created, running = pod.seen - t0, (pod.running or 0) - t0
        try:
            watch.wait(all_running(watch, WORKERS), self.whole_timeout, "a whole job")
            whole: float | None = time.monotonic() - t0
        except TimeoutError as error:
            whole = None
            self.results.notes.append(f"{player.name}, {fault} trial {round_ + 1}: {error}")
        # Healthy pods that were deleted although nobody but the operator touched them.
        removed = sorted(
            p.name for p in watch.pods.values() if p.uid in healthy and p.deleted is not None
        )
        if removed:
            self.results.notes.append(
                f"{player.name}, {fault} trial {round_ + 1}: the operator also deleted healthy "
                f"worker(s) {removed}; the job was whole again "
                + ("never" if whole is None else f"after {whole:.1f}s")
            )
        time.sleep(2)
        requests = player.requests() - requests_before
        figures = self.figures[(player.name, fault)]
        figures.created.add(created, load)
        figures.running.add(running, load)
        if whole is not None:
            figures.whole.add(whole, load)
        self.requests[player.name].add(requests, load)
        log(
            f"{player.name}, worker {fault}: replacement created {created:.3f}s, Running "
            f"{running:.3f}s, job whole after "
            + ("NEVER" if whole is None else f"{whole:.2f}s")
            + f", {requests:.0f} requests"
            + (f"; the operator also deleted {removed}" if removed else "")
        )

    def compare(self) -> None:
        """torchkube beside each other contender: the peer's median ÷ ours, and ours ÷ the
        limit's (the bare client's replacer)."""
        names = [p.name for p in self.players if p.name != "torchkube"]
        if not names:
            return
        rows = []
        for fault in self.FAULTS:
            ours = self.figures[("torchkube", fault)]
            for what in ("created", "running", "whole"):
                mine = getattr(ours, what)
                others = [getattr(self.figures[(name, fault)], what) for name in names]
                if not (mine.stats and all(other.stats for other in others)):
                    continue
                row = [mine.name.removesuffix(", torchkube"), spread(mine)]
                for name, other in zip(names, others, strict=True):
                    assert other.stats is not None and mine.stats is not None
                    if name == PEER:
                        mine.reference = Reference(
                            other.stats.median, f"{PEER}, same run: {fmt(other.stats.median, 's')}"
                        )
                    ratio = (
                        mine.stats.median / other.stats.median
                        if name == LIMIT
                        else other.stats.median / mine.stats.median
                    )
                    row += [spread(other), fmt(ratio, "x")]
                rows.append(row)
        headers = ["figure", "torchkube"]
        for name in names:
            ratio = "torchkube ÷ limit" if name == LIMIT else f"{name} ÷ torchkube"
            headers += [name, ratio]
        self.results.tables["worker faults: median [min – max]"] = (headers, rows)


class NodeLoss:
    """One operator's figures for the loss of 4 of its job's 5 nodes."""

    def __init__(self, results: Results, name: str, grace: int, peer_wait: float) -> None:
        ours = name == "torchkube"
        self.name, self.grace, self.peer_wait = name, grace, peer_wait
        self.results = results
        self.reaction = results.figure(
            f"node loss: operator reaction (created − NotReady seen − grace {grace} s), {name}",
            "s",
        )
        self.reaction_stamp = results.figure(
            f"node loss: operator reaction (created − lastTransitionTime − grace), {name}", "s"
        )
        self.running_after = results.figure(
            f"node loss: NotReady → all 5 workers Running on healthy nodes, {name}",
            "s",
            target=Target(grace + TARGET_AFTER_GRACE, text=f"≤ grace + 5 s = {grace + 5} s")
            if ours
            else None,
        )
        self.not_ready = results.figure(
            f"node loss: heartbeats stop → nodes NotReady (cluster), {name}", "s"
        )
        self.outage = results.figure(
            f"node loss: heartbeats stop → all 5 Running again, {name}", "s"
        )
        self.healthy = results.figure(
            f"node loss: workers Running on healthy nodes {grace + peer_wait:g} s after "
            f"NotReady, {name}",
            "pods",
        )

    def trial(self, bench: Stack, player: Contender, trial: int) -> None:
        cluster, grace = bench.cluster, self.grace
        group = f"nl{trial}{player.name[:2].lower()}"
        labels = {GROUP_LABEL: group}
        doomed = NodePool(f"{group}-lost", nodes=4, labels=labels)
        first = NodePool(f"{group}-a", nodes=1, labels=labels)
        spare = NodePool(f"{group}-spare", nodes=4, labels=labels)
        cluster.add_pool(doomed)
        cluster.add_pool(first)
        namespace = bench.namespace("nodeloss")
        with (
            PodWatch(bench.api, namespace, player.selector) as watch,
            NodeWatch(bench.api) as nodes,
        ):
            player.submit(
                bench,
                namespace,
                "nodeloss",
                NODE_JOB_WORKERS,
                gpus=8,
                group=group,
                resilient=Resilience(node_grace=grace),
            )
            watch.wait(all_running(watch, NODE_JOB_WORKERS), 120, "5 Running workers")
            cluster.add_pool(spare)  # room for the replacements, added once the job is placed
            lost_nodes = set(doomed.node_names())
            lost = [p for p in watch.alive() if p.node in lost_nodes]
            load = load_average()
            killed = time.monotonic()
            cluster.kill_domain(doomed.failure_domain)
            marked = {n.name: n for n in nodes.wait_not_ready(sorted(lost_nodes), 120)}
            first_not_ready = min(n.not_ready or killed for n in marked.values())

            def on_healthy_nodes() -> list[PodTimes]:
                return [
                    p for p in watch.alive() if p.running is not None and p.node not in lost_nodes
                ]

            limit = first_not_ready + grace + self.peer_wait - time.monotonic()
            try:
                watch.wait(lambda _: len(on_healthy_nodes()) >= 5, limit, "5 on healthy nodes")
                done: float | None = max(p.running or 0 for p in on_healthy_nodes())
            except TimeoutError:
                done = None
            healthy = len(on_healthy_nodes())
            reactions, stamped = [], []
            wall = time.time() - time.monotonic()
            for pod in lost:
                new = replacement_of(player, pod, killed)(watch.pods)
                if new is None:
                    continue
                node = marked[pod.node]
                reactions.append(new.seen - (node.not_ready or killed) - grace)
                since = dt.datetime.fromisoformat(node.transition).timestamp()
                stamped.append(new.seen + wall - since - grace)
        detected = first_not_ready - killed
        self.healthy.add(healthy, load)
        self.not_ready.add(detected, load)
        if done is not None:
            self.running_after.add(done - first_not_ready, load)
            self.outage.add(done - killed, load)
        if reactions and len(reactions) == len(lost):
            self.reaction.add(max(reactions), load)
            self.reaction_stamp.add(max(stamped), load)
        outcome = (
            f"all 5 Running {done - first_not_ready:.2f}s after NotReady"
            if done is not None
            else f"only {healthy} of 5 Running on healthy nodes after "
            f"{grace + self.peer_wait:g}s ({len(reactions)} of {len(lost)} replaced)"
        )
        log(f"{player.name}, node loss {trial + 1}: NotReady after {detected:.1f}s; {outcome}")
        if done is None:
            self.results.notes.append(f"{player.name}, node loss trial {trial + 1}: {outcome}")
        stop_replacing([player])
        bench.delete_namespace(namespace, force=True)
        for pool in (doomed, first, spare):
            cluster.remove_pool(pool.name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_recovery", description=__doc__)
    parser.add_argument("--trials", type=int, default=10, help="failed and deleted workers each")
    parser.add_argument("--node-trials", type=int, default=3)
    parser.add_argument("--grace", type=int, default=5, help="torchkube's nodeLostGraceSeconds")
    parser.add_argument(
        "--peer-wait",
        type=float,
        default=120,
        help="how long after NotReady + grace a node-loss trial waits for the job to heal",
    )
    parser.add_argument(
        "--whole-timeout", type=float, default=180, help="how long a job may take to heal"
    )
    parser.add_argument("--no-peers", dest="peers", action="store_false")
    parser.add_argument(
        "--no-limit",
        dest="limit",
        action="store_false",
        help="leave out the bare client's replacer (the physical limit of a replacement)",
    )
    parser.add_argument("--quick", action="store_true", help="one trial each")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials = args.node_trials = 1
    return leaving_out(parser, args, ["peers", "limit"])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = Results(
        "operator_recovery",
        command_line("bench.operator_recovery", argv),
        config=dict(vars(args)),
    )
    pools = [NodePool("fail", nodes=8, labels={GROUP_LABEL: "fail"})]
    with (
        tempfile.TemporaryDirectory(prefix="torchkube-bench-") as scratch,
        stack(pools, Path(scratch)) as bench,
        contenders(bench, args.peers, limit=args.limit) as players,
    ):
        faults_ = WorkerFaults(results, players, args.whole_timeout)
        faults_.run(bench, args.trials)
        faults_.compare()
        losses = {p.name: NodeLoss(results, p.name, args.grace, args.peer_wait) for p in players}
        for trial in range(args.node_trials):
            for player in players:
                losses[player.name].trial(bench, player, trial)
    results.notes += [
        "both operators run at once on one cluster; trials alternate between their jobs; "
        "Kubeflow: training-operator v1.8.1, PyTorchJob with restartPolicy ExitCode (exit 137 "
        "is retryable); ratio = Kubeflow ÷ torchkube, of the medians",
        "times from the fault's API write returning to what a watch on the job's worker pods "
        "sees; node NotReady as seen by a watch on the nodes",
        "operator reaction: torchkube counts the grace from the node's Ready condition "
        "lastTransitionTime, which has 1 s resolution (truncated), so it acts up to 1 s "
        "before 'grace after NotReady was seen'; the two reaction figures bracket the truth",
        "the test cluster's node-monitor grace is 20 s (Kubernetes' default: 50 s); "
        "nodeLostGraceSeconds is the job's own grace (default 30 s; here --grace); a node "
        "loss trial ends --peer-wait seconds after NotReady + grace if the job has not healed",
        "API requests per replaced worker: torchkube's writes, Kubeflow's client-go requests, "
        "between the fault and the job being whole again",
        f"{LIMIT}: the physical limit of a replacement — torchkube's own worker pods created "
        "by a bare client with no operator, and replaced by a watch of its own: a pod Failed "
        "or deleted gets a new pod in its slot the moment the watch shows it (one create), "
        "the pods of a node NotReady for the grace are force-deleted and replaced then; no "
        "status, no accounting, no backoff; trials alternate with the operators' jobs",
    ]
    results.write(record_dir_of(args))


if __name__ == "__main__":
    main()
