"""A seeded chaos soak: several jobs while workers and stores are killed and deleted, a store
made unschedulable, nodes deleted and silenced, the leader of two operator replicas SIGKILLed
(the other takes over the Lease), jobs scaled, suspended, resumed, deleted and recreated. Every
fault class runs at least once in each soak, the others drawn by weight, in a random order.

KWOK runs no trainer, so the soak plays it: a job trains one step per check while
``replicas.min`` of its workers run and its store serves (Running and Ready), and reports the
step through the stand-in ``/progress`` endpoints the operator polls. KWOK follows a kubelet's
deletion semantics (deleted pods turn Failed/143 before they go), so the operator sees what a
real cluster shows it.

Checked at every step (any moment):

- no two live pods in one slot of a job, Terminating ones included (but for a worker being
  deleted by someone else, replaced at once by design), and no orphans;
- liveness: each job advanced its step since the last check, or has ended, or carries a
  condition that names why it waits — never none of these for ``LIVENESS_GRACE_SECONDS``;
- a job never reports more steps than it trained: a recreated job starts from zero.

Checked at the end (the outcome):

- every injected incident is in the job's status once with the reason it was injected as, and
  nothing else is; ``restarts`` counts the recorded incidents and ``restartsCountTowardsMax``
  exactly the injected training failures (each its own incident: they are spaced beyond the
  incident window);
- the job with a finite ``maxRestarts`` fails exactly when those exceed it; the one given a
  permanent exit code fails at once; every other job succeeds;
- each job's step is exactly the one it trained;
- the operator never failed a reconcile.

The schedule is drawn from a seed (``TORCHKUBE_SOAK_SEED`` replays one; else random, printed
at the start and on failure). One soak a run (a new seed each CI run, 1-2 minutes);
``TORCHKUBE_SOAK_RUNS=N`` soaks N schedules in a row.
"""

import os
import random
import time
from collections.abc import Callable, Iterator
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
from torchkube.api import GROUP, PLURAL, VERSION, times
from torchkube.api import labels as lbl
from torchkube.api.contract import TRAINING_FINISHED

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 14
SILENCE_SECONDS = 28.0
"""Long enough for the node-lifecycle controller (20 s grace) and the jobs' node-lost grace."""
CORDON_SECONDS = 40.0
"""How long the store-unschedulable fault keeps every node cordoned: past the liveness grace,
so a job that waits for its store without saying so is caught."""
JOBS = {"alpha": (2, 3), "beta": (1, 2), "gamma": (2, 2)}
BUDGETED = "beta"
BUDGET = 1
"""beta's maxRestarts: two injected training failures end it."""
KILL_SPACING_SECONDS = 55.0
"""Training failures of one job this far apart are separate incidents however late the
operator sees them: the incident window (30 s) plus a leader's failover (15 s Lease) and slack."""
LIVENESS_GRACE_SECONDS = 30.0
"""A job may show no progress and no waiting condition this long while a replica leads: the
operator's progress poll and resync. The issue allows max(joinTimeout, 5 min); KWOK's clock is
real time, so the soak holds the operator to less. Time without a leader (a SIGKILLed leader's
Lease expiring) is excused: nobody could say anything."""
WAITING = {
    "WaitingForWorkers": "True",
    "PodsUnschedulable": "True",
    "PodsBlocked": "True",
    "NodesUnreachable": "True",
    "Suspended": "True",
    "Restarting": "True",
    "StoreReady": "False",
}
"""Conditions that name why a job does not advance."""
TERMINAL = ("Succeeded", "Failed")
ZONE = "soak"
LEASE = "soak-operator"
CLAIM = "soak-checkpoints"
"""One claim of the test's for every job: a recreated job must not wait for its namesake's."""
LET_GO = frozenset({"scale-down", "duplicate", "suspended"})
"""Why the operator lets a running pod go (its ``released`` label) while the job goes on."""
NODE_FAULT_REASONS = frozenset({"NodeLost", "Deleted", "RendezvousStoreLost"})


