"""Lease-based leader election against the real apiserver: one leader, and a takeover."""

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from kube_jobs import Job
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from training_jobs import manifest

from testbed.cluster import Cluster
from testbed.operator import OperatorProcess
from testbed.wait import wait_for
from torchkube.api.trainingjob import GROUP, VERSION
from torchkube.operator.config import OperatorSettings
from torchkube.operator.controller import Controller
from torchkube.operator.decision import Plan
from torchkube.operator.kube import Kube
from torchkube.operator.leader import LeaderElection, LostLeadership
from torchkube.operator.memory import JobMemory

pytestmark = pytest.mark.cluster


def test_one_leader_and_a_takeover_when_it_stops(api_client: Any, namespace: str) -> None:
    async def scenario() -> None:
        def elector() -> LeaderElection:
            return LeaderElection(
                api_client,
                namespace,
                "tk-leader",
                lease_seconds=3,
                renew_deadline_seconds=2,
                retry_seconds=0.5,
            )

        first, second = elector(), elector()
        second.identity += "-b"
        tasks = [asyncio.create_task(e.run()) for e in (first, second)]
        await asyncio.wait_for(
            asyncio.wait(
                [asyncio.create_task(e.leading.wait()) for e in (first, second)],
                return_when=asyncio.FIRST_COMPLETED,
            ),
            timeout=10,
        )
        await asyncio.sleep(2)  # several renewals: still exactly one leader
        leaders = [e for e in (first, second) if e.leading.is_set()]
        assert len(leaders) == 1
        leader, standby = leaders[0], next(e for e in (first, second) if e is not leaders[0])
        tasks[(first, second).index(leader)].cancel()
        await asyncio.wait_for(standby.leading.wait(), timeout=10)
        for task in tasks:
            task.cancel()
        await asyncio.to_thread(standby.release)
        takeover = elector()
        takeover.identity += "-c"
        assert await asyncio.to_thread(takeover.try_acquire_or_renew), "a released lease is free"

    asyncio.run(scenario())


def test_a_leader_whose_renew_hangs_steps_down_within_the_deadline(
    api_client: Any, namespace: str
) -> None:
    """A renew call that never returns (a half-open connection) must not keep the replica
    acting: it steps down at the renew deadline, before the lease expires for the others."""

    async def scenario() -> float:
        elector = LeaderElection(
            api_client,
            namespace,
            "tk-hang",
            lease_seconds=6,
            renew_deadline_seconds=2,
            retry_seconds=0.3,
        )
        task = asyncio.create_task(elector.run())
        await asyncio.wait_for(elector.leading.wait(), timeout=10)
        hang = threading.Event()
        elector.try_acquire_or_renew = lambda: hang.wait(30)  # type: ignore[method-assign]
        stalled = time.monotonic()
        while elector.leading.is_set():
            await asyncio.sleep(0.05)
        stepped_down = time.monotonic() - stalled
        hang.set()
        task.cancel()
        return stepped_down

    stepped_down = asyncio.run(scenario())
    assert stepped_down <= 2.0 + 0.3 + 0.5, f"still leading {stepped_down:.1f}s after the stall"


