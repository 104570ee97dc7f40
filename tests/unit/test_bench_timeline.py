"""bench.timeline reads a run's training timeline off its workers' logs: the windows each
process trained, the steps a later round computed again, and where the wall time went."""

import datetime as dt
from pathlib import Path

import pytest

from bench.timeline import Timeline, _numbered, _Raw, figures


def at(seconds: float) -> float:
    """Unix time of 10:00:00 + ``seconds`` on the logs' day (local time, as the logs)."""
    return dt.datetime(2026, 11, 26, 10, 0, 0).timestamp() + seconds


def py(seconds: float, text: str, rank: int = 0) -> str:
    clock = dt.datetime(2026, 11, 26, 10, 0, 0) + dt.timedelta(seconds=seconds)
    tag = f" [rank {rank}]" if rank else ""
    return f"{clock:%Y-%m-%d %H:%M:%S},{clock.microsecond // 1000:03d} INFO torchkube{tag}: {text}"


def torchft(seconds: float, committed: bool) -> str:
    clock = dt.datetime(2026, 11, 26, 10, 0, 0) + dt.timedelta(seconds=seconds)
    return (
        f"{clock:%Y-%m-%dT%H:%M:%S}.{clock.microsecond // 1000:03d} [INFO] [torchft::manager] "
        f"- [Replica job-0] should_commit completed should_commit={str(committed).lower()}"
    )


START = "global batch 8 sequences over world size 2: 4 sequences per rank in 1 micro-steps"


def step(n: int, total: int) -> str:
    return f"step {n}/{total} | loss 5.0 | lr 1e-4 | grad norm 1.0 | 1 tok/s | mfu n/a"


def test_a_restarted_round_redoes_the_steps_since_the_checkpoint(tmp_path: Path) -> None:
    """Restart mode: rank 0 logs every 10 steps; the kill at t=2.5 (step 20) and the new round
    resumed from step 10 at t=5.5: steps 11–20 twice, their first window redone."""
    (tmp_path / "worker-0.log").write_text(
        "\n".join(
            [
                "torchkube: workers start warm",  # no time stamp: skipped
                py(0.0, START),
                py(1.0, step(10, 30)),
                py(2.0, step(20, 30)),
                "Traceback (most recent call last):",
                py(5.0, "resumed from /x/checkpoints/step-10 (written at world size 2) in 0.1s"),
                py(5.5, START),
                py(6.5, step(20, 30)),
                py(7.0, "checkpoint step-20 committed: 0.30s in total, training blocked 0.200s"),
                py(7.5, step(30, 30)),
            ]
        )
    )
    (tmp_path / "worker-1.log").write_text(
        py(2.0, "chaos: holding at step 20 until torchkube run kills this worker", rank=1)
    )
    timeline = Timeline.of(tmp_path.glob("worker-*.log"))
    assert [(w.after, w.upto) for w in timeline.windows] == [(0, 10), (10, 20), (10, 20), (20, 30)]
    found = figures(timeline, at(-2.0), lost_at=at(2.5), lost_step=20)
    assert found is not None
    assert found.steps_computed_twice == 10
    assert found.wall == pytest.approx(9.5) and found.startup == pytest.approx(2.0)
    assert found.trained == pytest.approx(2.8) and found.checkpoint_blocked == pytest.approx(0.2)
    assert found.redone == pytest.approx(1.0)
    assert found.loss_pause == pytest.approx(3.5)
    assert found.other == pytest.approx(0.0, abs=1e-6)
    assert found.back_past_loss_step == pytest.approx(5.0)
    assert found.replacement_trains == pytest.approx(3.0)
    assert found.goodput == pytest.approx(2.8 / 9.5)
    assert [(s, log) for _, s, log in timeline.resumes] == [(10, "worker-0.log")]


