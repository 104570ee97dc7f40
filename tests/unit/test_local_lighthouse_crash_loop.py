"""``torchkube run`` with ``failurePolicy.recovery: live`` and a Lighthouse that cannot serve:
it exits at every start (here as when its port was taken: "Address already in use"). The
runner starts a lost Lighthouse again, as the operator replaces its pod, and the groups wait
for it at their next quorum; but a Lighthouse that exits again and again with no step trained
between is this machine's problem, the same at every start. The run ends, naming it and its
log's last line, instead of waiting out every group's quorum timeout restart after restart.

The Lighthouse and the workers are stand-ins (a few lines of Python, no torchft); the real
Lighthouse's loss and return is tests/local/test_live_recovery.py."""

import io
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

from training_jobs import training_job

from torchkube.api import TrainingJob
from torchkube.api.contract import ProgressReport
from torchkube.local.runner import LIGHTHOUSE_FAILED_STARTS, LocalRun, _Worker

REFUSED = "RuntimeError: Address already in use (os error 98)"


class StandIns(LocalRun):
    def _start_store(self) -> None:
        self.store = sleeper()

    def _start_lighthouse(self) -> None:
        log = self.lighthouse_log
        said = f"import sys; open({str(log)!r}, 'a').write('Traceback\\n{REFUSED}\\n'); sys.exit(1)"
        self.lighthouse = subprocess.Popen([sys.executable, "-c", said])

    def _start_worker(self, index: int) -> None:
        log = self.log_dir / f"worker-{index}.log"
        self.workers[index] = _Worker(index, sleeper(), log, datetime.now(UTC))


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )


def live_job() -> TrainingJob:
    return training_job(replicas={"min": 2, "max": 2}, failurePolicy={"recovery": "live"})


def test_a_lighthouse_that_exits_at_every_start_ends_the_run_naming_its_log(
    tmp_path: Path,
) -> None:
    run = StandIns(live_job(), tmp_path, out=io.StringIO())
    deadline = threading.Timer(30.0, run.stop)
    deadline.start()
    try:
        summary = run.run(on_progress=lambda _line: None)
    finally:
        deadline.cancel()
    assert not run.stopped_by_caller, "waited for a Lighthouse that never served"
    assert not summary.succeeded
    said = summary.message
    parts = (f"{LIGHTHOUSE_FAILED_STARTS} starts in a row", "code 1", REFUSED, "lighthouse.log")
    for part in parts:
        assert part in said, said
    assert f"port {run.lighthouse_port}" in said, said


def test_a_lighthouse_lost_with_steps_trained_between_is_started_again_each_time(
    tmp_path: Path,
) -> None:
    run = StandIns(live_job(), tmp_path, out=io.StringIO())
    run.log_dir.mkdir(parents=True)
    run._start_lighthouse()
    for step in range(1, 3 * LIGHTHOUSE_FAILED_STARTS):
        assert run.lighthouse is not None
        run.lighthouse.wait()
        record = ProgressReport(step=step, total_steps=100)
        assert run._check_lighthouse(record, float(step)) is None
    assert run.lighthouse is not None
    run.lighthouse.wait()


def test_a_lighthouse_chaos_killed_again_and_again_at_one_step_is_started_again_each_time(
    tmp_path: Path,
) -> None:
    """A chaos kill is the operator replacing a lost pod, not a Lighthouse that cannot start."""
    run = StandIns(live_job(), tmp_path, out=io.StringIO())
    run.log_dir.mkdir(parents=True)
    record = ProgressReport(step=100, total_steps=600)
    for kill in range(2 * LIGHTHOUSE_FAILED_STARTS):
        run.lighthouse = sleeper()
        run._kill_lighthouse(record, float(kill))
        assert run._check_lighthouse(record, float(kill)) is None, kill
        assert run.lighthouse is not None
        run.lighthouse.wait()
