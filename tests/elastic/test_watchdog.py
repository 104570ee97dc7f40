"""The launcher's hang watchdog with real torchrun agents on loopback (gloo).

A worker that stops stepping — here SIGSTOPped, as a wedged GPU or a dead mount would leave
it — keeps every other rank waiting in its all-reduce. Its launcher finds it after the hang
timeout, prints the Python stacks of all its threads, and exits ``ExitCode.HUNG`` with the
stuck rank in its termination message; the other agent's worker (its gloo all-reduce fails
when the stuck peer is killed) is restarted into the next round at once.
"""

import os
import signal
import time
from pathlib import Path

import pytest
from agents import kill_agent, launch, rdzv_args, steps, trained_together, wait_for, worker_pids

from torchkube.api.contract import HANG_REPORT, ExitCode

pytestmark = pytest.mark.slow
HANG_TIMEOUT_S = 4


def test_a_stopped_worker_is_found_shown_and_its_pod_ends_hung(store: int, tmp_path: Path) -> None:
    args = rdzv_args(store)
    env = {
        "STEPS": "2000",
        "STEP_SECONDS": "0.05",
        "TORCHKUBE_HANG_TIMEOUT_SECONDS": str(HANG_TIMEOUT_S),
    }
    agents = {
        name: launch(
            args,
            tmp_path,
            name,
            TORCHKUBE_TERMINATION_LOG=str(tmp_path / f"{name}.termination"),
            **env,
        )
        for name in ("a", "b")
    }
    try:
        wait_for(lambda: trained_together(tmp_path, 20), 120, "two agents training", tmp_path)
        [victim] = worker_pids(tmp_path, "b")
        os.kill(victim, signal.SIGSTOP)
        stopped_at, last = time.monotonic(), steps(tmp_path)[-1][0]
        assert agents["b"].wait(timeout=HANG_TIMEOUT_S + 60) == ExitCode.HUNG
        detected = time.monotonic() - stopped_at
        wait_for(
            lambda: any(s > last and w == 1 for s, w, _ in steps(tmp_path)),
            60,
            "the other agent training alone",
            tmp_path,
        )
        recovered = time.monotonic() - stopped_at
        print(f"hang detected in {detected:.1f}s, training again in {recovered:.1f}s")
    finally:
        for name in agents:
            kill_agent(tmp_path, name)
    log = (tmp_path / "b.log").read_text()
    message = (tmp_path / "b.termination").read_text()
    assert message.startswith(HANG_REPORT), message
    assert f"pid {victim}, stopped by a signal" in message and "finished no step" in message
    assert "steps_script.py" in message, "the stuck frame belongs in the message"
    assert "Python stacks of every thread" in log and "in main" in log, log[-3000:]
    assert detected < HANG_TIMEOUT_S + 15
