"""What a replica does with what it knows of the Lease — the fence in front of its writes,
which metrics it exports as leader and as follower — and what a stopping replica waits for
(no cluster: the Lease and API calls are stubbed; tests/integration/test_leader_election.py
runs them against a real apiserver and real operator processes)."""

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client import ApiClient
from planner import make_job, running_status
from prometheus_client import REGISTRY, generate_latest

from torchkube.operator import handlers, metrics
from torchkube.operator.config import OperatorSettings
from torchkube.operator.controller import Controller
from torchkube.operator.decision import Plan
from torchkube.operator.kube import CreateResult
from torchkube.operator.leader import LeaderElection, LostLeadership, Tenure, fence_refusal
from torchkube.operator.memory import Accounting, JobMemory

ME = "op-a_1"
KEY = ("ns", "demo")


@pytest.mark.parametrize(
    ("holder", "transitions", "renewed_ago", "refused"),
    [
        (ME, 3, 1.0, None),
        ("op-b_7", 4, 1.0, "op-b_7 holds the Lease"),
        ("", 3, 1.0, "nobody holds the Lease"),
        (None, None, 1.0, "nobody holds the Lease"),
        (ME, 5, 1.0, "the Lease changed hands 2 times"),
        (ME, 3, 10.0, "not renewed for 10.0 s"),
    ],
)
def test_the_fence_lets_writes_through_only_for_an_unchanged_current_tenure(
    holder: str | None, transitions: int | None, renewed_ago: float, refused: str | None
) -> None:
    """Holder and transitions as this replica last wrote them, and its own renewal younger
    than the renew deadline on its own clock: anything else means another replica may act."""
    tenure = Tenure(transitions=3, renewed_at=100.0)
    why = fence_refusal(ME, tenure, holder, transitions, now=100.0 + renewed_ago, deadline=10.0)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why


def test_without_a_tenure_nothing_is_written() -> None:
    assert fence_refusal(ME, None, ME, 3, now=1.0, deadline=10.0) == "this replica never led"


def _elector(held: Callable[[], bool]) -> LeaderElection:
    elector = LeaderElection(
        ApiClient(), "ns", "lease", renew_deadline_seconds=0.3, retry_seconds=0.02
    )
    elector.try_acquire_or_renew = held  # type: ignore[method-assign]
    return elector


def _exposed(namespace: str) -> list[str]:
    text = generate_latest(REGISTRY).decode()
    return [
        line
        for line in text.splitlines()
        if not line.startswith("#") and f'namespace="{namespace}"' in line
    ]


def _job(namespace: str) -> Any:
    job = make_job(running_status())
    job.metadata["namespace"] = namespace
    return job


def _attached(controller: Controller, namespace: str) -> None:
    body = {"metadata": {"name": "demo", "namespace": namespace}, "status": {"phase": "Running"}}
    controller.attach({(namespace, "demo"): [body]}, {}, {}, {})


async def _publish_once(controller: Controller) -> None:
    task = asyncio.create_task(handlers._publish_phases(controller))
    await asyncio.sleep(0.05)
    task.cancel()


def test_a_follower_exports_no_fleet_or_job_series() -> None:
    """Two replicas both exporting ``torchkube_jobs`` made the fleet dashboard's sums count
    every job twice."""

    async def scenario() -> list[str]:
        follower = _elector(lambda: False)
        controller = Controller(OperatorSettings(), kube=None, leader=follower)  # type: ignore[arg-type]
        _attached(controller, "follow-ns")
        await _publish_once(controller)
        return _exposed("follow-ns")

    assert asyncio.run(scenario()) == []


def test_a_leader_that_loses_the_lead_drops_its_fleet_and_job_series() -> None:
    """The former leader's per-job gauges stayed at their last values beside the new
    leader's (a stale goodput, spares counted twice)."""
    renewing = [True]

    def held() -> bool:
        if not renewing[0]:
            raise OSError("the apiserver is unreachable")
        return True

    async def scenario() -> tuple[list[str], list[str]]:
        leader = _elector(held)
        controller = Controller(OperatorSettings(), kube=None, leader=leader)  # type: ignore[arg-type]
        _attached(controller, "lead-ns")
        election = asyncio.create_task(leader.run())
        await asyncio.wait_for(leader.leading.wait(), 1)
        metrics.job_planned(_job("lead-ns"), Plan(), Accounting())
        await _publish_once(controller)
        leading = _exposed("lead-ns")
        renewing[0] = False
        stepped_down = time.monotonic() + 2
        while leader.leading.is_set() and time.monotonic() < stepped_down:
            await asyncio.sleep(0.02)
        assert not leader.leading.is_set()
        await _publish_once(controller)
        election.cancel()
        return leading, _exposed("lead-ns")

    leading, following = asyncio.run(scenario())
    assert any(line.startswith("torchkube_jobs{") for line in leading), leading
    assert any(line.startswith("torchkube_job_spares{") for line in leading), leading
    assert following == []