@dataclass
class Track:
    """What the soak did to one job (one UID) and what it trained."""

    uid: str
    low: int
    kills: dict[str, float] = field(default_factory=dict)
    """Workers failed with a retryable training error, and when."""
    deleted: set[str] = field(default_factory=set)
    """Workers deleted (kubectl delete pod, with --force or not)."""
    stores: set[str] = field(default_factory=set)
    """Store pods killed or deleted."""
    permanent: str | None = None
    step: int = 0
    """Steps trained (reported through /progress)."""
    seen_step: int = 0
    last_fine: float = field(default_factory=time.monotonic)
    suspended: bool = False


@dataclass
class Soak:
    rng: random.Random
    seed: int
    cluster: Cluster
    api: Any
    namespace: str
    operators: list[OperatorProcess]
    reports: Any
    """The stand-in ``/progress`` endpoints (tests/integration/conftest.py)."""
    pools: list[NodePool]
    jobs: dict[str, Job] = field(default_factory=dict)
    tracks: dict[str, Track] = field(default_factory=dict)
    bad_nodes: set[str] = field(default_factory=set)
    """Nodes we deleted or silenced: what ran there was lost to infrastructure."""
    released: set[str] = field(default_factory=set)
    """Pods the operator let go while their job went on: never failures."""
    silenced: dict[str, float] = field(default_factory=dict)
    deleted_nodes: set[str] = field(default_factory=set)
    cordoned_at: float | None = None
    training: bool = True
    """Whether the trainers take steps (stopped to read the final counts)."""
    log: list[str] = field(default_factory=list)

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    def fail(self, message: str) -> None:
        history = "\n  ".join(self.log)
        pytest.fail(f"{message}\nseed {self.seed} (TORCHKUBE_SOAK_SEED); steps:\n  {history}")

    def note(self, text: str) -> None:
        self.log.append(f"{time.monotonic() % 10_000:8.1f} {text}")

    # ------------------------------------------------------------------ jobs
    def create(self, name: str) -> None:
        low, high = JOBS[name]
        budget = BUDGET if name == BUDGETED else 100
        body = job_manifest(
            name,
            self.pools,
            replicas={"min": low, "max": high},
            failurePolicy={"maxRestarts": budget, "nodeLostGraceSeconds": 2},
            checkpoint={"claimName": CLAIM},
        )
        self.jobs[name] = Job.create(self.api, self.namespace, body)
        uid = wait_for(lambda: self.uid(name), 10, what=f"{name}'s uid")
        self.tracks[name] = Track(uid=uid, low=low)

    def uid(self, name: str) -> str | None:
        body = self.jobs[name].get_or_none()
        return None if body is None else str(body["metadata"]["uid"])

    def ended(self, name: str) -> bool:
        return self.jobs[name].status().get("phase") in TERMINAL

    # ------------------------------------------------------------------ observations
    def all_pods(self) -> list[Any]:
        selector = lbl.JOB_NAME
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def lost_nodes(self) -> set[str]:
        silenced = {n for pool in self.silenced_pools() for n in pool.node_names()}
        return silenced | self.deleted_nodes

    def serving(self, pods: list[Any], role: str) -> list[Any]:
        """Pods of ``role`` that run on a node that works, not being deleted."""
        lost = self.lost_nodes()
        return [
            p
            for p in pods
            if p.metadata.labels.get(lbl.ROLE) == role
            and p.status.phase == "Running"
            and p.metadata.deletion_timestamp is None
            and p.spec.node_name not in lost
        ]

    def running_workers(self, name: str | None = None) -> list[Any]:
        return [
            p
            for p in self.serving(self.all_pods(), lbl.ROLE_WORKER)
            if name is None or p.metadata.labels[lbl.JOB_NAME] == name
        ]

    def silenced_pools(self) -> list[NodePool]:
        return [p for p in self.pools if p.failure_domain in self.silenced]

    def train(self) -> None:
        """Play every job's trainer: one step while ``replicas.min`` workers run and the store
        serves, reported by each running worker as its rank 0 would."""
        pods = self.all_pods()
        for name, track in self.tracks.items():
            mine = [p for p in pods if p.metadata.labels[lbl.JOB_NAME] == name]
            owned = [p for p in mine if _owner(p) == track.uid]
            workers = self.serving(owned, lbl.ROLE_WORKER)
            stores = [p for p in self.serving(owned, lbl.ROLE_RENDEZVOUS) if _ready(p)]
            if track.suspended or not self.training or self.ended(name):
                continue
            if len(workers) >= track.low and stores:
                track.step += 1
            report = {"step": track.step, "totalSteps": 10_000, "updated": times.now()}
            for pod in workers:
                self.reports.reports[(self.namespace, pod.metadata.name)] = report

    def check_any_time(self) -> None:
        self.train()
        live_uids = {name: self.uid(name) for name in self.jobs}
        slots: dict[tuple[str, str, str], list[str]] = {}
        for pod in self.all_pods():
            meta = pod.metadata
            if (meta.labels or {}).get(lbl.RELEASED) in LET_GO:
                self.released.add(meta.name)
            if pod.status.phase not in ("Pending", "Running"):
                continue
            owner = _owner(pod)
            job = meta.labels[lbl.JOB_NAME]
            if meta.deletion_timestamp is None and (owner is None or owner != live_uids.get(job)):
                self.fail(
                    f"orphan pod {meta.name} (owner {owner}, job {job} is {live_uids.get(job)})"
                )
            if meta.labels.get(lbl.ROLE) == lbl.ROLE_WORKER and not self.let_go(pod):
                key = (job, str(owner), meta.labels[lbl.REPLICA_INDEX])
                slots.setdefault(key, []).append(
                    meta.name + (" (Terminating)" if meta.deletion_timestamp else "")
                )
        for (job, _, slot), names in slots.items():
            if len(names) > 1:
                self.fail(f"two live pods in slot {slot} of {job}: {names}")
        for name in self.jobs:
            self.check_liveness(name)

    def let_go(self, pod: Any) -> bool:
        """A worker being deleted by someone else (the soak) or lost with its node: replaced at
        once by design while it writes its emergency checkpoint in its grace period
        (docs/operator.md). A pod the operator itself let go must be gone before its slot is
        filled again."""
        if pod.metadata.deletion_timestamp is None:
            return False
        deleted = any(pod.metadata.name in t.deleted for t in self.tracks.values())
        return deleted or pod.spec.node_name in self.bad_nodes

    def check_liveness(self, name: str) -> None:
        track, status = self.tracks[name], self.jobs[name].status()
        step = int((status.get("progress") or {}).get("step") or 0)
        if step > track.step:
            self.fail(f"{name} reports step {step}, but trained {track.step} (another job's?)")
        waiting = [
            f"{c['type']}={c['status']}/{c.get('reason')}"
            for c in status.get("conditions") or []
            if WAITING.get(c["type"]) == c["status"]
        ]
        now = time.monotonic()
        if step > track.seen_step or status.get("phase") in TERMINAL or waiting:
            track.last_fine = now
        elif now - track.last_fine > LIVENESS_GRACE_SECONDS:
            conditions = [
                (c["type"], c["status"], c.get("reason")) for c in status.get("conditions") or []
            ]
            self.fail(
                f"{name} neither advanced (step {step}, trained {track.step}), nor ended, nor "
                f"says why it waits for {now - track.last_fine:.0f} s: phase "
                f"{status.get('phase')}, conditions "
                f"{conditions}"
            )
        track.seen_step = max(track.seen_step, step)

    def pause(self, seconds: float) -> None:
        """Wait, training and checking as time goes."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            time.sleep(min(1.0, max(0.0, until - time.monotonic())))
            self.check_any_time()

    # ------------------------------------------------------------------ faults
    def _targets(self) -> list[str]:
        return [n for n in sorted(self.jobs) if not self.tracks[n].permanent and not self.ended(n)]

    def recorded(self, name: str, pod: str) -> None:
        """Wait (training and checking) until the job's status records the fault injected
        into ``pod``: each fault is seen before the next action, whatever it does to the job."""

        def seen() -> bool:
            self.check_any_time()
            failures = self.jobs[name].status().get("failures") or []
            return any(r.get("pod") == pod for r in failures)

        try:
            wait_for(seen, 40, interval=1, what=f"{name} to record the fault of {pod}")
        except Exception as error:
            self.fail(f"{error}: {self.jobs[name].status()}")

    def kill_worker(self) -> None:
        """A retryable training failure: counted, one incident each (spaced)."""
        now = time.monotonic()
        names = [
            n
            for n in self._targets()
            if all(now - t > KILL_SPACING_SECONDS for t in self.tracks[n].kills.values())
        ]
        candidates = [p for n in names for p in self.running_workers(n)]
        if not candidates:
            return
        pod = self.rng.choice(candidates)
        name = pod.metadata.labels[lbl.JOB_NAME]
        self.tracks[name].kills[pod.metadata.name] = now
        self.note(f"fail {pod.metadata.name} with exit code 1")
        faults.fail_pod(self.api, pod.metadata.name, self.namespace, exit_code=1)
        self.recorded(name, pod.metadata.name)

    def delete_worker(self) -> None:
        candidates = [p for n in self._targets() for p in self.running_workers(n)]
        if candidates:
            pod = self.rng.choice(candidates)
            name = pod.metadata.labels[lbl.JOB_NAME]
            force = self.rng.random() < 0.5
            self.tracks[name].deleted.add(pod.metadata.name)
            self.note(f"kubectl delete pod {pod.metadata.name}" + (" --force" * force))
            faults.delete_pod(self.api, pod.metadata.name, self.namespace, force=force)
            self.recorded(name, pod.metadata.name)

    def _store_of(self) -> Any | None:
        stores = [
            p
            for p in self.serving(self.all_pods(), lbl.ROLE_RENDEZVOUS)
            if p.metadata.labels[lbl.JOB_NAME] in self._targets()
        ]
        return self.rng.choice(stores) if stores else None

    def kill_store(self) -> None:
        """The store's process dies (its pod fails): free, the workers re-rendezvous."""
        pod = self._store_of()
        if pod is not None:
            name = pod.metadata.labels[lbl.JOB_NAME]
            self.tracks[name].stores.add(pod.metadata.name)
            self.note(f"fail store {pod.metadata.name} with exit code 1")
            faults.fail_pod(self.api, pod.metadata.name, self.namespace, exit_code=1)
            self.recorded(name, pod.metadata.name)

    def store_unschedulable(self) -> None:
        """Every node cordoned and a store deleted: its replacement cannot be scheduled until
        the nodes are uncordoned (``heal``); the job must say it waits for its store."""
        if self.cordoned_at is not None:
            return
        pod = self._store_of()
        if pod is None:
            return
        self.note(f"cordon every node, kubectl delete store {pod.metadata.name}")
        self._cordon(True)
        self.cordoned_at = time.monotonic()
        name = pod.metadata.labels[lbl.JOB_NAME]
        self.tracks[name].stores.add(pod.metadata.name)
        faults.delete_pod(self.api, pod.metadata.name, self.namespace)
        self.recorded(name, pod.metadata.name)

    def _cordon(self, unschedulable: bool) -> None:
        for pool in self.pools:
            for node in pool.node_names():
                if node not in self.deleted_nodes:
                    faults.cordon_node(self.api, node, unschedulable)

    def silence_domain(self) -> None:
        quiet = [p for p in self.pools if p.failure_domain not in self.silenced]
        if self.silenced or not quiet:
            return
        pool = self.rng.choice(quiet)
        self.note(f"silence domain {pool.failure_domain}")
        self.bad_nodes.update(pool.node_names())
        self.cluster.kill_domain(pool.failure_domain)
        self.silenced[pool.failure_domain] = time.monotonic()

    def delete_node(self) -> None:
        pool = self.rng.choice([p for p in self.pools if p.failure_domain not in self.silenced])
        node = self.rng.choice(pool.node_names())
        if node in self.deleted_nodes:
            return
        self.note(f"delete node {node}")
        self.bad_nodes.add(node)
        self.core.delete_node(node)
        self.deleted_nodes.add(node)

    def kill_operator(self) -> None:
        """SIGKILL the leader (the standby must take over the Lease and carry on where it
        stopped: a standby's death changes nothing a job could show) and start it again."""
        holder = wait_for(self.leader, 40, what="a live replica to lead")
        index = next(
            i
            for i, replica in enumerate(self.operators)
            if replica.proc is not None
            and holder == f"{replica.extra_env['POD_NAME']}_{replica.proc.pid}"
        )
        self.note(f"SIGKILL operator replica {index}, the leader, start it again")
        self.operators[index].kill()
        time.sleep(self.rng.uniform(0, 2))
        self.operators[index].start()
        wait_for(self.leader, 40, what="a live replica to lead")
        for track in self.tracks.values():  # nobody could say anything while none led
            track.last_fine = max(track.last_fine, time.monotonic())

    def leader(self) -> str | None:
        """The Lease's holder if it is one of the replicas running now."""
        lease = client.CoordinationV1Api(self.api).read_namespaced_lease(LEASE, self.namespace)
        holder = lease.spec.holder_identity if lease.spec else None
        live = {
            f"{replica.extra_env['POD_NAME']}_{replica.proc.pid}"
            for replica in self.operators
            if replica.proc is not None and replica.proc.poll() is None
        }
        return holder if holder in live else None

    def scale(self) -> None:
        names = [n for n in ("alpha", "beta") if n in self._targets()]
        if not names:
            return
        name = self.rng.choice(names)
        low, high = JOBS[name]
        desired = self.rng.randint(low, high)
        self.note(f"scale {name} to {desired}")
        self.jobs[name].patch({"replicas": {"min": low, "max": high, "desired": desired}})

    def suspend_and_resume(self) -> None:
        names = self._targets()
        if not names:
            return
        name = self.rng.choice(names)
        self.note(f"suspend {name}, resume it")
        self.tracks[name].suspended = True
        self.jobs[name].patch({"runPolicy": {"suspend": True}})
        time.sleep(self.rng.uniform(0.2, 2))
        self.jobs[name].patch({"runPolicy": {"suspend": False}})
        self.tracks[name].suspended = False

    def recreate(self) -> None:
        name = self.rng.choice(sorted(self.jobs))
        self.note(f"delete and recreate {name}")
        job = self.jobs[name]
        job.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, propagation_policy="Background"
        )
        wait_for(lambda: self.uid(name) is None, 30, what=f"{name} deleted")
        del self.tracks[name]

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
        if any(t.permanent for t in self.tracks.values()) or "gamma" not in self._targets():
            return
        candidates = self.running_workers("gamma")
        if candidates:
            pod = self.rng.choice(candidates)
            self.tracks["gamma"].permanent = pod.metadata.name
            self.note(f"fail {pod.metadata.name} with permanent exit code 3")
            faults.fail_pod(self.api, pod.metadata.name, self.namespace, exit_code=3)
            self.recorded("gamma", pod.metadata.name)

    def heal(self, force: bool = False) -> None:
        for domain, since in list(self.silenced.items()):
            if force or time.monotonic() - since > SILENCE_SECONDS:
                self.note(f"restore domain {domain}")
                self.cluster.restart_domain(domain)
                del self.silenced[domain]
        if force and self.deleted_nodes:
            for pool in self.pools:
                self.cluster.ensure_pool_nodes(pool.name)
            self.note("re-create deleted nodes")
            self.deleted_nodes.clear()
        cordoned = self.cordoned_at
        if cordoned is not None and (force or time.monotonic() - cordoned > CORDON_SECONDS):
            self.note("uncordon every node")
            self._cordon(False)
            self.cordoned_at = None


