"""In-place restarts in the failure policy: torchrun restarting a pod's workers without the
pod failing counts like a pod failure, once, under the same per-incident rule — a crash
loop spends ``maxRestarts`` — and a restart caused by another pod's failure joins that
incident free (torchkube/policy/, through the planner)."""

from datetime import timedelta

import pytest
from planner import NOW, created_slots, make_job, pod, run, running_status, store

from torchkube.api import labels as lbl
from torchkube.api.contract import InPlaceRestart, ProgressReport
from torchkube.api.times import format_time
from torchkube.policy.failures import in_place_failure


def progress(*restarts: InPlaceRestart) -> ProgressReport:
    return ProgressReport(
        step=50, updated=format_time(NOW - timedelta(seconds=2)), in_place_restarts=list(restarts)
    )


def restart(
    worker: dict, count: int, ago: float, code: int = 7, committed: int | None = None
) -> InPlaceRestart:
    return InPlaceRestart(
        pod=worker["metadata"]["name"],
        node="n1",
        restart=count,
        exit_code=code,
        message="ValueError: bad batch",
        time=format_time(NOW - timedelta(seconds=ago)),
        committed_step=committed,
    )


def test_an_in_place_restart_is_a_counted_incident_reported_once() -> None:
    workers = [pod(i) for i in range(4)]
    result = run(
        make_job(running_status()),
        [*workers, store()],
        progress=progress(restart(workers[1], 1, ago=40)),
    )
    last = result.status.last_failure
    assert last is not None and (last.reason, last.pod) == (
        "InPlaceRestart",
        workers[1]["metadata"]["name"],
    )
    assert last.exit_code == 7 and "in place" in last.message and "bad batch" in last.message
    assert (result.status.restarts, result.status.restarts_count_towards_max) == (1, 1)
    assert [e.reason for e in result.events] == ["InPlaceRestart"]
    assert result.mark_recorded == {workers[1]["metadata"]["name"]: "1"}
    assert result.delete_pods == [] and created_slots(result) == [], "the pod itself is fine"

    workers[1]["metadata"]["labels"][lbl.FAILURE_RECORDED] = "1"
    again = run(
        make_job(result.status),
        [*workers, store()],
        progress=progress(restart(workers[1], 1, ago=50)),
    )
    assert again.status.restarts == 1 and again.events == [], "recorded once"


def test_a_fresh_in_place_restart_waits_for_its_cause_to_be_seen() -> None:
    workers = [pod(i) for i in range(4)]
    result = run(
        make_job(running_status()),
        [*workers, store()],
        progress=progress(restart(workers[1], 1, ago=5)),
    )
    assert result.status.restarts == 0
    assert result.requeue_after is not None and 0 < result.requeue_after <= 25


def test_a_restart_caused_by_another_pods_free_failure_joins_it_free() -> None:
    workers = [pod(i) for i in range(4)]
    deleted = {
        "reason": "Deleted",
        "message": "pod x was deleted by someone else",
        "pod": "demo-worker-3-gone",
        "time": format_time(NOW - timedelta(seconds=50)),
        "incident": 1,
        "counted": False,
    }
    job = make_job(running_status(restarts=1, failures=[deleted], lastFailure=deleted))
    result = run(
        job, [*workers, store()], progress=progress(restart(workers[0], 1, ago=48, code=1))
    )
    assert (result.status.restarts, result.status.restarts_count_towards_max) == (1, 0)
    record = result.status.failures[-1]
    assert (record.reason, record.incident, record.counted) == ("InPlaceRestart", 1, False)


def test_a_crash_loop_in_place_spends_max_restarts() -> None:
    workers = [pod(i) for i in range(4)]
    loop = [restart(workers[2], n, ago=ago) for n, ago in enumerate((240, 180, 120, 60), 1)]
    job = make_job(running_status(), failurePolicy={"maxRestarts": 2})
    result = run(job, [*workers, store()], progress=progress(*loop))
    assert result.status.phase == "Failed", result.status.conditions
    failed = next(c for c in result.status.conditions if c.type == "Failed")
    assert failed.reason == "MaxRestartsExceeded" and "in place" in failed.message


LIVE = {"replicas": {"min": 2, "max": 2}, "failurePolicy": {"recovery": "live", "maxRestarts": 5}}


@pytest.mark.parametrize(("committed", "counted"), [(None, 1), (12, 0)])
def test_a_live_group_restarted_in_place_again_before_committing_a_step_counts(
    committed: int | None, counted: int
) -> None:
    """recovery live: slot 1's workers restarted in place twice, the second round without a
    committed step (the launcher's record says so): a crash loop, which spends maxRestarts;
    a round that committed steps is lost free, like the first."""
    workers = [pod(0), pod(1)]
    result = run(
        make_job(running_status(), **LIVE),
        [*workers, store()],
        progress=progress(
            restart(workers[1], 1, ago=70), restart(workers[1], 2, ago=40, committed=committed)
        ),
    )
    status = result.status
    assert (status.replica_group_losses, status.restarts) == (2, 0), status.failures
    assert status.restarts_count_towards_max == counted, status.failures


def test_a_restart_that_joins_a_pods_loss_names_that_loss_as_its_cause() -> None:
    """A survivor's workers fail on their lost peer: the record of its restart names the
    peer's loss, not torch's hint for a worker without an error file."""
    workers = [pod(i) for i in range(4)]
    lost = {
        "reason": "NodeLost",
        "message": "pod demo-worker-3-gone on node n2 was lost with its node",
        "pod": "demo-worker-3-gone",
        "time": format_time(NOW - timedelta(seconds=50)),
        "incident": 1,
        "counted": False,
    }
    job = make_job(running_status(restarts=1, failures=[lost], lastFailure=lost))
    survivor = restart(workers[0], 1, ago=48, code=1).model_copy(
        update={
            "message": "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        }
    )
    result = run(job, [*workers, store()], progress=progress(survivor))
    record = result.status.failures[-1]
    assert (record.reason, record.incident, record.counted) == ("InPlaceRestart", 1, False)
    assert "To enable traceback" not in record.message, record.message
    assert "demo-worker-3-gone" in record.message and "lost" in record.message, record.message


def test_torchs_hint_for_a_worker_without_an_error_file_is_no_detail() -> None:
    alone = in_place_failure(
        InPlaceRestart(
            pod="demo-worker-0-a",
            restart=1,
            exit_code=1,
            message="To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            time=format_time(NOW),
        ),
        None,
    )
    assert alone.message.endswith("a worker exited with code 1"), alone.message
