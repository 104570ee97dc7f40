"""What ``torchkube run`` says of its rendezvous store's loss: with ``failurePolicy.recovery:
live`` the replica groups train on through it (nothing resumes from a checkpoint), in the line
printed at the loss and in the summary's failure line, which said "resumed from step N".

The workers and the store are stand-ins (``sleep``): the store's loss is the chaos kill of
``--chaos-store-at-step``, found dead at the next check as the run loop finds it. The real
launcher and trainer are tests/local/test_live_recovery.py."""

import io
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from training_jobs import training_job

from torchkube.api.contract import ProgressReport
from torchkube.local.display import Summary
from torchkube.local.runner import LocalRun, _Worker


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )


class StandIns(LocalRun):
    def _start_store(self) -> None:
        self.store = sleeper()

    def _start_worker(self, index: int) -> None:
        log = self.log_dir / f"worker-{index}.log"
        self.workers[index] = _Worker(
            index, sleeper(), log, datetime.now(UTC) - timedelta(minutes=1)
        )


@pytest.mark.parametrize("recovery", ["live", "restart"])
def test_a_store_killed_mid_run_is_said_trained_on_through_only_under_live(
    tmp_path: Path, recovery: str
) -> None:
    out = io.StringIO()
    job = training_job(replicas={"min": 2, "max": 2}, failurePolicy={"recovery": recovery})
    run = StandIns(job, tmp_path, out=out)
    run.log_dir.mkdir(parents=True)
    run._start_store()
    for index in range(2):
        run._start_worker(index)
    try:
        record = ProgressReport(step=100, total_steps=600, last_checkpoint_step=100)
        run._kill_store(record, 0.0)
        assert run._check_store(record, 0.5) is None
        run._note_recoveries(101, 1.0)
    finally:
        for proc in [run.store, *(w.proc for w in run.workers.values())]:
            assert proc is not None
            proc.kill()
            proc.wait()
    summary = Summary("demo", True, "training completed", failures=run.failures)
    line = next(line for line in summary.render().splitlines() if "rendezvous store" in line)
    if recovery == "live":
        assert "the replica groups train on without it" in out.getvalue(), out.getvalue()
        assert "replica groups trained on without a restart" in line, line
        assert (run.ledger.restarts, run.ledger.group_losses) == (0, 0), run.ledger
    else:
        assert "resumed from step 100" in line, line
        assert run.ledger.restarts == 1, run.ledger