def _owner(pod: Any) -> str | None:
    return next((r.uid for r in pod.metadata.owner_references or [] if r.controller), None)


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


ACTIONS: list[tuple[Callable[[Soak], None], int]] = [
    (Soak.kill_worker, 4),
    (Soak.delete_worker, 3),
    (Soak.kill_store, 2),
    (Soak.store_unschedulable, 1),
    (Soak.silence_domain, 2),
    (Soak.delete_node, 2),
    (Soak.kill_operator, 2),
    (Soak.scale, 3),
    (Soak.suspend_and_resume, 2),
    (Soak.recreate, 2),
    (Soak.permanent_failure, 1),
]


def schedule(rng: random.Random, steps: int) -> list[Callable[[Soak], None]]:
    """Every fault class once, the rest drawn by weight, in a random order: a soak that never
    drew, say, a node deletion would pass without having tried it."""
    actions, weights = zip(*ACTIONS, strict=True)
    drawn = [*actions, *rng.choices(actions, weights, k=max(0, steps - len(actions)))]
    rng.shuffle(drawn)
    return drawn


@pytest.fixture
def two_replicas(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    progress_reports: Any,
) -> Iterator[list[OperatorProcess]]:
    """Two operator replicas with leader election for the soak's namespace; the session's
    operator stands aside meanwhile (it would act on the namespace too)."""
    operator.stop()
    election = {
        "TORCHKUBE_LEADER_ELECTION": "true",
        "TORCHKUBE_LEADER_ELECTION_NAMESPACE": namespace,
        "TORCHKUBE_LEADER_ELECTION_NAME": LEASE,
        "TORCHKUBE_NAMESPACES": namespace,
        "TORCHKUBE_PROGRESS_URL": progress_reports.url,
        "TORCHKUBE_PROGRESS_INTERVAL_SECONDS": "1",
    }
    replicas = [
        OperatorProcess(
            cluster.kubeconfig,
            cluster.log_dir / f"{namespace}-op-{index}.log",
            {**election, "POD_NAME": f"op-{index}"},
        )
        for index in range(2)
    ]
    try:
        for replica in replicas:
            replica.start()
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()
        operator.start()


