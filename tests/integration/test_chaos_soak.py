"""A seeded chaos soak: several jobs while pods are killed and deleted, nodes deleted and
silenced, the operator SIGKILLed, jobs scaled, suspended, resumed, deleted and recreated.

KWOK follows a kubelet's deletion semantics (deleted pods turn Failed/143 before they go), so
the operator sees what a real cluster shows it. After every step the invariants that must
hold at any moment are checked; at the end, with everything restored, the ones about the
outcome:

- never two live pods in one slot of a job;
- no orphans: every live pod is controlled by a job that exists;
- every failure in a job's status matches a fault we injected (nothing the operator did
  itself is counted), and only injected training failures spend maxRestarts;
- every job ends in the phase its faults imply (Succeeded, or Failed/PermanentFailure for the
  one given a permanent exit code);
- the operator never failed to write a status.

The schedule is drawn from a seed (``TORCHKUBE_SOAK_SEED``, else random) printed on failure.
"""

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kube_jobs import Job, job_manifest
from kubernetes import client

from testbed import faults
from testbed.cluster import Cluster
from testbed.kwok import NodePool
from testbed.operator import OperatorProcess
from testbed.volumes import delete_volume, prebound_volume
from testbed.wait import wait_for
from torchkube.api import GROUP, PLURAL, VERSION
from torchkube.api import labels as lbl

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 14
SILENCE_SECONDS = 28.0
"""Long enough for the node-lifecycle controller (20 s grace) and the jobs' node-lost grace."""
JOBS = {"alpha": (2, 3), "beta": (1, 2), "gamma": (2, 2)}
ZONE = "soak"
CLAIM = "soak-checkpoints"
"""One claim of the test's for every job: a recreated job must not wait for its namesake's."""


