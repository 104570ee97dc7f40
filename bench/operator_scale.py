"""Operator scale: apply a TrainingJob → every worker pod created, and every one Running.

Run: ``python -m bench.operator_scale`` (≈ 15 min; ``--quick`` for one trial of each size).

On the real control plane (kube-apiserver, scheduler, controller-manager built from source)
with KWOK nodes (100 × 8 GPUs for single jobs, like the Kubeflow reference run; 400 × 8 GPUs
for 50 jobs at once). Node creation is not timed. Each trial makes a fresh namespace whose
checkpoint claim is already bound, starts a watch on the namespace's worker pods, creates the
job through the API (what ``kubectl apply`` sends) and reads off, from the watch:

- **created**: job create sent → the last worker pod seen by the watch (the operator's work);
- **Running**: job create sent → the last worker seen ``Running`` (operator + kube-scheduler,
  whose own client is limited to 50 requests/s, + KWOK playing the kubelet).

The operator's metrics are scraped before and after each trial (after the job's status
settled): ``torchkube_api_requests_total{verb,resource}`` counts every request it sends
(writes only: reads come from its watch caches), ``torchkube_reconcile_duration_seconds_count``
its reconciles. The 50-job scenario starts a fresh operator first, so its CPU seconds
(``/proc/<pid>/stat``) and peak RSS (``VmHWM``) belong to that scenario.

Sizes are interleaved (8, 64, 512, 8, 64, 512, ...) so a burst of load from the machine's
other users spreads over all of them instead of landing on one size.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import Figure, Reference, Results, Target, load_average, log
from bench.kube import ApiCount, PodWatch, Stack, gpu_pools, job_body, stack
from torchkube.api import labels as lbl

# perf-targets.md §8: Kubeflow training-operator v1.8.1 on this machine kind, apply → all
# pods created and Running (100 KWOK nodes, 1 GPU per worker), and torchkube's targets.
KUBEFLOW_RUNNING = {8: 0.3, 64: 2.5, 512: 50.4}
TARGET_RUNNING = {8: 0.3, 64: 1.0, 512: 5.0}
TARGET_CREATED_512 = 5.0
WORKER_SELECTOR = f"{lbl.ROLE}={lbl.ROLE_WORKER}"


def settle(bench: Stack, quiet: float = 3.0, limit: float = 60.0) -> None:
    """Wait until the operator stops sending requests (status writes trail the pods)."""
    deadline = time.monotonic() + limit
    last = ApiCount.between({}, bench.metrics()).total
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = ApiCount.between({}, bench.metrics()).total
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet:
            return


def job_phase(bench: Stack, namespace: str, name: str) -> tuple[str, str]:
    from torchkube.api import GROUP, PLURAL, VERSION

    body = bench.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    status = body.get("status") or {}
    return status.get("phase", ""), status.get("workers", "")


class Scale:
    """Figures for the single-job sizes, filled trial by trial."""

    def __init__(self, results: Results, sizes: list[int]) -> None:
        self.results = results
        self.created: dict[int, Figure] = {}
        self.running: dict[int, Figure] = {}
        self.per_pod: dict[int, Figure] = {}
        self.per_reconcile: dict[int, Figure] = {}
        self.cpu: dict[int, Figure] = {}
        self.requests: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
        for n in sizes:
            self.created[n] = results.figure(
                f"{n} workers: apply → all created",
                "s",
                target=Target(TARGET_CREATED_512) if n == 512 else None,
            )
            self.running[n] = results.figure(
                f"{n} workers: apply → all Running",
                "s",
                target=Target(TARGET_RUNNING[n]) if n in TARGET_RUNNING else None,
                reference=Reference(KUBEFLOW_RUNNING[n], f"Kubeflow {KUBEFLOW_RUNNING[n]} s")
                if n in KUBEFLOW_RUNNING
                else None,
            )
        for n in sizes:
            self.per_pod[n] = results.figure(f"{n} workers: API requests per created pod", "req")
            self.per_reconcile[n] = results.figure(
                f"{n} workers: API requests per reconcile", "req"
            )
            self.cpu[n] = results.figure(f"{n} workers: operator CPU", "s")

    def trial(self, bench: Stack, workers: int, record: bool = True) -> None:
        setup = time.monotonic()
        namespace = bench.namespace(f"scale{workers}")
        setup = time.monotonic() - setup
        name = f"job{workers}"
        before, cpu_before = bench.metrics(), bench.operator_cpu_seconds()
        with PodWatch(bench.api, namespace, WORKER_SELECTOR) as watch:
            load = load_average()
            started = time.monotonic()
            bench.create_job(namespace, job_body(name, workers))
            timeout = 60 + workers
            created = watch.wait(
                lambda pods: len(pods) >= workers and max(p.seen for p in pods.values()),
                timeout,
                f"{workers} worker pods",
            )
            running = watch.wait(
                lambda pods: (
                    sum(p.running is not None for p in pods.values()) >= workers
                    and max(p.running or 0 for p in pods.values())
                ),
                timeout,
                f"{workers} Running workers",
            )
            duplicates = len(watch.pods) - workers
            first = min(p.seen for p in watch.pods.values())
        deadline = time.monotonic() + 60
        while job_phase(bench, namespace, name) != ("Running", f"{workers}/{workers}"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {name} status never showed {workers}/{workers} Running")
            time.sleep(0.3)
        settle(bench)
        count = ApiCount.between(before, bench.metrics())
        cpu = bench.operator_cpu_seconds() - cpu_before
        log(
            f"{workers} workers: first {first - started:.2f}s, created {created - started:.2f}s"
            f", Running {running - started:.2f}s"
            f", {count.total:.0f} requests in {count.reconciles:.0f} reconciles, CPU {cpu:.2f}s"
            + (f", {duplicates} EXTRA pods" if duplicates else "")
            + ("" if record else " (warm-up, not recorded)")
        )
        if record:
            self.created[workers].add(created - started, load)
            self.running[workers].add(running - started, load)
            pods = workers + 1  # the workers and the rendezvous store pod
            self.per_pod[workers].add(count.total / pods, load)
            self.per_reconcile[workers].add(count.total / max(count.reconciles, 1), load)
            self.cpu[workers].add(cpu, load)
            self.requests[workers].append(count.requests | {"reconciles": count.reconciles})
            self.results.extra.setdefault("trials", []).append(
                {
                    "workers": workers,
                    "first_created_s": round(first - started, 3),
                    "all_created_s": round(created - started, 3),
                    "all_running_s": round(running - started, 3),
                    "pods_per_s_after_first": round((workers - 1) / max(created - first, 1e-6), 1),
                    "extra_pods": duplicates,
                    "operator_cpu_s": round(cpu, 2),
                    "load": load,
                }
            )
        teardown = time.monotonic()
        bench.delete_namespace(namespace, force=True)
        log(f"(namespace set up in {setup:.1f}s, torn down in {time.monotonic() - teardown:.1f}s)")


def run_single(args: argparse.Namespace, results: Results, scratch: Path) -> None:
    sizes = args.sizes
    scale = Scale(results, sizes)
    trials = {n: (args.trials_large if n >= 256 else args.trials_small) for n in sizes}
    pools = gpu_pools(args.nodes, args.domains)
    with stack(pools, scratch) as bench:
        scale.trial(bench, 8, record=False)  # warm-up: first-use costs of a fresh operator
        for round_ in range(max(trials.values())):
            for n in sizes:
                if round_ < trials[n]:
                    scale.trial(bench, n)
    rows = []
    for n in sizes:
        runs = scale.requests[n]
        keys = sorted({k for r in runs for k in r})
        rows += [
            [str(n), key, f"{statistics.median([r.get(key, 0.0) for r in runs]):g}"] for key in keys
        ]
    results.tables["API requests per trial by verb and resource (median over trials)"] = (
        ["workers", "request", "count"],
        rows,
    )


def run_many(args: argparse.Namespace, results: Results, scratch: Path) -> None:
    jobs, per_job = args.jobs, 8
    total = jobs * per_job
    sending = results.figure(f"{jobs} jobs × {per_job}: the {jobs} creates sent (client)", "s")
    created = results.figure(f"{jobs} jobs × {per_job} workers: all created", "s")
    running = results.figure(f"{jobs} jobs × {per_job} workers: all Running", "s")
    cpu = results.figure(f"{jobs} jobs × {per_job}: operator CPU seconds", "s")
    idle = results.figure(f"operator idle CPU with {args.many_nodes} nodes, per minute", "s")
    rss = results.figure(f"{jobs} jobs × {per_job}: operator peak RSS", "MiB")
    per_pod = results.figure(f"{jobs} jobs × {per_job}: API requests per created pod", "req")
    per_rec = results.figure(f"{jobs} jobs × {per_job}: API requests per reconcile", "req")
    pools = gpu_pools(args.many_nodes, args.many_domains)
    with stack(pools, scratch) as bench:
        for trial in range(args.trials_many):
            bench.restart_operator()
            namespace = bench.namespace("many")
            time.sleep(5)
            cpu_idle_start, idle_started = bench.operator_cpu_seconds(), time.monotonic()
            time.sleep(args.idle_seconds)
            idle.add(
                (bench.operator_cpu_seconds() - cpu_idle_start)
                * 60
                / (time.monotonic() - idle_started)
            )
            before, cpu_before = bench.metrics(), bench.operator_cpu_seconds()
            with PodWatch(bench.api, namespace, WORKER_SELECTOR) as watch:
                load = load_average()
                started = time.monotonic()
                for index in range(jobs):
                    bench.create_job(namespace, job_body(f"job{index:02d}", per_job))
                sent = time.monotonic() - started
                all_created = watch.wait(
                    lambda pods: len(pods) >= total and max(p.seen for p in pods.values()),
                    600,
                    f"{total} worker pods",
                )
                all_running = watch.wait(
                    lambda pods: (
                        sum(p.running is not None for p in pods.values()) >= total
                        and max(p.running or 0 for p in pods.values())
                    ),
                    600,
                    f"{total} Running workers",
                )
            settle(bench, quiet=5.0, limit=120.0)
            count = ApiCount.between(before, bench.metrics())
            used = bench.operator_cpu_seconds() - cpu_before
            peak = bench.operator_peak_rss() / 2**20
            sending.add(sent, load)
            created.add(all_created - started, load)
            running.add(all_running - started, load)
            cpu.add(used, load)
            rss.add(peak, load)
            per_pod.add(count.total / (total + jobs), load)
            per_rec.add(count.total / max(count.reconciles, 1), load)
            results.extra.setdefault("many_jobs_requests", []).append(
                count.requests | {"reconciles": count.reconciles, "create_calls_s": sent}
            )
            log(
                f"trial {trial + 1}: {jobs} jobs sent in {sent:.2f}s, all created "
                f"{all_created - started:.2f}s, Running {all_running - started:.2f}s, "
                f"CPU {used:.1f}s, peak RSS {peak:.0f} MiB, {count.total:.0f} requests"
            )
            bench.delete_namespace(namespace, wait=600, force=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_scale", description=__doc__)
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 64, 512]
    )
    parser.add_argument("--trials-small", type=int, default=5, help="trials of 8 and 64")
    parser.add_argument("--trials-large", type=int, default=3, help="trials of 512")
    parser.add_argument("--nodes", type=int, default=100, help="8-GPU nodes for single jobs")
    parser.add_argument("--domains", type=int, default=2, help="kwok processes for them")
    parser.add_argument("--jobs", type=int, default=50, help="jobs of 8 workers at once")
    parser.add_argument("--many-nodes", type=int, default=400)
    parser.add_argument("--many-domains", type=int, default=4)
    parser.add_argument("--trials-many", type=int, default=2)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--only", choices=["single", "many"], help="one scenario only")
    parser.add_argument("--quick", action="store_true", help="one trial each (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials_small = args.trials_large = args.trials_many = 1
    results = Results(
        "operator_scale",
        "python -m bench.operator_scale",
        config={k: v for k, v in vars(args).items()},
    )
    results.notes += [
        "created/Running: from the job create request to the last worker pod seen by a watch "
        "(created) and seen Running; node creation is not timed; one 8-worker warm-up job per "
        "cluster is not counted",
        "API requests are the operator's writes (it reads from watch caches); per created pod "
        "counts the workers plus the rendezvous store pod, and includes the job's Service, "
        "status patches and events",
        "Kubeflow figures: perf-targets.md §8 (training-operator v1.8.1, same machine kind, "
        "same apiserver and KWOK, one run each); ratio = Kubeflow ÷ torchkube",
    ]
    with tempfile.TemporaryDirectory(prefix="torchkube-bench-") as scratch:
        if args.only in (None, "single"):
            run_single(args, results, Path(scratch))
        if args.only in (None, "many"):
            run_many(args, results, Path(scratch))
    if args.only:
        results.name = f"operator_scale_{args.only}"
    results.write()


if __name__ == "__main__":
    main()
