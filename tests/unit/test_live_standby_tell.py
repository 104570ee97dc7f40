"""The operator and the local runner tell a standby spare from a training group by the writer
group's progress record: the quorum's slots, and when the record was written."""

from datetime import UTC, datetime, timedelta

import pytest
from planner import NOW, make_job, pod, run, running_status, store

from torchkube.api.contract import LiveProgress, ProgressReport
from torchkube.api.standby import stands_by
from torchkube.api.times import format_time

WRITTEN = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
BEFORE, AFTER = WRITTEN - timedelta(minutes=5), WRITTEN + timedelta(seconds=5)


def record(slots: list[int], written: datetime | None = WRITTEN) -> ProgressReport:
    live = LiveProgress(replica_groups=len(slots), grad_accum_steps=1, training_slots=slots)
    return ProgressReport(step=300, live=live, updated=format_time(written) if written else None)


@pytest.mark.parametrize(
    ("slot", "created", "progress", "standing_by"),
    [
        (2, BEFORE, record([0, 1]), True),  # a spare outside the quorum all along
        (1, BEFORE, record([0, 1]), False),  # a training group
        (2, AFTER, record([0, 1]), False),  # created since the record: may have joined
        (2, BEFORE, record([]), False),  # no quorum named (an older trainer)
        (2, BEFORE, record([0, 1], written=None), False),  # no time on the record
        (2, BEFORE, ProgressReport(step=300), False),  # recovery restart: no live record
        (2, BEFORE, None, False),  # no record read yet
        (None, BEFORE, record([0, 1]), False),  # not a worker slot
        (2, None, record([0, 1]), False),  # creation time unknown
    ],
)
def test_a_running_worker_stands_by_only_when_the_record_says_so(
    slot: int | None,
    created: datetime | None,
    progress: ProgressReport | None,
    standing_by: bool,
) -> None:
    assert stands_by(slot, created, progress) is standing_by


def test_losing_the_only_training_group_beside_a_standby_is_a_restart_not_a_group_loss() -> None:
    """replicas 1 and a spare: slot 0 trains, slot 1 stands by. Slot 0 lost leaves no live
    peer (the spare, joining, starts from the checkpoint): the job restarts, one incident,
    instead of a replica group lost with a survivor that never trained."""
    job = make_job(
        running_status(),
        replicas={"min": 1, "max": 1, "spares": 1},
        failurePolicy={"recovery": "live", "maxRestarts": 3},
    )
    pods = [pod(0, phase="Failed", exit_code=137), pod(1), store()]
    written = NOW - timedelta(seconds=10)  # after both pods were created (60 s ago)
    result = run(job, pods, progress=record([0], written=written))
    assert (result.status.restarts, result.status.replica_group_losses) == (1, 0), result.status
    trained_on = run(job, pods, progress=record([0, 1], written=written))
    assert (trained_on.status.restarts, trained_on.status.replica_group_losses) == (0, 1)