class _GatedReads:
    """The real Lease API, whose next read waits at a gate: a renew caught in flight."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.entered, self.gate = threading.Event(), threading.Event()
        self.armed = False

    def read_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            self.armed = False
            self.entered.set()
            self.gate.wait(10)
        return self.api.read_namespaced_lease(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


def test_a_renew_in_flight_at_shutdown_does_not_take_the_released_lease_again(
    api_client: Any, namespace: str
) -> None:
    """Shutdown cancels the renew loop, but not a renew call already in its thread. Released
    while that call waits, the Lease must stay free: a late renew that read the released
    Lease would take it again, and the standby would wait a whole lease duration."""
    elector = LeaderElection(api_client, namespace, "tk-release", lease_seconds=30)
    assert elector.try_acquire_or_renew()
    elector.leading.set()
    gated = _GatedReads(elector.api)
    elector.api = gated  # type: ignore[assignment]
    gated.armed = True
    renew = threading.Thread(target=elector.try_acquire_or_renew)
    renew.start()
    assert gated.entered.wait(10)
    release = threading.Thread(target=elector.release)
    release.start()
    time.sleep(0.3)  # the release must wait for the call in flight, not go ahead
    gated.gate.set()
    renew.join(10)
    release.join(10)
    assert not elector.leading.is_set()
    standby = LeaderElection(api_client, namespace, "tk-release", lease_seconds=30)
    standby.identity += "-b"
    assert standby.try_acquire_or_renew(), "the released Lease is free for the standby at once"
    assert not elector.try_acquire_or_renew(), "a released elector never takes the Lease again"


def _pod(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "never-pulled"}]},
    }


def test_a_leader_whose_lease_was_taken_creates_no_pod(api_client: Any, namespace: str) -> None:
    """Another identity takes the Lease while the old leader still thinks it leads (its
    election loop paused, as in a long GC pause or a frozen VM): the old leader's next pod
    create must be refused by the fence, whatever its local flag says."""
    old = LeaderElection(api_client, namespace, "tk-fence", lease_seconds=15)
    assert old.try_acquire_or_renew()
    old.leading.set()
    controller = Controller(OperatorSettings(), Kube(api_client, concurrency=2), old)
    body = {"metadata": {"name": "fenced", "namespace": namespace}, "status": {}}
    key = (namespace, "fenced")
    controller.executor.execute(
        key, body, Plan(create_pods=[_pod(namespace, "before")]), {}, JobMemory()
    )

    leases = client.CoordinationV1Api(api_client)
    lease = leases.read_namespaced_lease("tk-fence", namespace)
    lease.spec.holder_identity = "another-replica_1"
    lease.spec.lease_transitions += 1
    lease.spec.acquire_time = lease.spec.renew_time = datetime.now(UTC)
    leases.replace_namespaced_lease("tk-fence", namespace, lease)
    assert old.leading.is_set(), "the old leader has not noticed: only the fence stands"

    with pytest.raises(LostLeadership):
        controller.executor.execute(
            key, body, Plan(create_pods=[_pod(namespace, "after")]), {}, JobMemory()
        )
    names = {
        pod.metadata.name
        for pod in client.CoreV1Api(api_client).list_namespaced_pod(namespace).items
    }
    assert names == {"before"}, "the stale leader created a pod after the Lease changed hands"


def _take_lease(api_client: Any, namespace: str, name: str) -> None:
    """Another identity takes the Lease, as a standby does once the old leader's lease ran
    out, while the old leader's own election loop has not noticed."""
    leases = client.CoordinationV1Api(api_client)
    lease = leases.read_namespaced_lease(name, namespace)
    lease.spec.holder_identity = "another-replica_1"
    lease.spec.lease_transitions += 1
    lease.spec.acquire_time = lease.spec.renew_time = datetime.now(UTC)
    leases.replace_namespaced_lease(name, namespace, lease)


STALE_RESTARTS = 41
"""A restart count only the stale leader's plan writes."""


def test_a_leader_whose_lease_was_taken_writes_nothing_that_lands(
    api_client: Any, crd: dict[str, Any], namespace: str
) -> None:
    """Not only pods: the stale leader's status patch, its children (the store's Service)
    and its patches of them are fenced too. Each would land otherwise: the job exists, the
    status patch carries its current resourceVersion. The session's operator, if a test
    before started it, runs this job as any other: what is asserted is that none of the
    stale leader's own writes (values nobody else writes) landed."""
    custom = client.CustomObjectsApi(api_client)
    body = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", manifest("stale", {})
    )
    old = LeaderElection(api_client, namespace, "tk-fence-all", lease_seconds=15)
    assert old.try_acquire_or_renew()
    old.leading.set()
    controller = Controller(OperatorSettings(), Kube(api_client, concurrency=2), old)
    _take_lease(api_client, namespace, "tk-fence-all")
    assert old.leading.is_set(), "the old leader has not noticed: only the fence stands"

    def service(name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": "None", "ports": [{"port": 29400}]},
        }

    core = client.CoreV1Api(api_client)
    core.create_namespaced_service(namespace, service("stale-store"))
    relabel = ("Service", "stale-store", {"metadata": {"labels": {"stale": "yes"}}})
    plans = [
        (Plan(), {"phase": "Running", "restarts": STALE_RESTARTS}),
        (Plan(create_children=[service("stale-extra")]), {}),
        (Plan(patch_children=[relabel]), {}),
    ]
    for plan, status in plans:
        with pytest.raises(LostLeadership):
            controller.executor.execute((namespace, "stale"), body, plan, status, JobMemory())
    after = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", "stale")
    stored = after.get("status") or {}
    assert stored.get("restarts") != STALE_RESTARTS, "the stale leader's status landed"
    services = {s.metadata.name: s for s in core.list_namespaced_service(namespace).items}
    assert "stale-extra" not in services, "a stale child landed"
    assert "stale" not in (services["stale-store"].metadata.labels or {}), "a stale patch landed"


