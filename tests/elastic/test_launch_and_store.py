"""The launcher and the dedicated rendezvous store, with real torchrun agents on loopback.

These are the properties the operator's rendezvous design rests on (docs/operator.md):
killing any agent — including the one whose worker is rank 0 — leaves the others training,
a returning agent is taken back in, worker exit codes reach the container, and a permanent
error stops the pod at once instead of looping through torchrun's restarts.
"""

import time
from pathlib import Path

import pytest
from agents import (
    Store,
    kill_agent,
    launch,
    rdzv_args,
    steps,
    trained_together,
    wait_for,
    worker_pids,
)

from torchkube.api.contract import ExitCode
from torchkube.elastic import torchrun

pytestmark = pytest.mark.slow


def test_killing_the_rank0_agent_leaves_the_survivor_training(store: int, tmp_path: Path) -> None:
    args = rdzv_args(store)
    agents = {name: launch(args, tmp_path, name, STEPS="400") for name in ("a", "b")}
    try:
        wait_for(lambda: trained_together(tmp_path, 5), 120, "two agents training", tmp_path)
        rank0_agent = steps(tmp_path)[-1][2]
        survivor = "b" if rank0_agent == "a" else "a"
        kill_agent(tmp_path, rank0_agent)
        agents[rank0_agent].wait()
        last = steps(tmp_path)[-1][0]
        killed_at = time.monotonic()
        wait_for(
            lambda: any(s > last and w == 1 for s, w, _ in steps(tmp_path)),
            60,
            "the survivor to train alone",
            tmp_path,
        )
        print(f"re-formed at world size 1 in {time.monotonic() - killed_at:.1f}s")
        assert steps(tmp_path)[-1][2] == survivor

        agents[rank0_agent] = launch(args, tmp_path, rank0_agent, STEPS="400")
        resumed = steps(tmp_path)[-1][0]
        wait_for(
            lambda: any(s > resumed and w == 2 for s, w, _ in steps(tmp_path)),
            120,
            "the returning agent to be taken back in",
            tmp_path,
        )
    finally:
        for name in agents:
            kill_agent(tmp_path, name)
    numbers = [s for s, _, _ in steps(tmp_path)]
    assert numbers == list(range(1, len(numbers) + 1)), "a step was lost or repeated"
    assert not (tmp_path / "crashed").exists(), "a worker exited without being asked to"


def test_worker_exit_code_reaches_the_container(store: int, tmp_path: Path) -> None:
    proc = launch(rdzv_args(store, nnodes="1", max_restarts=1), tmp_path, "a", EXIT_CODE="42")
    assert proc.wait(timeout=120) == 42, "torchrun alone would exit 1 here"


def test_permanent_error_stops_at_once(store: int, tmp_path: Path) -> None:
    started = time.monotonic()
    proc = launch(rdzv_args(store, nnodes="1", max_restarts=50), tmp_path, "a", PERMANENT="1")
    assert proc.wait(timeout=120) == 3
    log = (tmp_path / "a.log").read_text()
    assert "permanent error, not retrying: bad config: steps < 0" in log
    assert log.count("bad config") <= 3, "torchrun kept restarting a permanent failure"
    print(f"permanent error reported in {time.monotonic() - started:.1f}s")


