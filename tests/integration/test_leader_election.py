"""Lease-based leader election against the real apiserver: one leader, and a takeover."""

import asyncio
import threading
import time
from typing import Any

import pytest

from torchkube.operator.leader import LeaderElection

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
    while that call waits, the Lease must stay free: before, the late renew read the released
    Lease and took it again, and the standby waited a whole lease duration (18.5 s in CI)."""
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
    time.sleep(0.3)  # the release waits for the call in flight (before: it went ahead)
    gated.gate.set()
    renew.join(10)
    release.join(10)
    assert not elector.leading.is_set()
    standby = LeaderElection(api_client, namespace, "tk-release", lease_seconds=30)
    standby.identity += "-b"
    assert standby.try_acquire_or_renew(), "the released Lease is free for the standby at once"
    assert not elector.try_acquire_or_renew(), "a released elector never takes the Lease again"