def _lease_holder(api_client: Any, namespace: str, name: str) -> str | None:
    try:
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return (lease.spec.holder_identity if lease.spec else None) or None


def _job_series(process: OperatorProcess, namespace: str) -> list[str]:
    return [
        line
        for line in process.metrics().splitlines()
        if line.startswith("torchkube_") and f'namespace="{namespace}"' in line
    ]


@pytest.mark.slow
def test_sigterm_stops_the_leader_in_seconds_and_the_standby_leads_at_once(
    cluster: Cluster, crd: dict[str, Any], api_client: Any, namespace: str
) -> None:
    """Two real operator processes, one job. SIGTERM to the leader: a leader that runs on
    after "Operator is stopping" costs every rollout the pod's grace period plus the Lease's
    expiry. It must be gone within 5 s, with
    the Lease released, and the standby leading within 5 s after that. Only the leader
    exports the job's series, before the handover and after it."""
    election = {
        "TORCHKUBE_LEADER_ELECTION": "true",
        "TORCHKUBE_LEADER_ELECTION_NAMESPACE": namespace,
        "TORCHKUBE_LEADER_ELECTION_NAME": "tk-stop",
        "TORCHKUBE_NAMESPACES": namespace,
    }
    operators: dict[str, OperatorProcess] = {}
    try:
        for name in ("op-a", "op-b"):
            log_path = cluster.log_dir / f"{namespace}-{name}.log"
            env = {**election, "POD_NAME": name}
            operators[name] = OperatorProcess(cluster.kubeconfig, log_path, env).start()

        def identity(process: OperatorProcess) -> str:
            assert process.proc is not None
            return f"{process.extra_env['POD_NAME']}_{process.proc.pid}"

        holder = wait_for(
            lambda: _lease_holder(api_client, namespace, "tk-stop"), 30, what="a leader"
        )
        leader = next(p for p in operators.values() if identity(p) == holder)
        standby = next(p for p in operators.values() if p is not leader)
        manifest = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingJob",
            "metadata": {"name": "one"},
            "spec": {"resources": {"gpus": 8}, "runPolicy": {"suspend": True}},
        }
        Job.create(api_client, namespace, manifest)
        wait_for(
            lambda: any(s.startswith("torchkube_jobs{") for s in _job_series(leader, namespace)),
            30,
            what="the leader to export the job",
            describe_last=leader.tail,
        )
        standby_before = _job_series(standby, namespace)

        assert leader.proc is not None
        os.killpg(leader.proc.pid, signal.SIGTERM)
        signalled = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.proc.wait(timeout=10)
        stopped = time.monotonic() - signalled
        assert leader.proc.poll() is not None and stopped <= 5, (
            f"still running {stopped:.1f} s after SIGTERM:\n{leader.tail(30)}"
        )
        wait_for(
            lambda: _lease_holder(api_client, namespace, "tk-stop") == identity(standby),
            30,
            what="the standby to take the Lease",
            describe_last=standby.tail,
        )
        handover = time.monotonic() - signalled - stopped
        print(f"exited {stopped:.1f} s after SIGTERM; the standby led {handover:.1f} s later")
        assert handover <= 5, f"the standby took {handover:.1f} s to lead"
        assert standby_before == [], "a standby exported job series"
        wait_for(
            lambda: any(s.startswith("torchkube_jobs{") for s in _job_series(standby, namespace)),
            15,
            what="the new leader to export the job",
        )
    finally:
        for process in operators.values():
            process.stop()
