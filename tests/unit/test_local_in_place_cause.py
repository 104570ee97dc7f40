"""What ``torchkube run`` says of a survivor's in-place restart: the quick start's
``--chaos-at-step`` kill takes a worker away, the other's training process fails on the lost
peer and its launcher restarts it in place. The line printed for that restart names the
cause — the peer's loss — not torch's generic hint, which is all the launcher's record of a
worker without an error file holds.

The workers here are stand-ins (``sleep``), and the launcher's record is handed to the
runner as its restart board would read it from the store."""

import io
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from training_jobs import training_job

from torchkube.api.contract import InPlaceRestart, ProgressReport
from torchkube.api.times import format_time
from torchkube.local.runner import LocalRun, _Worker, worker_name

TORCH_HINT = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
"""What torchrun's record of a failed worker says when the worker wrote no error file."""


class StandInWorkers(LocalRun):
    def _start_worker(self, index: int) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
        )
        log = self.log_dir / f"worker-{index}.log"
        self.workers[index] = _Worker(index, proc, log, datetime.now(UTC) - timedelta(minutes=1))


def test_a_survivors_in_place_restart_is_said_to_follow_its_peers_loss(tmp_path: Path) -> None:
    out = io.StringIO()
    run = StandInWorkers(training_job(replicas={"min": 2, "max": 2}), tmp_path, out=out)
    run.log_dir.mkdir(parents=True)
    for index in range(2):
        run._start_worker(index)
    try:
        record = ProgressReport(step=70, total_steps=200, last_checkpoint_step=60)
        run._kill_one(0, 70, record, 0.0)
        survivor = InPlaceRestart(
            pod=worker_name(1),
            node="vm",
            restart=1,
            exit_code=1,
            message=TORCH_HINT,
            time=format_time(datetime.now(UTC)),
        )
        run.restart_board.read = lambda: [survivor]  # type: ignore[method-assign]
        assert run._check_in_place(settle=True) is None
    finally:
        for worker in run.workers.values():
            worker.proc.kill()
            worker.proc.wait()
    printed = out.getvalue()
    line = next(line for line in printed.splitlines() if "restarted its workers in place" in line)
    assert "To enable traceback" not in line, printed
    assert "worker 0" in line and "lost" in line, printed
    assert run.ledger.restarts == 1 and run.ledger.counted == 0, "one free incident: the kill"
