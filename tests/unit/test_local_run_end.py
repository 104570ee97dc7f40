"""How ``torchkube run`` ends a run whose training finished: the workers exit by themselves,
as the pods of a finished job do. An agent stopped while it winds down leaves its peer in
torchrun's exit barrier for that barrier's 300 s, so the runner only stops what is left.

The agents here are stand-ins (a few lines of Python): worker 0 writes the finished record,
both take a few seconds to wind down, and a SIGTERM is written down where it lands."""

import io
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
from training_jobs import training_job

from torchkube.api.contract import PROGRESS_FILE, ProgressReport
from torchkube.local import runner
from torchkube.local.runner import LocalRun, _Worker

AGENT = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    index, progress, marks = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    def stopped(signum, frame):
        (marks / f"sigterm-{index}").write_text("")
        sys.exit(143)
    signal.signal(signal.SIGTERM, stopped)
    if index == 0:
        progress.write_text(sys.argv[4])
    time.sleep(float(sys.argv[5]))
    """
)


class StandInAgents(LocalRun):
    winding_down = (3.0, 3.0)
    """Seconds each stand-in agent takes to exit after the finished record."""
    finished = ProgressReport(step=10, total_steps=10, finished=True)

    def _start_worker(self, index: int) -> None:
        record = self.finished
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                AGENT,
                str(index),
                str(self.checkpoint_dir / PROGRESS_FILE),
                str(self.workdir),
                record.model_dump_json(by_alias=True),
                str(self.winding_down[index]),
            ]
        )
        log = self.log_dir / f"worker-{index}.log"
        self.workers[index] = _Worker(index, proc, log, datetime.now(UTC))


def test_finished_workers_exit_by_themselves_before_anything_is_stopped(tmp_path: Path) -> None:
    job = training_job(replicas={"min": 2, "max": 2})
    run = StandInAgents(job, tmp_path, out=io.StringIO())
    summary = run.run()
    assert summary.succeeded, summary.render()
    assert sorted(p.name for p in tmp_path.glob("sigterm-*")) == []
    assert all(worker.proc.returncode == 0 for worker in run.workers.values())


def test_a_worker_that_does_not_exit_is_stopped_after_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "FINISHED_EXIT_SECONDS", 1.0)
    job = training_job(replicas={"min": 2, "max": 2})
    run = StandInAgents(job, tmp_path, out=io.StringIO())
    run.winding_down = (0.5, 600.0)
    summary = run.run()
    assert summary.succeeded, summary.render()
    assert sorted(p.name for p in tmp_path.glob("sigterm-*")) == ["sigterm-1"]
    assert summary.wall_seconds < 60


@pytest.mark.parametrize("resumed_from", [None, 4])
def test_the_summary_says_the_runs_average_throughput_not_the_last_windows(
    tmp_path: Path, resumed_from: int | None
) -> None:
    """The trainer's tokens/s is its last log window's (the quick start's ran at ~10 × its
    average there, start-up and the recovery left behind): the summary divides the tokens of
    the steps this run trained by its wall time instead, and says so."""
    job = training_job(replicas={"min": 2, "max": 2})
    if resumed_from is not None:  # an earlier run's report: training resumes from its checkpoint
        (tmp_path / "checkpoints").mkdir()
        earlier = ProgressReport(step=resumed_from + 1, last_checkpoint_step=resumed_from)
        (tmp_path / "checkpoints" / PROGRESS_FILE).write_text(earlier.model_dump_json())
    run = StandInAgents(job, tmp_path, out=io.StringIO())
    run.winding_down = (0.5, 0.5)
    run.finished = ProgressReport(step=10, total_steps=10, finished=True, tokens_per_second=43443)
    summary = run.run()
    shown = summary.render()
    line = next(line for line in shown.splitlines() if "throughput" in line)
    steps = 10 - (resumed_from or 0)
    tokens = steps * job.spec.trainer.tokens_per_step
    assert "43,443" not in line, shown
    assert f"{tokens / summary.wall_seconds:,.0f} tokens/s" in line, shown
    assert f"{tokens:,} tokens ({steps} steps" in line and "wall time" in line, shown