@dataclass
class Soak:
    rng: random.Random
    seed: int
    cluster: Cluster
    api: Any
    namespace: str
    operator: OperatorProcess
    pools: list[NodePool]
    jobs: dict[str, Job] = field(default_factory=dict)
    counted: set[str] = field(default_factory=set)
    """Pods we failed with a retryable training error (may spend the budget)."""
    infra: set[str] = field(default_factory=set)
    """Pods we deleted."""
    bad_nodes: set[str] = field(default_factory=set)
    """Nodes we deleted or silenced: what ran there was lost to infrastructure."""
    permanent: str | None = None
    silenced: dict[str, float] = field(default_factory=dict)
    deleted_nodes: set[str] = field(default_factory=set)
    log: list[str] = field(default_factory=list)

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    def fail(self, message: str) -> None:
        history = "\n  ".join(self.log)
        pytest.fail(f"{message}\nseed {self.seed} (TORCHKUBE_SOAK_SEED); steps:\n  {history}")

    # ------------------------------------------------------------------ jobs
    def create(self, name: str) -> None:
        low, high = JOBS[name]
        body = job_manifest(
            name,
            self.pools,
            replicas={"min": low, "max": high},
            failurePolicy={"maxRestarts": 100, "nodeLostGraceSeconds": 2},
            checkpoint={"claimName": CLAIM},
        )
        self.jobs[name] = Job.create(self.api, self.namespace, body)

    def uid(self, name: str) -> str | None:
        body = self.jobs[name].get_or_none()
        return None if body is None else str(body["metadata"]["uid"])

    # ------------------------------------------------------------------ observations
    def all_pods(self) -> list[Any]:
        selector = lbl.JOB_NAME
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def running_workers(self) -> list[Any]:
        silenced_nodes = {n for pool in self.silenced_pools() for n in pool.node_names()}
        return [
            p
            for p in self.all_pods()
            if p.metadata.labels.get(lbl.ROLE) == lbl.ROLE_WORKER
            and p.status.phase == "Running"
            and p.metadata.deletion_timestamp is None
            and p.spec.node_name not in silenced_nodes
        ]

    def silenced_pools(self) -> list[NodePool]:
        return [p for p in self.pools if p.failure_domain in self.silenced]

    def check_any_time(self) -> None:
        live_uids = {name: self.uid(name) for name in self.jobs}
        slots: dict[tuple[str, str, str], list[str]] = {}
        for pod in self.all_pods():
            meta = pod.metadata
            if meta.deletion_timestamp is not None or pod.status.phase not in (
                "Pending",
                "Running",
            ):
                continue
            owner = next((r.uid for r in meta.owner_references or [] if r.controller), None)
            job = meta.labels[lbl.JOB_NAME]
            if owner is None or owner != live_uids.get(job):
                self.fail(
                    f"orphan pod {meta.name} (owner {owner}, job {job} is {live_uids.get(job)})"
                )
            if meta.labels.get(lbl.ROLE) == lbl.ROLE_WORKER:
                key = (job, owner, meta.labels[lbl.REPLICA_INDEX])
                slots.setdefault(key, []).append(meta.name)
        for (job, _, slot), names in slots.items():
            if len(names) > 1:
                self.fail(f"two live pods in slot {slot} of {job}: {names}")

    # ------------------------------------------------------------------ faults
    def kill_worker(self) -> None:
        candidates = [
            p for p in self.running_workers() if p.metadata.labels[lbl.JOB_NAME] != self.permanent
        ]
        if not candidates:
            return
        pod = self.rng.choice(candidates)
        self.counted.add(pod.metadata.name)
        self.log.append(f"fail {pod.metadata.name} with exit code 1")
        faults.fail_pod(self.api, pod.metadata.name, self.namespace, exit_code=1)

    def delete_worker(self) -> None:
        candidates = self.running_workers()
        if candidates:
            pod = self.rng.choice(candidates)
            self.infra.add(pod.metadata.name)
            self.log.append(f"kubectl delete pod {pod.metadata.name}")
            faults.delete_pod(self.api, pod.metadata.name, self.namespace)

    def silence_domain(self) -> None:
        quiet = [p for p in self.pools if p.failure_domain not in self.silenced]
        if self.silenced or not quiet:
            return
        pool = self.rng.choice(quiet)
        self.log.append(f"silence domain {pool.failure_domain}")
        self.bad_nodes.update(pool.node_names())
        self.cluster.kill_domain(pool.failure_domain)
        self.silenced[pool.failure_domain] = time.monotonic()

    def delete_node(self) -> None:
        pool = self.rng.choice([p for p in self.pools if p.failure_domain not in self.silenced])
        node = self.rng.choice(pool.node_names())
        if node in self.deleted_nodes:
            return
        self.log.append(f"delete node {node}")
        self.bad_nodes.add(node)
        self.core.delete_node(node)
        self.deleted_nodes.add(node)

    def kill_operator(self) -> None:
        self.log.append("SIGKILL the operator, start it again")
        self.operator.kill()
        time.sleep(self.rng.uniform(0, 2))
        self.operator.start()

    def scale(self) -> None:
        name = self.rng.choice([n for n in ("alpha", "beta") if n in self.jobs])
        low, high = JOBS[name]
        desired = self.rng.randint(low, high)
        self.log.append(f"scale {name} to {desired}")
        self.jobs[name].patch({"replicas": {"min": low, "max": high, "desired": desired}})

    def suspend_and_resume(self) -> None:
        name = self.rng.choice(sorted(self.jobs))
        self.log.append(f"suspend {name}, resume it")
        self.jobs[name].patch({"runPolicy": {"suspend": True}})
        time.sleep(self.rng.uniform(0.2, 2))
        self.jobs[name].patch({"runPolicy": {"suspend": False}})

    def recreate(self) -> None:
        name = self.rng.choice([n for n in sorted(self.jobs) if n != self.permanent])
        self.log.append(f"delete and recreate {name}")
        job = self.jobs[name]
        job.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, propagation_policy="Background"
        )
        wait_for(lambda: self.uid(name) is None, 30, what=f"{name} deleted")

        def left() -> list[str]:  # garbage collection has not taken these in hand yet
            return [
                f"{p.metadata.name} ({p.status.phase}, owner "
                f"{[r.uid for r in p.metadata.owner_references or []]})"
                for p in self.all_pods()
                if p.metadata.labels[lbl.JOB_NAME] == name and p.metadata.deletion_timestamp is None
            ]

        wait_for(
            lambda: not left(),
            90,
            what=f"{name}'s pods collected",
            describe_last=lambda: str(left()),
        )
        self.create(name)

    def permanent_failure(self) -> None:
        if self.permanent is not None:
            return
        candidates = [
            p for p in self.running_workers() if p.metadata.labels[lbl.JOB_NAME] == "gamma"
        ]
        if candidates:
            pod = self.rng.choice(candidates)
            self.permanent = "gamma"
            self.log.append(f"fail {pod.metadata.name} with permanent exit code 3")
            faults.fail_pod(self.api, pod.metadata.name, self.namespace, exit_code=3)

    def heal(self, force: bool = False) -> None:
        for domain, since in list(self.silenced.items()):
            if force or time.monotonic() - since > SILENCE_SECONDS:
                self.log.append(f"restore domain {domain}")
                self.cluster.restart_domain(domain)
                del self.silenced[domain]
        if force and self.deleted_nodes:
            for pool in self.pools:
                self.cluster.ensure_pool_nodes(pool.name)
            self.log.append("re-create deleted nodes")
            self.deleted_nodes.clear()


