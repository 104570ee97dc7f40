"""Recovery on real kubelet nodes: a worker pod deleted, with and without a hot spare, and a
hung worker found and replaced.

Run: ``python -m bench.real_node_recovery`` as root with Docker installed (≈ 25 min when the
trainer image is already on the nodes, ≈ 5 min more to build and import it; ``--trials N``,
``--cases deleted,spare,hang,hang-spare``).

The harness's real-node cluster (the control plane built from source, 2 kubelet + containerd
nodes on this machine, CoreDNS), the Dockerfile's trainer image imported into both nodes, and
the operator as a process. Each trial applies a fresh 2-worker CPU job — the tiny GPT, gloo,
one process per pod, ``replicas: {min: 2, max: 2}`` (a fixed size: training cannot go on
without a second worker), a checkpoint every 50 steps, progress written at every step — waits
until both workers train past a checkpoint, and then:

- **deleted**: ``kubectl delete pod`` of a training worker (graceful: it writes its emergency
  checkpoint and leaves the rendezvous); no spare, so the operator's replacement pod must be
  scheduled, started and import torch before the round can form again;
- **spare**: the same with ``replicas.spares: 1``: the spare standing by joins the next round;
- **hang**: a training worker's trainer process SIGSTOPped (``hangTimeoutSeconds: 15``); its
  launcher's watchdog finds it, dumps its stacks and ends the pod, which is replaced;
- **hang-spare**: the same with a spare.

Figures per case, each watched from the fault on and side by side, none waiting for another
(progress.json on the job's volume, read from the host; pod and job state through the API;
every pending one checked every 0.1 s):

- **training again**: the fault → the first progress report of the resumed round past the
  checkpoint it resumed from, at world size 2;
- hang cases also: **pod ended**: SIGSTOP → the hung pod's container terminated (the watchdog's
  detection, timeout included); **Hang recorded**: SIGSTOP → ``status.lastFailure`` is the Hang.

Targets (issue #20): with a spare, a deleted worker trains again in ≤ 10 s, and in at most half
the time it takes without one (the no-spare figure is the reference: ratio ≥ 2).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import (
    Figure,
    Reference,
    Results,
    Target,
    command_line,
    load_average,
    log,
    rotated,
)

ROOT = Path(__file__).resolve().parents[1]
TRAINER_TAG = "torchkube/trainer:test"  # the tests' image: one archive, one import
APP_UID = 10001
STEPS, EVERY, HANG_TIMEOUT = 100000, 50, 15
CASES = ("deleted", "spare", "hang", "hang-spare")
TARGET_SPARE = 10.0


def job_manifest(name: str, namespace: str, case: str) -> dict[str, Any]:
    from testbed.realnodes import REAL_NODE_LABEL
    from torchkube.api import GROUP, VERSION

    replicas: dict[str, Any] = {"min": 2, "max": 2}
    if case.endswith("spare"):
        replicas["spares"] = 1
    policy: dict[str, Any] = {"maxRestarts": 5}
    if case.startswith("hang"):
        policy["hangTimeoutSeconds"] = HANG_TIMEOUT
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": TRAINER_TAG,
            "imagePullPolicy": "Never",
            "replicas": replicas,
            "nprocPerNode": 1,
            "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}},
            "checkpoint": {"intervalSteps": EVERY, "keep": 3},
            "failurePolicy": policy,
            "scheduling": {"nodeSelector": {REAL_NODE_LABEL: "true"}},
            "trainer": {
                "model": "tiny",
                "device": "cpu",
                "steps": STEPS,
                "seqLen": 64,
                "microBatchSize": 2,
                "globalBatchSize": 4,
                "warmupSteps": 1,
                "logIntervalSteps": 1,
            },
        },
    }


class Bench:
    """The cluster, the image and the operator, shared by every trial."""

    def __init__(self, scratch: Path) -> None:
        from testbed.cluster import Cluster, ClusterConfig
        from testbed.crds import install_crd
        from testbed.docker import DockerDaemon, build_image, ensure_base_image
        from testbed.operator import OperatorProcess

        self.scratch = scratch
        self.daemon = DockerDaemon(report=log)
        docker = self.daemon.start()
        base = ensure_base_image(docker, report=log)
        build_image(
            docker,
            ROOT,
            "trainer",
            TRAINER_TAG,
            {"PYTHON_BASE": base, "TRAINER_BASE": base},
            report=log,
        )
        self.cluster = Cluster(ClusterConfig(pools=[], real_nodes=2), report=log)
        self.cluster.start()
        assert self.cluster.real_nodes is not None
        self.cluster.real_nodes.load_image(docker, TRAINER_TAG)
        self.api = self.cluster.api_client()
        install_crd(self.api)
        self.operator = OperatorProcess(
            self.cluster.kubeconfig,
            self.cluster.log_dir / "operator.log",
            env={
                "TORCHKUBE_PROGRESS_URL": "http://{pod_ip}:{port}/progress",
                "TORCHKUBE_PROGRESS_INTERVAL_SECONDS": "1",
            },
        ).start()

    def close(self, failed: bool) -> None:
        self.operator.stop()
        self.api.close()
        self.cluster.stop(failed=failed)
        self.daemon.stop()


class Trial:
    """One job in a namespace of its own, its checkpoint folder on the host."""

    def __init__(self, bench: Bench, case: str, index: int) -> None:
        from kubernetes import client

        from testbed.volumes import prebound_volume
        from testbed.wait import wait_for

        self.bench, self.case = bench, case
        core: Any = client.CoreV1Api(bench.api)
        custom: Any = client.CustomObjectsApi(bench.api)
        self.core, self.custom = core, custom
        self.namespace, self.name = f"bench-{case}-{index}", "recover"
        core.create_namespace({"metadata": {"name": self.namespace}})
        wait_for(self._has_default_sa, 30, what=f"ServiceAccount default in {self.namespace}")
        self.checkpoints = bench.scratch / self.namespace
        self.checkpoints.mkdir()
        os.chown(self.checkpoints, APP_UID, APP_UID)  # hostPath ignores fsGroup
        self.volume = prebound_volume(
            bench.api, self.namespace, f"{self.name}-checkpoints", str(self.checkpoints)
        )
        body = job_manifest(self.name, self.namespace, case)
        self.custom.create_namespaced_custom_object(
            body["apiVersion"].split("/")[0], "v1alpha1", self.namespace, "trainingjobs", body
        )

    def _has_default_sa(self) -> bool:
        from kubernetes import client

        try:
            self.core.read_namespaced_service_account("default", self.namespace)
        except client.ApiException:
            return False
        return True

    def progress(self) -> dict[str, Any]:
        try:
            report: dict[str, Any] = json.loads((self.checkpoints / "progress.json").read_text())
        except (OSError, ValueError):
            return {}
        return report

    def status(self) -> dict[str, Any]:
        body = self.custom.get_namespaced_custom_object(
            "torchkube.io", "v1alpha1", self.namespace, "trainingjobs", self.name
        )
        return dict(body.get("status") or {})

    def pods(self) -> list[Any]:
        return list(
            self.core.list_namespaced_pod(
                self.namespace, label_selector=f"torchkube.io/job-name={self.name}"
            ).items
        )

    def training_pod(self) -> Any:
        """A Running, Ready worker: one that trains (a spare is not Ready)."""
        for pod in self.pods():
            ready = any(
                c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
            )
            if pod.metadata.labels.get("torchkube.io/role") == "worker" and ready:
                return pod
        return None

    def close(self) -> None:
        from testbed.volumes import delete_volume

        self.core.delete_namespace(self.namespace)
        delete_volume(self.bench.api, self.volume)


def poll(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def first_times(
    conditions: dict[str, Callable[[], Any]],
    timeout: float,
    interval: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, float]:
    """When each condition first held (``clock`` time), every pending one checked each round.

    The figures of one fault are watched side by side from the fault on: none waits for
    another, so training that is back before its Hang reaches the status is timed when it is
    back, not when the status is written.
    """
    deadline = clock() + timeout
    seen: dict[str, float] = {}
    while True:
        for name, holds in conditions.items():
            if name not in seen and holds():
                seen[name] = clock()
        if len(seen) == len(conditions):
            return seen
        if clock() >= deadline:
            pending = ", ".join(n for n in conditions if n not in seen)
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {pending}")
        sleep(interval)


def resumed_after(trial: Trial, before: dict[str, Any]) -> Callable[[], bool]:
    def again() -> bool:
        report = trial.progress()
        return (
            int(report.get("resumes") or 0) > int(before.get("resumes") or 0)
            and int(report.get("step") or 0) > int(report.get("lastCheckpointStep") or 0)
            and report.get("worldSize") == 2
        )

    return again


def run_trial(bench: Bench, case: str, index: int, figures: dict[str, Figure]) -> None:
    from testbed.realnodes import trainer_process

    trial = Trial(bench, case, index)
    try:
        poll(
            lambda: (
                trial.progress().get("worldSize") == 2
                and int(trial.progress().get("step") or 0) > EVERY + 5
                and trial.training_pod() is not None
                and (not case.endswith("spare") or trial.status().get("spares") == 1)
            ),
            420,
            "2 workers past a checkpoint",
            interval=0.5,
        )
        victim, before = trial.training_pod(), trial.progress()
        if case.startswith("hang"):
            os.kill(trainer_process(victim.metadata.uid), signal.SIGSTOP)
        else:
            trial.core.delete_namespaced_pod(victim.metadata.name, trial.namespace)
        fault = time.monotonic()
        watched = {"again": resumed_after(trial, before)}
        if case.startswith("hang"):
            watched["ended"] = lambda: ended(trial, victim.metadata.name)
            watched["recorded"] = lambda: (
                (trial.status().get("lastFailure") or {}).get("reason") == "Hang"
            )
        for key, at in first_times(watched, 300).items():
            figures[key].add(at - fault)
        log(
            f"{case} #{index}: "
            + ", ".join(
                f"{k} {f.values[-1]:.1f} s" for k, f in figures.items() if len(f.values) > index
            )
        )
    finally:
        trial.close()


def ended(trial: Trial, pod_name: str) -> bool:
    for pod in trial.pods():
        if pod.metadata.name == pod_name:
            statuses = pod.status.container_statuses or []
            return any(s.state and s.state.terminated for s in statuses)
    return True


@contextmanager
def bench_cluster() -> Iterator[Bench]:
    with tempfile.TemporaryDirectory(prefix="torchkube-bench-") as scratch:
        bench = Bench(Path(scratch))
        failed = False
        try:
            yield bench
        except BaseException:
            failed = True
            raise
        finally:
            bench.close(failed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.real_node_recovery", description=__doc__)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    results = Results(
        "real_node_recovery", command_line("bench.real_node_recovery", argv), config=vars(args)
    )
    labels = {
        "deleted": "worker pod deleted, no spare",
        "spare": "worker pod deleted, 1 spare",
        "hang": "worker SIGSTOPped, no spare",
        "hang-spare": "worker SIGSTOPped, 1 spare",
    }
    figures: dict[str, dict[str, Figure]] = {}
    for case in cases:
        figures[case] = {"again": results.figure(f"{labels[case]}: training again", "s")}
        if case.startswith("hang"):
            figures[case]["ended"] = results.figure(f"{labels[case]}: pod ended (detection)", "s")
            figures[case]["recorded"] = results.figure(f"{labels[case]}: Hang in the status", "s")
    with bench_cluster() as bench:
        for index in range(args.trials):
            for case in rotated(cases, index):
                run_trial(bench, case, index, figures[case])
    if "spare" in figures:
        spare = figures["spare"]["again"]
        spare.target = Target(TARGET_SPARE)
        no_spare = figures.get("deleted", {}).get("again")
        if no_spare is not None and no_spare.stats is not None:
            spare.reference = Reference(
                no_spare.stats.median, f"no spare {no_spare.stats.median:.1f} s; target ratio ≥ 2"
            )
    results.notes += [
        f"2 real nodes on one 2-core machine; a fixed-size 2-worker CPU job (tiny GPT, gloo), "
        f"checkpoints every {EVERY} steps, hangTimeoutSeconds {HANG_TIMEOUT} in the hang cases",
        "training again: the fault → the first progress report past the checkpoint the resumed "
        "round started from, at world size 2 (progress.json read every 0.1 s from the fault on, "
        "beside and independently of the pod's end and the status)",
        "trials alternate between the cases, in an order that rotates trial by trial; load "
        "average: the 1-minute one at each figure",
    ]
    results.extra["load_average_end"] = load_average()
    results.write()


if __name__ == "__main__":
    main()
