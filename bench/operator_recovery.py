"""Operator recovery: a failed or deleted worker, and a lost node → replacements, and how fast.

Run: ``python -m bench.operator_recovery`` (≈ 10 min; ``--quick`` for one trial each).

On the real control plane with KWOK nodes, through the operator as shipped:

1. **Failed worker.** An 8-worker job (1 GPU each) runs; one worker's pod is made ``Failed``
   with exit code 137 (``faults.fail_pod``: the kubelet's status write). Timed from the write's
   response to the replacement pod (same replica slot, new name) seen by a watch, and seen
   ``Running``. Again with the pod force-deleted (``kubectl delete --force``), the case
   Kubeflow's reference figure is for.
2. **Node loss.** A 5-worker job (8 GPUs each, so one worker per node) runs on 4 nodes of one
   failure domain plus one node elsewhere, with ``nodeLostGraceSeconds`` (default 5 s here).
   The domain's kwok process is killed: the 4 nodes stop heart-beating, the node-lifecycle
   controller marks them NotReady after its grace (20 s on the test cluster), the operator
   replaces their workers after the job's grace. Figures:

   - **operator reaction**: replacement created − node seen NotReady − the job's grace, for
     the last of the 4 replacements (the grace is the user's choice; the rest is ours);
   - **NotReady → all Running**: until all 5 workers are Running on healthy nodes (target:
     ≤ grace + 5 s);
   - **heartbeats stop → all Running**: the whole outage, the cluster's detection included.

Kubeflow reference (perf-targets.md §8, same machine kind): a force-deleted worker is back
Running in 0.2–0.3 s; after the same node loss only 1 of 5 pods was healthy after 480 s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import Reference, Results, Target, load_average, log
from bench.kube import ApiCount, NodeWatch, PodTimes, PodWatch, Stack, job_body, stack
from testbed import faults
from testbed.kwok import NodePool
from torchkube.api import labels as lbl

TARGET_CREATED = 1.0
KUBEFLOW_DELETED_RUNNING = 0.3  # the slower end of Kubeflow's 0.2–0.3 s
TARGET_AFTER_GRACE = 5.0


def replacement_of(
    victim: str, index: str, since: float
) -> Callable[[dict[str, PodTimes]], PodTimes | None]:
    """A predicate: the new pod for slot ``index`` (first seen after ``since``)."""

    def found(pods: dict[str, PodTimes]) -> PodTimes | None:
        for pod in pods.values():
            if (
                pod.name != victim
                and pod.labels.get(lbl.REPLICA_INDEX) == index
                and pod.seen >= since
            ):
                return pod
        return None

    return found


def running_since(name: str) -> Callable[[dict[str, PodTimes]], float | None]:
    """A predicate: when pod ``name`` was first seen Running, once it was."""
    return lambda pods: pods[name].running


def worker_failures(args: argparse.Namespace, bench: Stack, results: Results) -> None:
    failed_created = results.figure(
        "worker Failed → replacement created", "s", target=Target(TARGET_CREATED)
    )
    failed_running = results.figure("worker Failed → replacement Running", "s")
    deleted_created = results.figure(
        "worker force-deleted → replacement created", "s", target=Target(TARGET_CREATED)
    )
    deleted_running = results.figure(
        "worker force-deleted → replacement Running",
        "s",
        reference=Reference(KUBEFLOW_DELETED_RUNNING, "Kubeflow 0.2–0.3 s"),
    )
    failed_whole = results.figure("worker Failed → all 8 workers Running again", "s")
    deleted_whole = results.figure("worker force-deleted → all 8 workers Running again", "s")
    per_failure = results.figure("API requests per replaced worker", "req")
    namespace = bench.namespace("fail")
    workers = 8
    with PodWatch(bench.api, namespace, f"{lbl.ROLE}={lbl.ROLE_WORKER}") as watch:
        policy = {"maxRestarts": 1000}  # every trial is a failure; the job must outlive them
        bench.create_job(namespace, job_body("fail", workers, group="fail", failure_policy=policy))
        watch.wait(
            lambda pods: len([p for p in pods.values() if p.running]) >= workers,
            120,
            "8 Running workers",
        )
        time.sleep(3)  # let the start-up's status writes finish before counting requests
        victims: set[str] = set()
        reported: set[str] = set()
        for trial in range(2 * args.trials):
            mode = "failed" if trial % 2 == 0 else "deleted"
            live = sorted((p for p in watch.live() if p.running is not None), key=lambda p: p.seen)
            victim = live[trial % len(live)]
            index = victim.labels[lbl.REPLICA_INDEX]
            victims.add(victim.name)
            before = bench.metrics()
            load = load_average()
            called = time.monotonic()
            if mode == "failed":
                faults.fail_pod(bench.api, victim.name, namespace, exit_code=137)
            else:
                faults.delete_pod(bench.api, victim.name, namespace, force=True)
            t0 = time.monotonic()
            pod = watch.wait(
                replacement_of(victim.name, index, called), 60, f"a replacement for slot {index}"
            )
            watch.wait(running_since(pod.name), 60, "the replacement Running")
            created, running = pod.seen - t0, (pod.running or 0) - t0
            try:
                watch.wait(
                    lambda pods: len([p for p in watch.live() if p.running]) >= workers,
                    args.whole_timeout,
                    "all workers Running again",
                )
                whole: float | None = time.monotonic() - t0
            except TimeoutError as error:
                whole = None
                results.notes.append(f"{mode} trial {trial // 2 + 1}: {error}")
            # Healthy pods that were deleted although nobody but the operator touched them.
            removed = sorted(
                p.name
                for p in watch.pods.values()
                if p.deleted is not None and p.name not in victims and p.name not in reported
            )
            reported.update(removed)
            if removed:
                results.notes.append(
                    f"{mode} trial {trial // 2 + 1} (slot {index}): the operator also deleted "
                    f"healthy worker(s) {removed}; the job was whole again "
                    + ("never" if whole is None else f"after {whole:.1f}s")
                )
            time.sleep(2)
            count = ApiCount.between(before, bench.metrics())
            if mode == "failed":
                failed_created.add(created, load)
                failed_running.add(running, load)
                if whole is not None:
                    failed_whole.add(whole, load)
            else:
                deleted_created.add(created, load)
                deleted_running.add(running, load)
                if whole is not None:
                    deleted_whole.add(whole, load)
            per_failure.add(count.total, load)
            results.extra.setdefault("replacement_requests", []).append(count.requests)
            log(
                f"{mode} worker {index}: replacement created {created:.3f}s, Running "
                f"{running:.3f}s, job whole after "
                + ("NEVER" if whole is None else f"{whole:.2f}s")
                + f", {count.total:.0f} requests"
                + (f"; the operator also deleted {removed}" if removed else "")
            )
    bench.delete_namespace(namespace, force=True)


def node_losses(args: argparse.Namespace, bench: Stack, results: Results) -> None:
    grace = args.grace
    reaction = results.figure(
        f"node loss: operator reaction (created − NotReady seen − grace {grace} s)", "s"
    )
    reaction_stamp = results.figure(
        "node loss: operator reaction (created − node's lastTransitionTime − grace)", "s"
    )
    created_after = results.figure("node loss: NotReady → all replacements created", "s")
    running_after = results.figure(
        "node loss: NotReady → all 5 workers Running on healthy nodes",
        "s",
        target=Target(grace + TARGET_AFTER_GRACE, text=f"≤ grace + 5 s = {grace + 5} s"),
        note="Kubeflow: 1 of 5 healthy after 480 s",
    )
    not_ready = results.figure("node loss: heartbeats stop → nodes NotReady (cluster)", "s")
    outage = results.figure("node loss: heartbeats stop → all 5 Running again", "s")
    cluster = bench.cluster
    for trial in range(args.node_trials):
        group = f"nl{trial}"
        doomed = NodePool(f"{group}-lost", nodes=4, labels={"bench.torchkube.dev/group": group})
        first = NodePool(f"{group}-a", nodes=1, labels={"bench.torchkube.dev/group": group})
        spare = NodePool(f"{group}-spare", nodes=4, labels={"bench.torchkube.dev/group": group})
        cluster.add_pool(doomed)
        cluster.add_pool(first)
        namespace = bench.namespace("nodeloss")
        body = job_body(
            "nodeloss", 5, gpus=8, group=group, failure_policy={"nodeLostGraceSeconds": grace}
        )
        with (
            PodWatch(bench.api, namespace, f"{lbl.ROLE}={lbl.ROLE_WORKER}") as watch,
            NodeWatch(bench.api) as nodes,
        ):
            bench.create_job(namespace, body)
            watch.wait(
                lambda pods: len([p for p in pods.values() if p.running]) >= 5,
                120,
                "5 Running workers",
            )
            cluster.add_pool(spare)  # room for the replacements, added once the job is placed
            lost_nodes = set(doomed.node_names())
            lost = {p.name: p for p in watch.live() if p.node in lost_nodes}
            load = load_average()
            killed = time.monotonic()
            cluster.kill_domain(doomed.failure_domain)
            marked = {n.name: n for n in nodes.wait_not_ready(sorted(lost_nodes), 120)}

            def all_replaced(pods: dict[str, PodTimes], lost: set[str] = lost_nodes) -> bool:
                running = [p for p in watch.live() if p.running is not None]
                return len(running) >= 5 and not any(p.node in lost for p in running)

            watch.wait(all_replaced, grace + 120, "5 Running workers on healthy nodes")
            done = max(p.running or 0 for p in watch.live())
            reactions, stamped, creations = [], [], []
            wall = time.time() - time.monotonic()
            for name, pod in lost.items():
                index = pod.labels[lbl.REPLICA_INDEX]
                new = replacement_of(name, index, killed)(watch.pods)
                assert new is not None, f"no replacement for {name}"
                seen_not_ready = marked[pod.node].not_ready or killed
                creations.append(new.seen)
                reactions.append(new.seen - seen_not_ready - grace)
                since = dt.datetime.fromisoformat(marked[pod.node].transition).timestamp()
                stamped.append(new.seen + wall - since - grace)
        first_not_ready = min(n.not_ready or killed for n in marked.values())
        reaction.add(max(reactions), load)
        reaction_stamp.add(max(stamped), load)
        created_after.add(max(creations) - first_not_ready, load)
        running_after.add(done - first_not_ready, load)
        not_ready.add(first_not_ready - killed, load)
        outage.add(done - killed, load)
        log(
            f"node loss {trial + 1}: NotReady {first_not_ready - killed:.1f}s after the kill; "
            f"replacements created {max(creations) - first_not_ready:.2f}s and all Running "
            f"{done - first_not_ready:.2f}s after NotReady (grace {grace}s); operator reaction "
            f"{max(reactions):.3f}s"
        )
        bench.delete_namespace(namespace, force=True)
        for pool in (doomed, first, spare):
            cluster.remove_pool(pool.name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_recovery", description=__doc__)
    parser.add_argument("--trials", type=int, default=10, help="failed and deleted workers each")
    parser.add_argument("--node-trials", type=int, default=3)
    parser.add_argument("--grace", type=int, default=5, help="the job's nodeLostGraceSeconds")
    parser.add_argument(
        "--whole-timeout", type=float, default=180, help="how long a job may take to heal"
    )
    parser.add_argument("--quick", action="store_true", help="one trial each")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials = args.node_trials = 1
    results = Results(
        "operator_recovery", "python -m bench.operator_recovery", config=dict(vars(args))
    )
    pools = [NodePool("fail", nodes=4, labels={"bench.torchkube.dev/group": "fail"})]
    with (
        tempfile.TemporaryDirectory(prefix="torchkube-bench-") as scratch,
        stack(pools, Path(scratch)) as bench,
    ):
        worker_failures(args, bench, results)
        node_losses(args, bench, results)
    results.notes += [
        "times from the fault's API write returning to what a watch on the job's worker pods "
        "sees; node NotReady as seen by a watch on the nodes",
        "operator reaction: the operator counts the grace from the node's Ready condition "
        "lastTransitionTime, which has 1 s resolution (truncated), so it acts up to 1 s "
        "before 'grace after NotReady was seen'; the two reaction figures bracket the truth",
        "the test cluster's node-monitor grace is 20 s (Kubernetes' default: 50 s); "
        "nodeLostGraceSeconds is the job's own grace (default 30 s; here --grace)",
        "API requests per replaced worker: every write the operator made between the fault "
        "and the job being whole again (replacement pod, status, events, failure label)",
    ]
    results.write()


if __name__ == "__main__":
    main()
