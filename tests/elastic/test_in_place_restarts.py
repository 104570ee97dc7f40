"""In-place restarts with real torchrun agents on loopback: a worker that crashes is
restarted by its launcher without the pod failing, and the restart is posted to the
rendezvous store, where the trainers' ``/progress`` and so the operator find it."""

import subprocess
from pathlib import Path

import pytest
from agents import kill_agent, launch, rdzv_args, steps
from steps_script import CRASH_EXIT_CODE

from torchkube.api.contract import Env
from torchkube.elastic.restarts import RestartBoard

pytestmark = pytest.mark.slow
STEPS = 30


def test_a_worker_restarted_in_place_is_posted_for_the_operator(store: int, tmp_path: Path) -> None:
    env = {"STEPS": str(STEPS), "STEP_SECONDS": "0.05", "CRASH_AT_STEP": "10"}

    def start(name: str) -> subprocess.Popen[bytes]:
        message = str(tmp_path / f"{name}.termination")
        args = rdzv_args(store, nnodes="2:2")
        return launch(
            args, tmp_path, name, POD_NAME=f"pod-{name}", TORCHKUBE_TERMINATION_LOG=message, **env
        )

    agents = {name: start(name) for name in ("a", "b")}
    try:
        for name in ("a", "b"):
            assert agents[name].wait(timeout=180) == 0, (tmp_path / f"{name}.log").read_text()
        records = RestartBoard(f"127.0.0.1:{store}", "test-job").read()
    finally:
        for name in agents:
            kill_agent(tmp_path, name)
    assert [s for s, _, _ in steps(tmp_path)] == list(range(1, STEPS + 1))
    crashed = [r for r in records if r.exit_code == CRASH_EXIT_CODE]
    assert len(crashed) == 1, records
    assert crashed[0].restart == 1 and crashed[0].pod in ("pod-a", "pod-b"), crashed
    assert crashed[0].time, crashed
    assert crashed[0].committed_step == 1, "the round that crashed had committed steps 1-10"
    assert all(r.pod in ("pod-a", "pod-b") for r in records), records


@pytest.mark.parametrize("warm", ["1", "0"], ids=["warm workers", "fresh interpreters"])
def test_a_workers_end_is_seen_at_once_not_at_the_next_look(
    store: int, tmp_path: Path, warm: str
) -> None:
    """The agent looks at its workers every ``--monitor-interval``, but a worker's end wakes
    it: the failure is on the critical path of every recovery, and waiting for the next look
    cost half an interval on average. Here the interval is long enough to tell them apart,
    even when the restarted worker is a fresh interpreter that imports torch (seconds)
    before it writes its rank."""
    interval = 20.0
    args = rdzv_args(store, nnodes="1:1", monitor_interval=interval)
    env = {"STEPS": "6", "STEP_SECONDS": "0.05", "CRASH_AT_STEP": "3", Env.WARM_WORKERS: warm}
    agent = launch(args, tmp_path, "a", **env)
    try:
        assert agent.wait(timeout=180) == 0, (tmp_path / "a.log").read_text()
    finally:
        kill_agent(tmp_path, "a")
    crashed_at = (tmp_path / "crashed").stat().st_mtime
    restarted_at = (tmp_path / "rank-a-0").stat().st_mtime  # the restarted worker's
    assert restarted_at - crashed_at < interval / 2, (
        f"the crashed worker was restarted {restarted_at - crashed_at:.2f}s after its end"
    )