def test_a_restarted_store_costs_one_re_rendezvous_not_the_agents(
    store_process: Store, tmp_path: Path
) -> None:
    """The store pod's container crashed and restarted in place at once: its clients
    reconnect to a store that has forgotten the rendezvous. The launcher takes that for a
    lost store and re-joins every agent as one new round; training goes on, every step once.
    (torch's own agent either exits 1 here, and the pod with it, or carries on unaware, so
    that the next agent to join forms a second training of its own.)"""
    args = rdzv_args(store_process.port)
    agents = {name: launch(args, tmp_path, name, STEPS="80") for name in ("a", "b")}
    try:
        wait_for(lambda: len(steps(tmp_path)) >= 10, 120, "two agents training", tmp_path)
        store_process.kill()
        lost_at = len(steps(tmp_path))
        store_process.start()  # at once, as the kubelet restarts a crashed container
        wait_for(
            lambda: any(s > lost_at + 5 and w == 2 for s, w, _ in steps(tmp_path)),
            120,
            "both agents training together after the store came back",
            tmp_path,
        )
        for proc in agents.values():
            assert proc.wait(timeout=120) == 0
    finally:
        for name in agents:
            kill_agent(tmp_path, name)
    numbers = [s for s, _, _ in steps(tmp_path)]
    assert numbers == list(range(1, 81)), "a step was lost or repeated"
    logs = (tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text()
    assert logs.count("re-joining through a new connection to the store") >= 2, "both agents"


def test_a_store_gone_for_a_whole_join_timeout_exits_75(
    store_process: Store, tmp_path: Path
) -> None:
    args = [a.replace("join_timeout=90", "join_timeout=8") for a in rdzv_args(store_process.port)]
    agent = launch(args, tmp_path, "a", STEPS="1000")
    wait_for(lambda: len(steps(tmp_path)) >= 3, 120, "the agent training", tmp_path)
    store_process.kill()
    assert agent.wait(timeout=60) == ExitCode.RENDEZVOUS_LOST
    assert "giving up" in (tmp_path / "a.log").read_text()


@pytest.mark.parametrize("comes_back", [True, False], ids=["store-replaced", "store-gone"])
def test_a_lone_agent_trains_on_while_its_store_is_away(
    store_process: Store, tmp_path: Path, comes_back: bool
) -> None:
    """recovery live: each pod is a torchrun world of its own (one agent, ``--nnodes=1``) and
    torchft's quorum spans the pods. Such an agent has nobody to wait for, so it needs its store
    only to start its workers: losing the store pod (deleted, evicted, its node lost) must not
    stop them — every replica group would restart at once, from the checkpoint. The same
    worker processes train on through the outage; a new, empty store in its place, or none at
    all until the end, changes nothing."""
    args = rdzv_args(store_process.port, nnodes="1")
    agent = launch(args, tmp_path, "a", STEPS="100", TORCHKUBE_RECOVERY="live")
    wait_for(lambda: len(steps(tmp_path)) >= 5, 120, "the agent training", tmp_path)
    before = worker_pids(tmp_path, "a")
    store_process.kill()
    lost_at = len(steps(tmp_path))
    wait_for(
        lambda: len(steps(tmp_path)) >= lost_at + 20, 60, "training on without a store", tmp_path
    )
    assert worker_pids(tmp_path, "a") == before, "the workers were restarted"
    if comes_back:
        store_process.start()  # the operator's replacement: same name, no rendezvous in it
        wait_for(store_process.listening, 120, "the new store", tmp_path)
    try:
        assert agent.wait(timeout=120) == 0, (tmp_path / "a.log").read_text()[-3000:]
    finally:
        kill_agent(tmp_path, "a")
    numbers = [s for s, _, _ in steps(tmp_path)]
    assert numbers == list(range(1, 101)), "a step was lost or repeated"
    log = (tmp_path / "a.log").read_text()
    assert "re-joining through a new connection to the store" not in log, log[-3000:]
    # nobody reads a lone agent's keep-alives: without a store each one failed, with a trace,
    # every keep_alive_interval for the rest of the run
    assert "failed to send a keep-alive heartbeat" not in log, log[-3000:]


def test_only_a_live_recovery_agent_of_one_node_is_lone(monkeypatch: pytest.MonkeyPatch) -> None:
    """In restart mode a one-node round may have a spare in its rendezvous: a participant
    that trained on without the store while the spare re-joined through a new one would
    train beside it. It re-joins with the others, as before."""
    monkeypatch.setenv("TORCHKUBE_RECOVERY", "live")
    assert torchrun.lone(1) and not torchrun.lone(2)
    monkeypatch.setenv("TORCHKUBE_RECOVERY", "restart")
    assert not torchrun.lone(1)
