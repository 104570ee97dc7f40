"""``torchkube plot``: a synthetic run dir (the trainer's log format) drawn to a PNG."""

import io
import json
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from training_jobs import training_job

from torchkube.api.contract import ProgressReport
from torchkube.local.plot import Run, plot_command, read_run
from torchkube.local.runner import LocalRun

STEP = (
    "{t} INFO torchkube: step {s}/100 | loss {loss:.4f} | lr 3.00e-04 | grad norm 1.000 | "
    "12,345 tok/s | mfu {mfu} | 80.0 ms/step (data 1.5 ms) | world 2 × accum 1"
)


def stamp(second: float) -> str:
    whole = int(second)
    return f"2026-01-01 00:{whole // 60:02d}:{whole % 60:02d},{int((second % 1) * 1000):03d}"


def synthetic_run(root: Path) -> Path:
    """Steps 10-60 on worker 0, which dies; worker 1 logs the error, resumes from step 40 and
    trains to 100 (it is rank 0 from then on)."""
    logs = root / "run" / "logs"
    logs.mkdir(parents=True)
    worker0 = [STEP.format(t=stamp(s), s=s, loss=5 - s / 30, mfu="n/a") for s in range(10, 61, 10)]
    worker0.insert(
        4,
        f"{stamp(40.5)} INFO torchkube: checkpoint step-40 committed: 0.30s in "
        "total, training blocked 0.020s",
    )
    worker1 = [
        f"{stamp(62)} ERROR torchkube [rank 1]: training failed",
        "Traceback (most recent call last):",
        "RuntimeError: Connection reset by peer",
        f"{stamp(80)} INFO torchkube: resumed from /ckpt/step-40 (written at world size 2 "
        "with ddp) in 1.00s",
        *(STEP.format(t=stamp(40 + s), s=s, loss=5 - s / 30, mfu="12.5%") for s in (50, 60)),
        *(
            STEP.format(t=stamp(40 + s), s=s, loss=5 - s / 30, mfu="12.5%")
            for s in range(70, 101, 10)
        ),
        f"{stamp(140)} INFO torchkube: step 100 | eval loss 1.9000",
    ]
    (logs / "worker-0.log").write_text("\n".join(worker0) + "\n")
    (logs / "worker-1.log").write_text("\n".join(worker1) + "\n")
    return root / "run"


def test_logs_are_merged_and_the_failure_found(tmp_path: Path) -> None:
    run = read_run(synthetic_run(tmp_path))
    assert [s.step for s in run.steps] == [10, 20, 30, 40, 50, 60, 50, 60, 70, 80, 90, 100]
    assert run.checkpoints == [(30.5, 40, 0.3, 0.02)]
    assert run.evals == [(130.0, 100, 1.9)]
    assert run.steps[-1].mfu == 0.125 and run.steps[0].mfu is None
    assert run.steps[0].step_ms == 80.0 and run.steps[0].data_ms == 1.5
    assert run.steps[0].tokens_per_second == 12345 and run.steps[0].world == 2
    [failure] = run.failures
    # From the survivor's error (t=62, 52 s after the first line) until step 70 (t=110).
    assert (failure.at, failure.step, failure.resumed_step) == (52.0, 60, 40)
    assert failure.recovered_at == 100.0
    assert run.lost_seconds == 48.0


def test_plot_command_writes_a_png(tmp_path: Path) -> None:
    run_dir = synthetic_run(tmp_path)
    out = tmp_path / "out.png"
    result = CliRunner().invoke(plot_command, [str(run_dir), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 20_000
    assert "failure at step 60 (back past it in 48.0s)" in result.output


def test_a_dir_without_logs_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(plot_command, [str(tmp_path)])
    assert result.exit_code != 0
    assert "no worker logs" in result.output


def test_a_resume_from_the_last_logged_step_is_a_failure_too(tmp_path: Path) -> None:
    """Killed right after the step-60 checkpoint: training never goes back in the logs."""
    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    lines = [STEP.format(t=stamp(s), s=s, loss=3.0, mfu="n/a") for s in (10, 20, 30, 40, 50, 60)]
    lines += [
        f"{stamp(61)} ERROR torchkube [rank 1]: training failed",
        f"{stamp(75)} INFO torchkube: resumed from /ckpt/step-60 (written at world size 2 "
        "with ddp) in 1.00s",
        STEP.format(t=stamp(80), s=70, loss=3.0, mfu="n/a"),
    ]
    (logs / "worker-0.log").write_text("\n".join(lines) + "\n")
    [failure] = read_run(tmp_path / "run").failures
    assert (failure.at, failure.step, failure.resumed_step, failure.recovered_at) == (
        51.0,
        60,
        60,
        70.0,
    )


def test_without_matplotlib_the_command_says_which_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain install (no `plot` extra): one sentence and exit code 1, never a traceback."""
    run_dir = synthetic_run(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import` sees when absent
    result = CliRunner().invoke(plot_command, [str(run_dir), "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 1
    assert "pip install 'torchkube[plot]'" in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, ImportError)


def test_the_plot_of_a_torchkube_run_says_the_time_lost_its_summary_said(tmp_path: Path) -> None:
    """The README shows the quick start's summary and its picture side by side: the picture
    draws the failures ``torchkube run`` recorded in the run dir, so both say the same time
    lost (each from its own reading, the summary's polls and the logs' stamps, they differed
    by seconds)."""
    run = LocalRun(training_job(replicas={"min": 2, "max": 2}), tmp_path / "run", out=io.StringIO())
    run.log_dir.mkdir(parents=True)
    run.restart_board.read = lambda: []  # type: ignore[method-assign]  # no store here
    began, wall = time.monotonic(), time.time()  # the runner's clock; the logs' stamps

    def at(seconds: float) -> str:
        return datetime.fromtimestamp(wall + seconds).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]

    lines = [STEP.format(t=at(s / 10), s=s, loss=3.0, mfu="n/a") for s in (10, 20, 30, 40)]
    lines += [
        f"{at(4.4)} ERROR torchkube [rank 1]: training failed",
        f"{at(9.0)} INFO torchkube: resumed from /ckpt/step-40 (written at world size 2 "
        "with ddp) in 1.00s",
        *(STEP.format(t=at(9.0 + s / 10), s=s, loss=3.0, mfu="n/a") for s in (50, 60)),
    ]
    (run.log_dir / "worker-1.log").write_text("\n".join(lines) + "\n")
    record = ProgressReport(step=40, total_steps=100, last_checkpoint_step=40)
    failure = run._display_failure(0, "killed (chaos)", record, began + 4.0)
    failure.recovered_at = began + 14.3
    run.failures.append(failure)
    summary = run._finish(True, "training completed", began - 1.0, record)
    drawn = read_run(tmp_path / "run")
    assert f"{summary.lost_seconds:.1f}" == f"{drawn.lost_seconds:.1f}" == "10.3", summary.render()
    [shaded] = drawn.failures
    assert (shaded.step, shaded.resumed_step) == (40, 40)


def test_a_run_read_once_is_drawn_again_from_its_record(tmp_path: Path) -> None:
    """``bench.quickstart`` keeps the run it recorded, and ``bench.report`` draws it later."""
    run = read_run(synthetic_run(tmp_path))
    again = Run.from_wire(json.loads(json.dumps(run.to_wire())))
    assert again == run
