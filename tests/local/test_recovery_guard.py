"""CI's regression guard for recovery (see bench/guard.py): one ``torchkube run`` of the
recovery benchmark's elastic job, worker 0 SIGKILLed and never back, kill → the survivor's
next training step, against the last recorded ``bench/results/recovery_e2e.json``. Fails
only on a gross regression; prints the figures either way."""

import argparse
from pathlib import Path

import pytest

from bench import guard
from bench.recovery_e2e import run_trial

pytestmark = pytest.mark.slow

FIGURE = "killed, never back (1:2): kill → next step"


def test_kill_to_next_step_has_not_regressed_grossly(tmp_path: Path) -> None:
    recorded = guard.baseline("recovery_e2e", FIGURE)
    args = argparse.Namespace(steps=50, interval=10, kill_step=25)
    trial = run_trial("gone", args, tmp_path / "gone")
    assert trial.split is not None, f"training did not recover: {trial.error}"
    checks = [guard.Check(FIGURE, trial.split.total, recorded)]
    print("\n" + guard.report(checks))
    assert guard.passed(checks), guard.report(checks)
