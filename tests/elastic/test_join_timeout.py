"""A join timeout with real torchrun agents on loopback: an agent that waited
``join_timeout`` for ``--nnodes`` min agents in vain leaves with its own exit code and
message (the operator refills its slot, free), and leaves the rendezvous open, so agents
that come later still train to the end."""

import subprocess
from pathlib import Path

import pytest
from agents import kill_agent, launch, rdzv_args, steps

from torchkube.api.contract import JOIN_TIMED_OUT, ExitCode

pytestmark = pytest.mark.slow
STEPS = 20


def test_a_lone_agent_times_out_and_later_agents_still_train(store: int, tmp_path: Path) -> None:
    env = {"STEPS": str(STEPS), "STEP_SECONDS": "0.05"}

    def start(name: str, join_timeout: int) -> subprocess.Popen[bytes]:
        args = rdzv_args(store, nnodes="2:2", join_timeout=join_timeout)
        log = str(tmp_path / f"{name}.termination")
        return launch(args, tmp_path, name, TORCHKUBE_TERMINATION_LOG=log, **env)

    agents = {"lone": start("lone", 5)}
    try:
        code = agents["lone"].wait(timeout=120)
        message = (tmp_path / "lone.termination").read_text()
        assert code == ExitCode.JOIN_TIMEOUT, f"exit {code}: {message}"
        assert message.startswith(JOIN_TIMED_OUT), message
        assert "1 of at least 2" in message, message

        agents |= {name: start(name, 90) for name in ("a", "b")}
        for name in ("a", "b"):
            assert agents[name].wait(timeout=180) == 0, (tmp_path / f"{name}.log").read_text()
    finally:
        for name in agents:
            kill_agent(tmp_path, name)
    assert [s for s, _, _ in steps(tmp_path)] == list(range(1, STEPS + 1))