def test_a_renewal_that_finds_another_holder_steps_down_at_once() -> None:
    """Not at the renew deadline: the Lease says another replica acts now."""
    answers = iter([True, True])

    async def scenario() -> float:
        def held() -> bool:
            renewed = next(answers, False)
            if not renewed:
                leader._observed = ("op-b_7", "2026-11-26 05:00:00+00:00")
            return renewed

        leader = _elector(held)
        leader.renew_deadline = 30.0
        election = asyncio.create_task(leader.run())
        await asyncio.wait_for(leader.leading.wait(), 1)
        started = time.monotonic()
        while leader.leading.is_set() and time.monotonic() - started < 5:
            await asyncio.sleep(0.01)
        election.cancel()
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 1.0


class _SlowCreates:
    """Pod creates that wait for ``go``: a write batch caught in flight by a shutdown."""

    def __init__(self) -> None:
        self.entered, self.go = threading.Event(), threading.Event()
        self.created: list[str] = []

    def create_all(self, bodies: list[dict[str, Any]]) -> list[CreateResult]:
        self.entered.set()
        self.go.wait(5)
        self.created += [body["metadata"]["name"] for body in bodies]
        return [CreateResult(body=body) for body in bodies]


def _creating(name: str) -> Plan:
    return Plan(create_pods=[{"kind": "Pod", "metadata": {"name": name}}])


def test_a_stop_waits_for_the_batch_in_flight_and_lets_no_new_one_start() -> None:
    """The Lease is released only after the batch under way ended (else the standby's first
    plan races it), and no batch starts after the stop."""
    kube = _SlowCreates()
    controller = Controller(OperatorSettings(), kube=kube)  # type: ignore[arg-type]
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "status": {}}

    def batch(name: str) -> None:
        controller.executor.execute(KEY, body, _creating(name), {}, JobMemory())

    async def scenario() -> float:
        in_flight = asyncio.create_task(asyncio.to_thread(batch, "demo-worker-0-aaaaa"))
        await asyncio.to_thread(kube.entered.wait, 5)
        asyncio.get_running_loop().call_later(0.3, kube.go.set)
        started = time.monotonic()
        await controller.stop(timeout=2.0)
        waited = time.monotonic() - started
        await in_flight
        with pytest.raises(LostLeadership):
            batch("demo-worker-1-bbbbb")
        return waited

    waited = asyncio.run(scenario())
    assert 0.25 < waited < 1.0, f"stop returned after {waited:.2f} s"
    assert kube.created == ["demo-worker-0-aaaaa"]


def test_a_stop_gives_up_on_a_batch_stuck_past_its_timeout() -> None:
    kube = _SlowCreates()
    controller = Controller(OperatorSettings(), kube=kube)  # type: ignore[arg-type]
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "status": {}}

    async def scenario() -> float:
        stuck = asyncio.create_task(
            asyncio.to_thread(
                controller.executor.execute, KEY, body, _creating("x"), {}, JobMemory()
            )
        )
        await asyncio.to_thread(kube.entered.wait, 5)
        started = time.monotonic()
        await controller.stop(timeout=0.3)
        waited = time.monotonic() - started
        kube.go.set()
        await stuck
        return waited

    assert asyncio.run(scenario()) < 0.6


def test_a_conflict_on_its_own_lease_is_no_reason_to_step_down() -> None:
    """A renewal refused with 409 (someone annotated the Lease) while the Lease still names
    this replica: renew again, as a failed call is retried, until the deadline."""
    answers = iter([True])

    async def scenario() -> bool:
        def held() -> bool:
            leader._observed = (leader.identity, "2026-11-26 05:00:00+00:00")
            return next(answers, False)

        leader = _elector(held)
        leader.renew_deadline = 30.0
        election = asyncio.create_task(leader.run())
        await asyncio.wait_for(leader.leading.wait(), 1)
        await asyncio.sleep(0.3)
        election.cancel()
        return leader.leading.is_set()

    assert asyncio.run(scenario())
