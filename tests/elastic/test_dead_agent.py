"""An agent that dies without leaving the rendezvous (its node lost: agent and workers
SIGKILLed) costs the survivors a fraction of a second, not torch's keep-alive expiry and last call
(torchkube/elastic/lost_agents.py). Real torchrun agents on loopback; the keep-alive and the
last call are made so long here (40 s) that waiting for either cannot pass the tests."""

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from agents import kill_agent, launch, rdzv_args, steps, trained_together, wait_for

pytestmark = pytest.mark.slow

KEEP_ALIVE = 40
"""Seconds between torch's keep-alives: the dead agent would stay a participant for 80–120 s."""
LAST_CALL = 40
"""Seconds torch would wait for a second agent before a round of one starts."""
REPLACED_WITHIN = 60.0
"""Kill → training with a replacement: its start (torch imported) and a round, under load;
well short of the keep-alive's expiry."""
ALONE_WITHIN = LAST_CALL / 2
"""Kill → the survivor training alone: a round, well short of the last call."""
ENV = {"STEPS": "100000", "STEP_SECONDS": "0.05"}


@contextmanager
def _b_killed(
    args: list[str], out: Path
) -> Iterator[tuple[dict[str, subprocess.Popen[bytes]], int]]:
    """Agents a and b training together, then b SIGKILLed with its workers: the agents (the
    test may add more) and the last step logged before the kill."""
    agents = {name: launch(args, out, name, **ENV) for name in ("a", "b")}
    try:
        wait_for(lambda: trained_together(out, 10), 120, "two agents training", out)
        kill_agent(out, "b")
        killed, last = time.monotonic(), steps(out)[-1][0]
        yield agents, last
        print(f"training again {time.monotonic() - killed:.1f}s after the kill")
    finally:
        for name in agents:
            kill_agent(out, name)


def test_a_killed_agent_is_dropped_at_once_and_its_replacement_trains(
    store: int, tmp_path: Path
) -> None:
    args = rdzv_args(store, nnodes="2:2", keep_alive=KEEP_ALIVE)
    with _b_killed(args, tmp_path) as (agents, last):
        agents["c"] = launch(args, tmp_path, "c", **ENV)  # the operator's replacement pod
        wait_for(
            lambda: any(s > last and w == 2 and a in "ac" for s, w, a in steps(tmp_path)),
            REPLACED_WITHIN,
            "a and the replacement c training together past the kill",
            tmp_path,
        )
    log = (tmp_path / "a.log").read_text()
    assert "stopped beating" in log and "dropped from round" in log, log[-3000:]


def test_a_round_reformed_without_a_killed_agent_starts_without_the_last_call(
    store: int, tmp_path: Path
) -> None:
    """An elastic job (1 to 2 agents) whose second agent is lost for good carries on alone
    at once: the round re-forming after the loss waits for no last call. The killed agent's
    machine (this one) is up, so its port is refused and it is dropped after two missed
    beats, not the whole silence."""
    args = rdzv_args(store, nnodes="1:2", keep_alive=KEEP_ALIVE, last_call=LAST_CALL)
    with _b_killed(args, tmp_path) as (_, last):
        wait_for(
            lambda: any(s > last and w == 1 for s, w, _ in steps(tmp_path)),
            ALONE_WITHIN,
            "a training alone past the kill",
            tmp_path,
        )
    log = (tmp_path / "a.log").read_text()
    assert "starts at once with 1 agents" in log, log[-3000:]
    assert "stopped beating and its port refused a connection" in log, log[-3000:]
