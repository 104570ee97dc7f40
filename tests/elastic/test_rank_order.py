"""Ranks follow the pods' slots, not their addresses: under Kueue's topology-aware scheduling
slot order is topology order (consecutive replica indices share the finest domain), so the
data-parallel neighbours of every rank are its topological neighbours
(torchkube/elastic/ranks.py). Real torchrun agents on loopback, started in an order that is not
their slots' and sharing one address, as pods of one node would not: torch alone would rank
them by process id."""

from pathlib import Path

import pytest
from agents import launch, rdzv_args, wait_for

from torchkube.api.contract import Env

pytestmark = pytest.mark.slow

ARRIVALS = {"first": 2, "second": 0, "third": 1}
"""Agent → slot, in the order the agents start (rising process ids)."""
NPROC = 2


def _ranks(out: Path) -> dict[tuple[str, int], int]:
    ranks = {}
    for path in out.glob("rank-*"):
        _, agent, local = path.name.split("-")
        ranks[(agent, int(local))] = int(path.read_text())
    return ranks


def test_global_ranks_follow_the_slots_whatever_the_arrival(store: int, tmp_path: Path) -> None:
    args = [
        a if not a.startswith("--nproc-per-node") else f"--nproc-per-node={NPROC}"
        for a in rdzv_args(store, nnodes="3")
    ]
    agents = [
        launch(args, tmp_path, agent, STEPS="2", **{Env.REPLICA_INDEX: str(slot)})
        for agent, slot in ARRIVALS.items()
    ]
    try:
        wait_for(
            lambda: len(_ranks(tmp_path)) == NPROC * len(ARRIVALS), 120, "every rank", tmp_path
        )
        for agent in agents:
            assert agent.wait(timeout=60) == 0
    finally:
        for agent in agents:
            agent.kill()
    by_slot = sorted(ARRIVALS, key=ARRIVALS.__getitem__)
    expected = {
        (agent, local): position * NPROC + local
        for position, agent in enumerate(by_slot)
        for local in range(NPROC)
    }
    assert _ranks(tmp_path) == expected
