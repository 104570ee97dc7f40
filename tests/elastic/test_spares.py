"""Hot spares with real torchrun agents on loopback: an agent beyond ``--nnodes`` max stands
by in the rendezvous (no worker, no restart of the others), takes a stopped agent's place at
the next round, and is let go with exit 0 and ``STANDBY_RELEASED`` when training ends."""

import signal
import subprocess
import time
from pathlib import Path

import pytest
from agents import kill_agent, launch, rdzv_args, steps, trained_together, wait_for, worker_pids

from torchkube.api.contract import STANDBY_RELEASED, ExitCode

pytestmark = pytest.mark.slow
STEPS = 600
"""30 s of steps at full speed: room for the spare to start, warm up and stand by (10 s and
more under load) before one of the two is stopped, and for the take-over after it."""


def test_a_spare_stands_by_takes_over_and_is_released_at_the_end(
    store: int, tmp_path: Path
) -> None:
    args = rdzv_args(store, nnodes="1:2")
    env = {"STEPS": str(STEPS), "STEP_SECONDS": "0.05"}

    def start(name: str) -> subprocess.Popen[bytes]:
        log = str(tmp_path / f"{name}.termination")
        return launch(args, tmp_path, name, TORCHKUBE_TERMINATION_LOG=log, **env)

    agents = {name: start(name) for name in ("a", "b")}
    try:
        wait_for(lambda: trained_together(tmp_path, 10), 120, "two agents training", tmp_path)
        paired = steps(tmp_path)[-1][0]
        agents["c"] = start("c")
        # Its worker server's warm-up probe is forked from it for a moment once its imports
        # finish: look for workers after that, and after it stood by long enough to have
        # restarted the others if it wrongly joined.
        wait_for(lambda: standing_by_warm(tmp_path / "c.log"), 60, "c standing by, warm", tmp_path)
        time.sleep(4)
        assert worker_pids(tmp_path, "c") == [], "a spare must not train"
        assert {a for _, w, a in steps(tmp_path)[-5:]} <= {"a", "b"}
        assert all(w == 2 for s, w, _ in steps(tmp_path) if s > paired)

        agents["b"].send_signal(signal.SIGTERM)  # b's pod deleted
        stopped_at, last = time.monotonic(), steps(tmp_path)[-1][0]
        assert last < STEPS - 100, f"step {last} of {STEPS} when b stopped: too late to take over"
        assert agents["b"].wait(timeout=60) == ExitCode.SIGTERM
        wait_for(
            lambda: worker_pids(tmp_path, "c") and any(s > last for s, _, _ in steps(tmp_path)),
            60,
            "the spare training in b's place",
            tmp_path,
        )
        print(f"training again with the spare {time.monotonic() - stopped_at:.1f}s after SIGTERM")
        assert all(w == 2 for s, w, _ in steps(tmp_path) if s > last), "the world must stay 2"

        agents["b"] = start("b")  # the operator's new spare behind it
        for name in ("a", "c"):
            assert agents[name].wait(timeout=180) == 0
        assert agents["b"].wait(timeout=60) == 0
    finally:
        for name in agents:
            kill_agent(tmp_path, name)
    assert (tmp_path / "b.termination").read_text().strip() == STANDBY_RELEASED
    numbers = [s for s, _, _ in steps(tmp_path)]
    assert numbers == list(range(1, STEPS + 1)), "a step was lost or repeated"


def standing_by_warm(log: Path) -> bool:
    text = log.read_text() if log.exists() else ""
    return "standing by as a spare" in text and "workers start warm" in text
