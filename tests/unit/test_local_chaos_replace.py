"""``torchkube run --chaos-replace-after S``: a worker killed whole (its pod lost) is started
again S seconds after the kill, as a cluster schedules a lost pod's replacement and pulls its
image, not at once. The agents are stand-ins (a sleeping Python process)."""

import io
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from training_jobs import training_job

from torchkube.api.contract import ProgressReport
from torchkube.local import runner
from torchkube.local.cli import run_command
from torchkube.local.display import Summary
from torchkube.local.runner import Chaos, LocalRun, _Worker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "live-recovery.yaml"
REPLACE = ["--chaos-replace-after", "20"]


class StandInAgents(LocalRun):
    def _start_worker(self, index: int) -> None:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        self.workers[index] = _Worker(
            index, proc, self.log_dir / f"worker-{index}.log", datetime.now(UTC)
        )


def started(tmp_path: Path, chaos: Chaos) -> StandInAgents:
    """Two stand-in workers."""
    run = StandInAgents(training_job(replicas={"min": 2, "max": 2}), tmp_path, chaos=chaos)
    run.out = io.StringIO()
    run.log_dir.mkdir(parents=True)
    run._start_worker(0)
    run._start_worker(1)
    return run


def stop(run: StandInAgents) -> None:
    for worker in run.workers.values():
        worker.proc.kill()
        worker.proc.wait()


def test_the_replacement_waits_the_seconds_asked_for(tmp_path: Path) -> None:
    run = started(tmp_path, Chaos(at_steps=[5], worker=1, replace_after_seconds=20.0))
    first = run.workers[1].proc
    try:
        run._kill_one(1, 5, ProgressReport(step=5), 100.0)
        assert first.poll() is not None, "worker 1 was not killed"
        assert 1 not in run.workers, "the replacement started at once"
        assert run.waiting == {1: 120.0}
        assert [f.worker for f in run.failures] == [1]
    finally:
        stop(run)


def test_without_the_delay_the_replacement_starts_at_once(tmp_path: Path) -> None:
    run = started(tmp_path, Chaos(at_steps=[5], worker=1))
    first = run.workers[1].proc
    try:
        run._kill_one(1, 5, ProgressReport(step=5), 100.0)
        assert run.workers[1].proc is not first and run.workers[1].proc.poll() is None
        assert run.waiting == {}
    finally:
        stop(run)


def test_the_cli_flag_sets_the_delay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class Recording:
        metrics_ports: list[int] = []
        count, checkpoint_dir = 2, tmp_path

        def __init__(self, job: Any, workdir: Path, **kwargs: Any) -> None:
            seen.update(kwargs)

        def run(self) -> Summary:
            return Summary(name="live-recovery", succeeded=True, message="done")

    monkeypatch.setattr(runner, "LocalRun", Recording)
    result = CliRunner().invoke(
        run_command,
        [str(EXAMPLE), "--workdir", str(tmp_path / "w"), "--chaos-at-step", "5", *REPLACE],
    )
    assert result.exit_code == 0, result.output
    assert seen["chaos"].replace_after_seconds == 20.0
    assert seen["chaos"].at_steps == [5]
