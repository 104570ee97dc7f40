"""What a replica does with what it knows of the Lease: the fence in front of its writes, and
which metrics it exports as leader and as follower (no cluster: the Lease calls are stubbed;
tests/integration/test_leader_election.py runs them against a real apiserver)."""

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client import ApiClient
from planner import make_job, running_status
from prometheus_client import REGISTRY, generate_latest

from torchkube.operator import handlers
from torchkube.operator.config import OperatorSettings
from torchkube.operator.controller import Controller, _Memory
from torchkube.operator.decision import Plan
from torchkube.operator.leader import LeaderElection, Tenure, fence_refusal

ME = "op-a_1"


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
        controller._observe(_job("lead-ns"), Plan(), _Memory())
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
        leader = _elector(lambda: next(answers, False))
        leader.renew_deadline = 30.0
        election = asyncio.create_task(leader.run())
        await asyncio.wait_for(leader.leading.wait(), 1)
        started = time.monotonic()
        while leader.leading.is_set() and time.monotonic() - started < 5:
            await asyncio.sleep(0.01)
        election.cancel()
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 1.0
