"""``torchkube run`` with ``failurePolicy.recovery: live`` and a worker that crashes at every
start while the other trains: the runner's accounting is the operator's (accounting.account
and its one ledger fold, torchkube/policy/), so the crash loop spends ``maxRestarts`` and
ends the run naming the worker, while a worker whose every run committed steps is lost free
however often.

The workers are stand-ins (a few lines of Python, no torch): worker 0 "trains" and writes the
finished record after a while; worker 1 exits 1 soon after each start, having written the
``COMMITTED_STEP`` line of its termination message first, or not. The real launcher and
trainer are tests/local/test_live_crash_loop.py."""

import io
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training_jobs import training_job

from torchkube.api import TrainingJob
from torchkube.api.contract import PROGRESS_FILE, Env, ProgressReport, committed_step_line
from torchkube.elastic.restarts import RestartBoard
from torchkube.local.runner import LocalRun, _Worker

AGENT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    index, progress, record, said = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    if index == 0:
        time.sleep(float(sys.argv[5]))
        progress.write_text(record)
        sys.exit(0)
    time.sleep(0.3)
    if said:
        Path(os.environ["TORCHKUBE_TERMINATION_LOG"]).write_text(said + "\\n")
    sys.exit("ValueError: bad shard")
    """
)


class StandInAgents(LocalRun):
    finishes_after = 30.0
    """Seconds worker 0 trains before it writes the finished record."""
    committed: int | None = None
    """The step worker 1 says it committed before each crash (None: none)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.restart_board = RestartBoard(None, "none")  # no launcher restarts in place

    def _start_store(self) -> None:  # the stand-ins meet nowhere
        pass

    def _start_lighthouse(self) -> None:
        pass

    def _start_worker(self, index: int) -> None:
        termination = self.log_dir / f"worker-{index}.termination"
        termination.unlink(missing_ok=True)
        record = ProgressReport(step=10, total_steps=10, finished=True)
        said = "" if self.committed is None else committed_step_line(self.committed)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                AGENT,
                str(index),
                str(self.checkpoint_dir / PROGRESS_FILE),
                record.model_dump_json(by_alias=True),
                said,
                str(self.finishes_after),
            ],
            env={str(Env.TERMINATION_LOG): str(termination)},
        )
        log = self.log_dir / f"worker-{index}.log"
        self.workers[index] = _Worker(index, proc, log, datetime.now(UTC))


def live_job(max_restarts: int) -> TrainingJob:
    return training_job(
        replicas={"min": 2, "max": 2},
        failurePolicy={"recovery": "live", "maxRestarts": max_restarts},
    )


def test_a_live_worker_that_crashes_at_every_start_ends_the_run_past_max_restarts(
    tmp_path: Path,
) -> None:
    run = StandInAgents(live_job(max_restarts=1), tmp_path, out=io.StringIO())
    summary = run.run(on_progress=lambda _line: None)
    records = [(r.reason, r.replica_index, r.counted) for r in run.ledger.history]
    assert not summary.succeeded, (summary.message, records)
    assert summary.wall_seconds < run.finishes_after, "ended while worker 0 trained"
    for said in ("replica group of slot 1", "worker 1 exited with code 1", "maxRestarts (1)"):
        assert said in summary.message, summary.message
    assert records == [("ExitCode", 1, False), ("ExitCode", 1, True), ("ExitCode", 1, True)]
    assert (run.ledger.restarts, run.ledger.counted, run.ledger.group_losses) == (0, 2, 3)
    assert "groups lost      3 (recovery live: not restarts; 2 counted" in summary.render()


def test_a_live_worker_that_commits_steps_between_its_crashes_is_lost_free(
    tmp_path: Path,
) -> None:
    run = StandInAgents(live_job(max_restarts=0), tmp_path, out=io.StringIO())
    run.finishes_after, run.committed = 6.0, 1
    summary = run.run(on_progress=lambda _line: None)
    records = [(r.reason, r.replica_index, r.counted) for r in run.ledger.history]
    assert summary.succeeded, (summary.message, records)
    assert len(records) >= 2 and all(counted is False for *_, counted in records), records
    assert run.ledger.counted == 0 and run.ledger.group_losses == len(records)
