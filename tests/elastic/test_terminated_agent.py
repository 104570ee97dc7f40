"""A pod sent SIGTERM (deleted, preempted, its job suspended) ends its launcher, whatever else
is going on: it never re-joins a rendezvous, not even one a new store serves under the same
address. A suspension deletes the store pod with the workers, so an agent often sees its store
go a moment before its own SIGTERM arrives; before, that agent took the signal for part of the
store loss, waited for the store, joined the round of the next admission and trained in it
from a Terminating pod until its grace period ran out. And a signal that came while torchrun
waited for the workers it had stopped for the lost store ended that wait: the launcher, a
pod's first process, exited while its workers still wrote their emergency checkpoint, and the
pod's end killed them mid-write (a preempted job on real nodes resumed 82 steps back)."""

import signal
import subprocess
import time
from pathlib import Path

import pytest
from agents import Store, kill_agent, launch, rdzv_args, steps, trained_together, wait_for

pytestmark = pytest.mark.slow

TERMINATED = 128 + signal.SIGTERM


def _training_pair(store: Store, out: Path, **env: str) -> dict[str, subprocess.Popen[bytes]]:
    agents = {
        name: launch(rdzv_args(store.port), out, name, STEPS="100000", **env) for name in "ab"
    }
    wait_for(lambda: trained_together(out, 5), 120, "both training", out)
    return agents


def test_sigterm_while_the_workers_stop_for_a_lost_store_ends_the_agent(
    store_process: Store, tmp_path: Path
) -> None:
    agents = _training_pair(store_process, tmp_path, TERM_SECONDS="4")
    try:
        store_process.kill()
        wait_for(
            lambda: (tmp_path / "terminating-a").exists(),
            60,
            "agent a stopping its workers for the lost store",
            tmp_path,
        )
        agents["a"].send_signal(signal.SIGTERM)
        store_process.start()  # the next admission's store, at the same address
        try:
            code = agents["a"].wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        assert code == TERMINATED, (tmp_path / "a.log").read_text()[-3000:]
        assert (tmp_path / "terminated-a").exists(), (
            "the agent exited before its worker finished stopping (its emergency checkpoint)"
        )
        resumed = len(steps(tmp_path))
        wait_for(
            lambda: any(w == 1 for _, w, _ in steps(tmp_path)[resumed:]),
            120,
            "agent b training alone after the store came back",
            tmp_path,
        )
    finally:
        for name in agents:
            kill_agent(tmp_path, name)


def test_sigterm_while_waiting_for_a_lost_store_ends_the_agent(
    store_process: Store, tmp_path: Path
) -> None:
    agents = _training_pair(store_process, tmp_path)
    try:
        store_process.kill()
        log = tmp_path / "a.log"
        wait_for(
            lambda: "re-joining through a new connection" in log.read_text(),
            60,
            "agent a waiting for the store",
            tmp_path,
        )
        time.sleep(1)
        before = len(log.read_text())
        agents["a"].send_signal(signal.SIGTERM)
        code = agents["a"].wait(timeout=30)
        after = log.read_text()[before:]
        assert code == TERMINATED, after
        assert "Traceback" not in after and "stopped by signal 15" in after, after
    finally:
        for name in agents:
            kill_agent(tmp_path, name)
