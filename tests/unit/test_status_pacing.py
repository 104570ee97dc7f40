"""A status write that moves only progress — the worker counts, a condition's message whose
status and reason stay — waits for ``status.PROGRESS_MIN_INTERVAL`` after the last write
(``status.pace_progress``); every other change is written at once, its progress with it, and
a job whose progress is held back is planned again when it is due."""

from datetime import timedelta

import pytest
from planner import condition, make_job, pod, run, store
from training_jobs import NOW

from torchkube.api.status import TrainingJobStatus
from torchkube.operator import conditions as cond
from torchkube.operator import status as st

SOON = timedelta(seconds=st.PROGRESS_MIN_INTERVAL * 0.3)
LATER = timedelta(seconds=st.PROGRESS_MIN_INTERVAL * 1.5)


def starting(running: int, slots: int = 4) -> list[dict]:
    """``running`` of ``slots`` workers Running, the rest starting on their nodes."""
    return [
        pod(slot, phase="Running" if slot < running else "Pending", age=5) for slot in range(slots)
    ] + [store()]


def stored_after(world: list[dict]) -> TrainingJobStatus:
    """The status a first plan on ``world`` wrote."""
    return run(make_job(), world).status


def test_a_start_moving_only_its_counts_is_written_once_a_second() -> None:
    stored = stored_after(starting(1))
    job = make_job(stored.to_wire())
    assert (
        "1 of at least 4" in condition(run(job, starting(1)), cond.WAITING_FOR_WORKERS)["message"]
    )

    held = run(job, starting(2), status_written=NOW - SOON)
    waiting = condition(held, cond.WAITING_FOR_WORKERS)
    assert "1 of at least 4" in waiting["message"], "progress alone was written at once"
    assert (held.status.ready_replicas, held.status.workers) == (1, "1/4")
    assert held.status == stored, "the held-back plan must write nothing"
    assert held.requeue_after == pytest.approx(
        (st.PROGRESS_MIN_INTERVAL * timedelta(seconds=1) - SOON).total_seconds()
    )
    assert held.status_written == NOW - SOON, "no write: the last one stays the last"

    due = run(job, starting(2), status_written=NOW - LATER)
    assert "2 of at least 4" in condition(due, cond.WAITING_FOR_WORKERS)["message"]
    assert (due.status.ready_replicas, due.status.workers) == (2, "2/4")
    assert due.status_written == NOW


def test_a_transition_is_written_at_once_with_its_progress() -> None:
    job = make_job(stored_after(starting(3)).to_wire())
    started = run(job, starting(4), status_written=NOW - SOON)
    assert started.status.phase == "Running"
    assert condition(started, cond.WAITING_FOR_WORKERS)["reason"] == "WorkersRunning"
    assert (started.status.ready_replicas, started.status.workers) == (4, "4/4")
    assert started.status_written == NOW


def test_a_process_that_has_written_nothing_writes_at_once() -> None:
    """A new operator (or leader) has no memory of the last write: nothing is held back."""
    job = make_job(stored_after(starting(1)).to_wire())
    fresh = run(job, starting(2))
    assert "2 of at least 4" in condition(fresh, cond.WAITING_FOR_WORKERS)["message"]
    assert fresh.status_written == NOW


def test_nothing_to_write_keeps_the_last_write() -> None:
    world = starting(2)
    stored = stored_after(world)
    same = run(make_job(stored.to_wire()), world, status_written=NOW - LATER)
    assert same.status == stored and same.status_written == NOW - LATER


def test_a_clock_stepped_back_holds_progress_for_one_interval_only() -> None:
    world = starting(2)
    job = make_job(stored_after(starting(1)).to_wire())
    stepped = run(job, world, status_written=NOW + timedelta(hours=1))
    assert stepped.requeue_after == pytest.approx(st.PROGRESS_MIN_INTERVAL)