def test_live_survivors_train_on_and_the_pause_is_cut_out(tmp_path: Path) -> None:
    """Live mode: a commit line per step (numbered back from the reports, every 2 steps);
    the kill at t=1.2 after step 2, an attempt discarded at t=2.9, the survivor's quorum of one
    at t=3.0; the replacement copies step 3 and trains step 4 beside it."""
    (tmp_path / "worker-0.log").write_text(
        "\n".join(
            [
                py(0.0, START),
                torchft(0.5, True),
                torchft(1.0, True),
                py(1.01, step(2, 4)),
                torchft(2.9, False),
                py(3.0, "live: the quorum changed from 2 to 1 replica groups at step 2"),
                py(3.0, START),
                torchft(3.8, True),
                torchft(4.2, True),
                py(4.21, step(4, 4)),
            ]
        )
    )
    (tmp_path / "worker-1.log").write_text(
        "\n".join(
            [
                py(0.0, START),
                torchft(0.5, True),
                torchft(1.0, True),
                py(1.01, step(2, 4)),
                py(1.01, "chaos: holding at step 2 until torchkube run kills this worker"),
                py(3.85, "live: joined from a live peer: copied the state of step 3"),
                py(3.9, START),
                torchft(4.2, True),
                py(4.21, step(4, 4)),
            ]
        )
    )
    timeline = Timeline.of(tmp_path.glob("worker-*.log"))
    windows = sorted((w.log, w.after, w.upto) for w in timeline.windows)
    assert windows == [
        ("worker-0.log", 0, 1),
        ("worker-0.log", 1, 2),
        ("worker-0.log", 2, 3),
        ("worker-0.log", 3, 4),
        ("worker-1.log", 0, 1),
        ("worker-1.log", 1, 2),
        ("worker-1.log", 3, 4),
    ]
    found = figures(timeline, at(-1.0), at(1.2), 2, replacement_log="worker-1.log")
    assert found is not None
    assert found.steps_computed_twice == 0, "two groups computing one step are one round"
    assert found.trained == pytest.approx(2.2) and found.redone == 0.0
    assert found.loss_pause == pytest.approx(2.0)
    assert found.back_past_loss_step == pytest.approx(3.01)
    assert found.replacement_trains == pytest.approx(2.7)
    assert found.wall == pytest.approx(5.2) and found.other == pytest.approx(0.0, abs=1e-6)
    assert timeline.resumes == ()


def test_commits_of_a_process_that_ended_without_a_report_are_not_numbered() -> None:
    """A crashed group's last commits (steps 11, 12, no report after them) are followed in its
    log by its successor, which copied step 18: they are not numbered from its reports."""
    raw = [
        _Raw(0.0, "report", 10),
        _Raw(1.0, "commit", None),
        _Raw(2.0, "commit", None),
        _Raw(5.0, "start", None, fresh=True),
        _Raw(6.0, "commit", None),
        _Raw(7.0, "commit", None),
        _Raw(7.1, "report", 20),
    ]
    assert [e.step for e in _numbered(raw, "worker-1.log")] == [10, None, None, 18, 19, 20, 20]


def test_no_window_no_figures(tmp_path: Path) -> None:
    (tmp_path / "worker-0.log").write_text(py(0.0, START))
    assert figures(Timeline.of([tmp_path / "worker-0.log"]), at(0.0)) is None


def test_a_loss_seen_a_moment_before_it_struck_pauses_after_the_step_still_finished() -> None:
    """A crash found by a poll: the kill time read at t=1.5 falls in a step (1 → 2) the
    survivors still finish; their pause is the stretch in no window after it, 2 → 4."""
    from bench.timeline import Window, loss_pause

    windows = [
        Window("worker-0.log", 0.0, 1.0, 0, 1),
        Window("worker-0.log", 1.0, 2.0, 1, 2),
        Window("worker-1.log", 0.1, 1.9, 0, 2),
        Window("worker-0.log", 4.0, 5.0, 2, 3),
    ]
    assert loss_pause(windows, 1.5) == pytest.approx(2.0)
    assert loss_pause(windows, 3.0) == pytest.approx(2.0), "the kill inside the pause"
    assert loss_pause(windows[:2], 0.5) == 0.0, "trained on without a pause"
    assert loss_pause(windows, 6.0) is None