@pytest.mark.parametrize("run", range(int(os.environ.get("TORCHKUBE_SOAK_RUNS") or 1)))
def test_chaos_soak_keeps_every_invariant(
    run: int,
    cluster: Cluster,
    api_client: Any,
    namespace: str,
    two_replicas: list[OperatorProcess],
    progress_reports: Any,
    isolated_pool: Callable[..., NodePool],
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("TORCHKUBE_SOAK_SEED") or random.randrange(1 << 30))
    print(f"chaos soak seed {seed} (run {run})")
    pools = [isolated_pool(nodes=3, domain=f"{ZONE}-{i}") for i in range(4)]
    soak = Soak(
        random.Random(seed),
        seed,
        cluster,
        api_client,
        namespace,
        two_replicas,
        progress_reports,
        pools,
    )
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
        for action in schedule(soak.rng, STEPS):
            action(soak)
            soak.pause(soak.rng.uniform(1, 3))
            soak.heal()
        soak.heal(force=True)
        _settle(soak)
        _check_outcome(soak)
    finally:
        delete_volume(api_client, volume)


def _settle(soak: Soak) -> None:
    """Everything restored: each job not ended runs its target number of workers again and
    its status shows every step it trained."""

    def settled() -> bool:
        soak.check_any_time()
        for name, job in soak.jobs.items():
            status = job.status()
            if status.get("phase") in TERMINAL:
                continue
            target = status.get("desiredReplicas") or 0
            if status.get("phase") != "Running" or len(soak.running_workers(name)) != target:
                return False
        return True

    def counted_every_step() -> bool:
        soak.check_any_time()
        return all(
            (job.status().get("progress") or {}).get("step", 0) == soak.tracks[name].step
            for name, job in soak.jobs.items()
            if job.status().get("phase") not in TERMINAL
        )

    try:
        wait_for(settled, 120, what="the jobs to settle", interval=1)
        soak.training = False
        wait_for(counted_every_step, 20, what="the last steps reported", interval=1)
    except Exception as error:
        soak.fail(f"{error}: {[(n, j.status()) for n, j in soak.jobs.items()]}")


