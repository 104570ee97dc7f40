"""A replica group lost mid-step, after its peers computed their gradients: the survivors'
reduction fails, and they finish that step in their next quorum with the gradients they
already have, instead of computing it again.

Three replica groups; from step KILL_FROM a kill is aimed at the ``reducing`` phase (the first
process to reach its cross-group reduction holds there until its worker is SIGKILLed), so the
other two are inside theirs, waiting for it, when it dies.
"""

import json
import re
from pathlib import Path

import pytest
from live_runs import three_groups

from torchkube.api.contract import ChaosPhase
from torchkube.local.runner import Chaos

STEPS, KILL_FROM = 80, 20
pytestmark = pytest.mark.slow


def test_a_group_lost_mid_step_costs_its_peers_no_recomputed_step(tmp_path: Path) -> None:
    found = three_groups(tmp_path, STEPS, Chaos(in_phases=[ChaosPhase.REDUCING]), KILL_FROM)
    run, summary, logs, shown = found.run, found.summary, found.logs, found.shown
    assert summary.succeeded and summary.steps == STEPS, shown
    assert run.phase_kills == [ChaosPhase.REDUCING], shown
    assert summary.replica_group_losses == 1 and summary.restarts == 0, shown

    # both survivors lost the vote on the step the victim held in, then committed it in
    # their next quorum, of the two of them, without computing it again
    victim = next(name for name, text in logs.items() if "holding while reducing" in text)
    survivors = {name: text for name, text in logs.items() if name != victim}
    assert len(survivors) == 2, sorted(logs)
    finished = []
    for name, text in survivors.items():
        lost = re.findall(r"live: step (\d+) not committed .*: its reduction is done again", text)
        done = re.findall(r"live: step (\d+) committed among 2 replica groups without", text)
        assert lost and done and lost[0] == done[0], f"{name}: {lost} {done}\n{shown}"
        finished.append(int(done[0]))
        steps = [int(s) for s in re.findall(r"step (\d+)/\d+ \|", text)]
        assert steps == sorted(set(steps)), f"{name}: a step counted twice: {steps}"
        assert "resumed from" not in text, shown
    assert finished[0] == finished[1], finished

    final = json.loads((tmp_path / "checkpoints" / "progress.json").read_text())
    assert final["finished"] and final["step"] == STEPS, final
    # the record is the writer group's own: slot 0's (the lowest replica id) — a survivor's,
    # or, when slot 0 was the victim, its replacement's, which finished none
    finished_by_writer = final["live"]["stepsFinishedAmongSurvivors"]
    if victim == "worker-0.log":
        assert finished_by_writer == 0, final["live"]
    else:
        assert finished_by_writer >= 1, final["live"]
