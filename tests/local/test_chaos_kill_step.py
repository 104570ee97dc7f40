"""``torchkube run --chaos-at-step N`` kills at step N however late the runner looks.

The runner sees training's progress only when it polls. Here it polls every 2 s while a step
of the tiny GPT takes a few tens of milliseconds, as a busy machine makes it: a kill that
waited for the runner to see step N would land dozens of steps later (before the worker held
still at N: 35 asked, killed after step 60 and more). The trainers' own logs are the oracle:
no rank may have logged a step past N before the kill.
"""

import datetime as dt
import io
import re
import time
from pathlib import Path

import pytest
import yaml

from torchkube.api import TrainingJob
from torchkube.local import runner
from torchkube.local.runner import Chaos, LocalRun

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

KILL_STEP = 35
"""Not a checkpoint step (every 10): the resumed round starts from step 30."""
_LINE = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3}) .*torchkube.*: step (\d+)/\d+ \|")


def logged_steps(log_dir: Path) -> list[tuple[float, int]]:
    """(Unix time, step) of every step line any rank of any worker logged."""
    found = []
    for path in log_dir.glob("worker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            match = _LINE.match(line)
            if match:
                at = dt.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                found.append((at, int(match[2])))
    return found


def test_the_kill_lands_at_the_step_asked_for_even_when_the_runner_looks_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    manifest["spec"]["checkpoint"]["intervalSteps"] = 10
    manifest["spec"]["trainer"] |= {"steps": 120, "logIntervalSteps": 1}
    job = TrainingJob.model_validate(manifest)
    monkeypatch.setattr(runner, "POLL_SECONDS", 2.0)
    out = io.StringIO()
    run = LocalRun(job, tmp_path, chaos=Chaos(at_steps=[KILL_STEP]), out=out)
    offset = time.time() - time.monotonic()
    summary = run.run(on_progress=lambda _line: None)
    assert summary.succeeded and summary.steps == 120, (summary.message, out.getvalue())
    [failure] = run.failures
    killed_at = failure.at + offset
    before = [step for at, step in logged_steps(run.log_dir) if at < killed_at]
    assert max(before) == KILL_STEP, f"training reached step {max(before)} before the kill"
    assert failure.step == KILL_STEP and failure.checkpoint_step == 30
    assert f"chaos: SIGKILL worker 0 at step {KILL_STEP}\n" in out.getvalue()
    assert "chaos: holding at step 35" in (run.log_dir / "worker-0.log").read_text()