def _expected_reasons(soak: Soak, track: Track, record: dict[str, Any]) -> set[str]:
    """The reasons a failure record may have for what the soak did to its pod or node."""
    pod, node = record.get("pod"), record.get("node")
    reasons: set[str] = set()
    if pod in track.kills or pod == track.permanent:
        reasons.add("ExitCode")
    if pod in track.deleted:
        reasons.add("Deleted")
    if pod in track.stores:
        reasons.add("RendezvousStoreLost")
    if node in soak.bad_nodes:
        reasons |= NODE_FAULT_REASONS
    return reasons


def _check_accounting(soak: Soak, name: str, track: Track, status: dict[str, Any]) -> None:
    records = status.get("failures") or []
    assert len(records) < 20, f"{name}: more failures than status keeps; shorten the soak"
    seen: set[tuple[str, int]] = set()
    for record in records:
        allowed = _expected_reasons(soak, track, record)
        if record.get("reason") not in allowed:
            soak.fail(f"{name} recorded what nobody injected (allowed {allowed}): {record}")
        key = (record.get("pod"), record.get("restartCount") or 0)
        if key in seen:
            soak.fail(f"{name} recorded one failure twice: {record}")
        seen.add(key)
        if record.get("pod") in soak.released:
            soak.fail(f"{name} recorded a pod it let go itself as a failure: {record}")
        if record.get("counted") and record.get("pod") not in track.kills:
            soak.fail(f"{name} charged what was not a training failure: {record}")
    recorded = {r.get("pod") for r in records}
    injected = set(track.kills) | track.deleted | track.stores | {track.permanent} - {None}
    missing = sorted(str(pod) for pod in injected - recorded)
    if missing:
        soak.fail(f"{name} did not record the faults injected into {missing}: {records}")
    incidents = {r.get("incident") for r in records if r.get("retryable", True)}
    counted = {r.get("incident") for r in records if r.get("counted")}
    expected_counted = len(track.kills)
    got = (status.get("restarts", 0), status.get("restartsCountTowardsMax", 0))
    if got != (len(incidents), len(counted)) or len(counted) != expected_counted:
        soak.fail(
            f"{name}: restarts {got[0]}, counted {got[1]}; its records hold {len(incidents)} "
            f"incidents, {len(counted)} counted; injected {expected_counted} training "
            f"failures: {records}"
        )


