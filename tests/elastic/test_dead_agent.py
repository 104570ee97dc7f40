"""An agent that dies without leaving the rendezvous (its node lost: agent and workers
SIGKILLed) is dropped by the survivor as soon as its beats stop, not when torch's keep-alive
expires (torchkube/elastic/liveness.py). Real torchrun agents on loopback; the keep-alive is
made so long here (40 s × 3) that waiting for its expiry cannot pass the test."""

import time
from pathlib import Path

import pytest
from agents import kill_agent, launch, rdzv_args, steps, trained_together, wait_for

pytestmark = pytest.mark.slow

KEEP_ALIVE = 40
"""Seconds between torch's keep-alives: the dead agent would stay a participant for 80–120 s."""
BACK_WITHIN = 60.0
"""Kill → both agents training again: the replacement's start and a round, under load."""


def test_a_killed_agent_is_dropped_at_once_and_its_replacement_trains(
    store: int, tmp_path: Path
) -> None:
    args = rdzv_args(store, nnodes="2:2", keep_alive=KEEP_ALIVE)
    env = {"STEPS": "100000", "STEP_SECONDS": "0.05"}
    agents = {name: launch(args, tmp_path, name, **env) for name in ("a", "b")}
    try:
        wait_for(lambda: trained_together(tmp_path, 10), 120, "two agents training", tmp_path)
        kill_agent(tmp_path, "b")
        killed, last = time.monotonic(), steps(tmp_path)[-1][0]
        agents["c"] = launch(args, tmp_path, "c", **env)  # the operator's replacement pod
        wait_for(
            lambda: any(s > last and w == 2 and a in "ac" for s, w, a in steps(tmp_path)),
            BACK_WITHIN,
            "a and the replacement c training together past the kill",
            tmp_path,
        )
        print(f"training again {time.monotonic() - killed:.1f}s after the kill")
    finally:
        for name in agents:
            kill_agent(tmp_path, name)
    log = (tmp_path / "a.log").read_text()
    assert "stopped beating" in log and "dropped from round" in log, log[-3000:]


LAST_CALL = 40
"""Seconds torch would wait for a second agent before a round of one starts."""


def test_a_round_reformed_without_a_killed_agent_starts_without_the_last_call(
    store: int, tmp_path: Path
) -> None:
    """An elastic job (1 to 2 agents) whose second agent is lost for good carries on alone
    at once: the round re-forming after the loss waits for no last call."""
    args = rdzv_args(store, nnodes="1:2", keep_alive=KEEP_ALIVE, last_call=LAST_CALL)
    env = {"STEPS": "100000", "STEP_SECONDS": "0.05"}
    agents = {name: launch(args, tmp_path, name, **env) for name in ("a", "b")}
    try:
        wait_for(lambda: trained_together(tmp_path, 10), 120, "two agents training", tmp_path)
        kill_agent(tmp_path, "b")
        killed, last = time.monotonic(), steps(tmp_path)[-1][0]
        wait_for(
            lambda: any(s > last and w == 1 for s, w, _ in steps(tmp_path)),
            LAST_CALL / 2,
            "a training alone past the kill",
            tmp_path,
        )
        print(f"training alone {time.monotonic() - killed:.1f}s after the kill")
    finally:
        for name in agents:
            kill_agent(tmp_path, name)
    log = (tmp_path / "a.log").read_text()
    assert "starts at once with 1 agents" in log, log[-3000:]
