"""Start-up and recovery times as the operator exports them (no cluster: the metric functions
fed one plan at a time, read back from the registry)."""

import time
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from training_jobs import training_job

from torchkube.api import TrainingJob
from torchkube.api.times import format_time
from torchkube.operator import metrics
from torchkube.operator.decision import Plan
from torchkube.operator.memory import Accounting
from torchkube.policy.failures import Failure


def _sum(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"{name}_sum", labels) or 0.0


def _created_ago(seconds: float) -> tuple[TrainingJob, float]:
    """A job created ``seconds`` ago, to the second as the API server stamps it; and when."""
    created = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=seconds)
    job = training_job(None)
    job.metadata["creationTimestamp"] = format_time(created)
    return job, created.timestamp()


def test_start_up_is_timed_to_the_last_worker_seen_running_not_to_the_reconcile() -> None:
    """The reconcile that sees every worker run may come a calm spacing after the last one
    started (controller.CALM_SPACING); the time is the watch's."""
    job, created = _created_ago(10.0)
    before = _sum("torchkube_job_startup_seconds")
    last_running = time.time() - 4.0
    metrics.job_planned(job, Plan(all_running=True, all_running_at=last_running), Accounting())
    timed = _sum("torchkube_job_startup_seconds") - before
    assert timed == pytest.approx(last_running - created, abs=1e-6)


def test_recovery_is_timed_from_the_failure_to_the_last_worker_seen_running() -> None:
    job, _ = _created_ago(100.0)
    books = Accounting(seen=True, startup_observed=True)
    failure = Failure(reason="ExitCode", message="exit 1", pod="w-1", exit_code=1)
    metrics.job_planned(job, Plan(failures=[failure]), books)
    assert books.failure_at is not None
    books.failure_at -= 3.0  # recorded three seconds ago
    failed = books.failure_at
    before = _sum("torchkube_recovery_seconds", namespace=job.namespace)
    back = time.time() - 1.0
    metrics.job_planned(job, Plan(all_running=True, all_running_at=back), books)
    timed = _sum("torchkube_recovery_seconds", namespace=job.namespace) - before
    assert timed == pytest.approx(back - failed, abs=1e-6)