def _check_outcome(soak: Soak) -> None:
    for name, job in soak.jobs.items():
        track, status = soak.tracks[name], job.status()
        _check_accounting(soak, name, track, status)
        failed = next((c for c in status.get("conditions") or [] if c["type"] == "Failed"), None)
        budget = BUDGET if name == BUDGETED else 100
        if track.permanent is not None:
            expected = "PermanentFailure"
        elif len(track.kills) > budget:
            expected = "MaxRestartsExceeded"
        else:
            expected = None
        reason = failed["reason"] if failed and failed["status"] == "True" else None
        if reason != expected:
            soak.fail(f"{name} failed for {reason}, expected {expected}: {status}")
        step = (status.get("progress") or {}).get("step") or 0
        if expected is not None:
            if step > track.step:
                soak.fail(f"{name} ended at step {step}, trained {track.step}")
            continue
        if step != track.step:
            soak.fail(f"{name} shows step {step}, trained exactly {track.step}")
        finished = f"{TRAINING_FINISHED} at step {track.step}"
        for pod in soak.running_workers(name):
            faults.succeed_pod(soak.api, pod.metadata.name, soak.namespace, message=finished)
    for name, job in soak.jobs.items():
        if soak.tracks[name].permanent is not None or job.status().get("phase") == "Failed":
            continue
        try:
            wait_for(lambda j=job: j.status().get("phase") == "Succeeded", 60, what=f"{name} done")
        except Exception as error:
            soak.fail(f"{name} did not succeed: {error} {job.status()}")
        step = (job.status().get("progress") or {}).get("step")
        if step != soak.tracks[name].step:
            soak.fail(f"{name} succeeded at step {step}, trained {soak.tracks[name].step}")
    errors = [
        line
        for replica in soak.operators
        for line in replica.tail(100_000).splitlines()
        if "reconcile of" in line
    ]
    if errors:
        soak.fail("the operator failed a reconcile:\n" + "\n".join(errors[-20:]))
