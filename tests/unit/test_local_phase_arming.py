"""``torchkube run``'s kills aimed inside phases (``Chaos.in_phases``) arm a phase whose
holder is a training group (serving a state copy, reducing, committing a checkpoint) only
while at least two groups train: killing the only one would start the job over from its
checkpoint, a true outcome but not the loss aimed at. A phase held by a group that does not
train yet (starting, receiving a copy) is armed whatever the world."""

from pathlib import Path

import pytest
from training_jobs import training_job

from torchkube.api.contract import ChaosPhase, LiveProgress, ProgressReport
from torchkube.local.runner import Chaos, LocalRun


def armed_after(tmp_path: Path, phase: ChaosPhase, groups: int | None) -> list[str]:
    """The armings after a report of ``groups`` training (None: a restart-mode job's)."""
    run = LocalRun(
        training_job(replicas={"min": 1, "max": 3}), tmp_path, chaos=Chaos(in_phases=[phase])
    )
    run.arm_dir.mkdir(parents=True)
    live = None if groups is None else LiveProgress(replica_groups=groups, grad_accum_steps=1)
    run._phase_chaos(ProgressReport(step=60, live=live), 0.0, armed=True)
    return sorted(path.name for path in run.arm_dir.iterdir())


@pytest.mark.parametrize(
    "phase",
    [ChaosPhase.SERVING_STATE, ChaosPhase.REDUCING, ChaosPhase.COMMITTING_CHECKPOINT],
)
def test_a_phase_a_training_group_holds_waits_for_a_second_group(
    tmp_path: Path, phase: ChaosPhase
) -> None:
    assert armed_after(tmp_path / "one", phase, groups=1) == []
    assert armed_after(tmp_path / "two", phase, groups=2) == [f"arm-{phase}"]


@pytest.mark.parametrize("phase", [ChaosPhase.STARTING, ChaosPhase.RECEIVING_STATE])
def test_a_phase_held_outside_training_is_armed_with_one_group(
    tmp_path: Path, phase: ChaosPhase
) -> None:
    assert armed_after(tmp_path, phase, groups=1) == [f"arm-{phase}"]


def test_restart_mode_arms_a_commit_of_its_one_group(tmp_path: Path) -> None:
    """Without live recovery the job is one group, and starting over is what a kill costs."""
    phase = ChaosPhase.COMMITTING_CHECKPOINT
    assert armed_after(tmp_path, phase, groups=None) == [f"arm-{phase}"]
