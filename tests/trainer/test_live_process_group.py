"""Live recovery's gloo process group, two members in threads over a real TCPStore: a member
lost between the Lighthouse's answer and the group's connect costs the survivors the connect
timeout, not the collective timeout; once connected, a collective still waits for a member
that is slower than the connect timeout (a step's compute differs between groups)."""

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from torchkube.trainer import live

CONNECT = timedelta(seconds=2)


@pytest.fixture
def store_address(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(live, "CONNECT_TIMEOUT", CONNECT)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield f"127.0.0.1:{store.port}/quorum-1"
    del store


def test_a_member_lost_before_it_connects_costs_the_connect_timeout(store_address: str) -> None:
    survivor = live.QuickConnectGloo()
    started = time.monotonic()
    with pytest.raises(dist.DistError, match=r"timeout|timed out"):
        survivor.configure(store_address, "group-0", 0, 2)
    waited = time.monotonic() - started
    assert waited < live.LIVE_TIMEOUT.total_seconds() / 3, waited


def test_a_connected_collective_waits_longer_than_the_connect_timeout(store_address: str) -> None:
    late = CONNECT.total_seconds() * 2
    sums: dict[int, float] = {}

    def member(rank: int) -> None:
        group = live.QuickConnectGloo()
        group.configure(store_address, f"group-{rank}", rank, 2)
        if rank == 1:
            time.sleep(late)
        tensor = torch.ones(4)
        group.allreduce([tensor], dist.AllreduceOptions()).wait()
        sums[rank] = tensor.sum().item()

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sums == {0: 8.0, 1: 8.0}


def test_a_group_stuck_behind_a_failed_neighbour_fails_when_the_neighbours_close(
    store_address: str,
) -> None:
    """Four groups in a ring, group 0 lost (its connections closed) before the all-reduce:
    its neighbours fail at once; group 2, whose neighbours are alive, fails only when they
    close theirs after their error — within seconds, not the 30 s collective timeout."""
    connected, survivors_done = threading.Barrier(4), threading.Barrier(3)
    failed_after: dict[int, float] = {}

    def member(rank: int) -> None:
        group = live.QuickConnectGloo()
        group.configure(store_address, f"group-{rank}", rank, 4)
        connected.wait()
        if rank == 0:
            group.close_after_error(None)
            return
        began = time.monotonic()
        try:
            group.allreduce([torch.ones(1 << 20)], dist.AllreduceOptions()).wait()
        except RuntimeError as error:
            failed_after[rank] = time.monotonic() - began
            group.close_after_error(error)
        survivors_done.wait(timeout=60)  # each keeps its group until all failed, as a trainer
        # keeps its own until the next quorum

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(failed_after) == [1, 2, 3], failed_after
    assert max(failed_after.values()) < live.LIVE_TIMEOUT.total_seconds() / 3, failed_after