ACTIONS: list[tuple[Callable[[Soak], None], int]] = [
    (Soak.kill_worker, 4),
    (Soak.delete_worker, 3),
    (Soak.silence_domain, 2),
    (Soak.delete_node, 2),
    (Soak.kill_operator, 2),
    (Soak.scale, 3),
    (Soak.suspend_and_resume, 2),
    (Soak.recreate, 2),
    (Soak.permanent_failure, 1),
]


def test_chaos_soak_keeps_every_invariant(
    cluster: Cluster,
    api_client: Any,
    namespace: str,
    operator: OperatorProcess,
    isolated_pool: Callable[..., NodePool],
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("TORCHKUBE_SOAK_SEED") or random.randrange(1 << 30))
    print(f"chaos soak seed {seed}")
    pools = [isolated_pool(nodes=3, domain=f"{ZONE}-{i}") for i in range(4)]
    soak = Soak(random.Random(seed), seed, cluster, api_client, namespace, operator, pools)
    errors_before = operator.tail(100_000).count("reconcile of")
    volume = prebound_volume(api_client, namespace, CLAIM, str(tmp_path))
    claim = {
        "metadata": {"name": CLAIM},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    client.CoreV1Api(api_client).create_namespaced_persistent_volume_claim(namespace, claim)
    try:
        for name in JOBS:
            soak.create(name)
        wait_for(lambda: len(soak.running_workers()) >= 6, 60, what="the jobs running")
        actions, weights = zip(*ACTIONS, strict=True)
        for _ in range(STEPS):
            action = soak.rng.choices(actions, weights)[0]
            action(soak)
            time.sleep(soak.rng.uniform(1, 3))
            soak.heal()
            soak.check_any_time()
        soak.heal(force=True)
        _settle(soak)
        _check_outcome(soak, errors_before)
    finally:
        delete_volume(api_client, volume)


def _settle(soak: Soak) -> None:
    """Everything restored: each job not failed runs its target number of workers again."""

    def settled() -> bool:
        for name, job in soak.jobs.items():
            status = job.status()
            if name == soak.permanent:
                if status.get("phase") != "Failed":
                    return False
                continue
            target = status.get("desiredReplicas") or 0
            if status.get("phase") != "Running" or len(job.running_workers()) != target:
                return False
        return True

    try:
        wait_for(settled, 120, what="the jobs to settle")
    except Exception as error:
        soak.fail(f"{error}: {[(n, j.status().get('phase')) for n, j in soak.jobs.items()]}")
    soak.check_any_time()


def _check_outcome(soak: Soak, errors_before: int) -> None:
    for name, job in soak.jobs.items():
        status = job.status()
        for record in status.get("failures") or []:
            pod, node = record.get("pod"), record.get("node")
            ours = pod in soak.counted or pod in soak.infra or node in soak.bad_nodes
            if not ours and record.get("retryable", True):
                soak.fail(f"{name} counted a failure nobody injected: {record}")
            if record.get("counted") and record.get("retryable") and pod not in soak.counted:
                soak.fail(f"{name} charged an infrastructure fault to maxRestarts: {record}")
        if name == soak.permanent:
            failed = next(c for c in status["conditions"] if c["type"] == "Failed")
            if failed["reason"] != "PermanentFailure":
                soak.fail(f"{name} should have failed permanently: {failed}")
            continue
        for pod in job.running_workers():
            faults.succeed_pod(soak.api, pod.metadata.name, soak.namespace)
    for name, job in soak.jobs.items():
        if name == soak.permanent:
            continue
        try:
            wait_for(lambda j=job: j.status().get("phase") == "Succeeded", 60, what=f"{name} done")
        except Exception as error:
            soak.fail(f"{name} did not succeed: {error} {job.status()}")
    log = soak.operator.tail(100_000)
    if log.count("reconcile of") > errors_before:
        soak.fail("the operator failed a reconcile:\n" + log[-4000:])
