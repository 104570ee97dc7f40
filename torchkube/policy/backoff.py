"""How long a job waits before a failed worker's replacement starts (``failurePolicy.backoff``),
counted in the incidents of its ledger: the operator delays the pod, ``torchkube run`` the
process, by the same rule.
"""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from torchkube.api.ledger import Ledger
from torchkube.api.spec import FailurePolicySpec
from torchkube.api.status import FailureRecord
from torchkube.api.times import parse_time


def incident_starts(history: Iterable[FailureRecord]) -> list[datetime]:
    """When each recorded incident began, oldest first (records without an incident number,
    written by older operators, are an incident each)."""
    starts: dict[Any, datetime] = {}
    for index, record in enumerate(history):
        when = parse_time(record.time)
        if when is None:
            continue
        incident = record.incident
        key: tuple[str, int] = ("record", index) if incident is None else ("incident", incident)
        starts[key] = min(when, starts.get(key, when))
    return sorted(starts.values())


def backoff_remaining(ledger: Ledger, policy: FailurePolicySpec, now: datetime) -> float:
    """Seconds until a replacement may be created.

    The delay doubles with each incident of an unbroken run of failures and starts again from
    ``initialSeconds`` once the job went ``backoff.resetAfterSeconds`` without one: a job that
    trained for a day is not punished for the failures of its first hour.
    """
    starts = incident_starts(ledger.history)
    if not starts:
        return 0.0
    reset = timedelta(seconds=policy.backoff.reset_after_seconds)
    streak = 1
    for earlier, later in zip(reversed(starts[:-1]), reversed(starts[1:]), strict=True):
        if later - earlier > reset:
            break
        streak += 1
    delay = policy.backoff.delay(streak - 1)
    return (starts[-1] + timedelta(seconds=delay) - now).total_seconds()
