"""Live recovery under kills aimed inside its most delicate moments, each landing there
whatever the load (``torchkube run``'s ``Chaos.in_phases``: the process that reaches the armed
phase holds still until its worker — its pod — is SIGKILLed):

* a group **starting** (torch imported, its model built, not yet in a quorum);
* the live group **serving** its state to a joining group (the joiner's copy breaks off);
* a joining group that has **received** a peer's state and not yet taken it;
* the writer group's rank 0 **committing** a checkpoint (written and marked, not yet renamed
  into place).

Three replica groups, all training by the step the first phase is armed (the one at which
worker 2 is killed, so that its replacement's join is the first served); a phase a training
group holds is armed only while two groups train, so a live peer is always left (the
replacements of the groups killed while receiving and starting may still be starting when a
checkpoint is due): the job must finish every step with no group ever falling back to a
checkpoint, every kill counted as a lost group and none as a
restart, and no torn checkpoint taken for a committed one.
"""

import json
import re
from pathlib import Path

import pytest
from live_runs import three_groups

from torchkube.api.contract import ChaosPhase
from torchkube.local.runner import Chaos

STEPS, KILL_AT, INTERVAL = 300, 20, 20
PHASES = [
    ChaosPhase.SERVING_STATE,
    ChaosPhase.RECEIVING_STATE,
    ChaosPhase.STARTING,
    ChaosPhase.COMMITTING_CHECKPOINT,
]
pytestmark = pytest.mark.slow


def test_kills_while_serving_receiving_and_committing_cost_no_restart(tmp_path: Path) -> None:
    chaos = Chaos(at_steps=[KILL_AT], worker=2, in_phases=list(PHASES))
    found = three_groups(tmp_path, STEPS, chaos, KILL_AT, checkpoint_interval=INTERVAL)
    run, summary, logs, shown = found.run, found.summary, found.logs, found.shown
    assert summary.succeeded and summary.steps == STEPS, shown

    # each phase was hit, in order, by a kill that landed inside it
    assert run.phase_kills == PHASES, shown
    for phase in PHASES:
        assert re.search(rf"chaos: SIGKILL worker \d at step \d+ while {phase}\n", found.out)
    assert any(f"chaos: holding while {phase}" in log for log in logs.values()), shown

    # five groups lost (the step kill and the four aimed ones) and no group ever resumed from
    # a checkpoint: a live peer was always there to copy from. A slot lost again before it
    # committed a step (a joiner killed while it receives, a replacement while it starts) is
    # the crash-loop rule's to count; nothing else is a restart
    assert summary.replica_group_losses == 5, shown
    assert summary.restarts == summary.replica_group_losses_counted <= 2, shown
    assert not any("resumed from" in log for log in logs.values()), shown

    # the torn commit was not taken for a checkpoint: every committed folder has its marker,
    # and the newest is the last interval's, committed by a later writer
    folders = sorted((tmp_path / "checkpoints").glob("step-*"))
    assert folders and all((f / "COMPLETE.json").exists() for f in folders), folders
    final = json.loads((tmp_path / "checkpoints" / "progress.json").read_text())
    assert final["finished"] and final["lastCheckpointStep"] == STEPS // INTERVAL * INTERVAL
