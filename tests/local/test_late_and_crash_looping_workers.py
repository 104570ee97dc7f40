"""The two faults the KWOK chaos soak cannot play, with real launcher processes: a worker that
starts after ``joinTimeoutSeconds`` and a trainer that crash-loops. ``torchkube run`` decides
with the operator's policy (accounting.account, accounting.in_place_due), so the outcome
invariants are the soak's: every incident is what was injected and nothing else, the budget
ends a job exactly when its counted incidents exceed it, and the steps are exact.
"""

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from torchkube.api import TrainingJob
from torchkube.local.runner import Chaos, LocalRun

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

STEPS = 40
JOIN_TIMEOUT = 10
LATE_SECONDS = 30.0
"""Beyond the first agent's start-up and its join timeout even on a busy machine."""


def quickstart(**spec: Any) -> TrainingJob:
    manifest = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    manifest["spec"]["trainer"]["steps"] = STEPS
    manifest["spec"].update(spec)
    return TrainingJob.model_validate(manifest)


def test_a_worker_that_starts_after_the_join_timeout_joins_and_training_ends_exactly(
    tmp_path: Path,
) -> None:
    job = quickstart(rendezvous={"joinTimeoutSeconds": JOIN_TIMEOUT})
    run = LocalRun(job, tmp_path, chaos=Chaos(late_seconds=LATE_SECONDS), out=io.StringIO())
    summary = run.run(on_progress=lambda _line: None)
    records = [(r.reason, r.pod, r.counted) for r in run.ledger.history]
    assert summary.succeeded, (summary.message, records)
    assert summary.steps == STEPS, "every step trained once the late worker came"
    assert records, "the first worker waited for the late one past its join timeout"
    assert {reason for reason, _, _ in records} == {"JoinTimeout"}, "and nothing else happened"
    assert all(pod == "worker 0" and counted is False for _, pod, counted in records), records
    assert (run.ledger.restarts, run.ledger.counted) == (len(records), 0), "each one free"


def test_a_crash_looping_trainer_ends_the_run_past_max_restarts_in_place(tmp_path: Path) -> None:
    """The trainer fails 8 s after each start; its launcher restarts it in place, six times
    before it gives up (torchrun's budget for maxRestarts 0 and two pods). The first in-place
    restart, recorded 30 s after it happened, is a counted incident and ends the run: the
    loop is seen while the launcher still hides it, not once its budget is spent."""
    crash = tmp_path / "crash.py"
    crash.write_text("import sys, time\n\ntime.sleep(8)\nsys.exit('ValueError: bad batch')\n")
    job = quickstart(command=[str(crash)], failurePolicy={"maxRestarts": 0})
    run = LocalRun(job, tmp_path / "run", chaos=Chaos(), out=io.StringIO())
    summary = run.run(on_progress=lambda _line: None)
    records = [(r.reason, r.pod, r.counted, r.incident) for r in run.ledger.history]
    assert not summary.succeeded
    assert "exceed failurePolicy.maxRestarts (0)" in summary.message, (summary.message, records)
    assert run.ledger.counted == 1, records
    assert [reason for reason, _, counted, _ in records if counted] == ["InPlaceRestart"], records
    assert {reason for reason, *_ in records} == {"InPlaceRestart"}, "nothing else happened"
    assert summary.steps == 0
