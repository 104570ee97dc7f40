"""The status the operator writes: made safe to send, diffed, and how often goodput or
progress alone may cause a write.

A status the apiserver refuses is worse than a stale one: the write fails, and with it every
later write of that job (the same bad value is planned again), so the failure it was meant to
record is lost. Everything the trainer reports or a pod says passes through :func:`to_wire`:
floats that JSON cannot carry (NaN, ±inf — a diverged loss) are dropped, strings are cut to
their schema's length, and the whole is validated with the pydantic model the CRD schema is
generated from, so what passes here passes the apiserver.
"""

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from torchkube.api.errors import describe
from torchkube.api.status import TrainingJobStatus
from torchkube.api.types import Condition

GOODPUT_MIN_INTERVAL = 30.0
"""``status.goodput`` alone causes a status write at most this often: it moves with the
clock, and without a limit a young job's status would be rewritten on every reconcile."""

PROGRESS_MIN_INTERVAL = 1.0
"""A status write that only moves progress — the worker counts, or a condition's message
whose status and reason stay (``waiting for 12 more workers``, ``starting for 3s``) — comes
at most this often after the last write. Otherwise a start is rewritten for every batch of
pods that starts: each write of the custom resource costs the API server a validation
against the whole schema, beside the scheduler that binds the very pods, and every watcher of
the job an event, the operator's own reconcile among them."""

_MESSAGE_LIMITS = {"message": 4096, "reason": 1024, "pod": 253, "node": 253}


class StatusError(ValueError):
    """A planned status that would not pass the schema (a bug: say what and where)."""


def _clean(value: Any, key: str = "") -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        cleaned = {k: _clean(v, k) for k, v in value.items()}
        return {k: v for k, v in cleaned.items() if v is not None}
    if isinstance(value, list):
        return [_clean(item) for item in value]
    if isinstance(value, str) and key in _MESSAGE_LIMITS and len(value) > _MESSAGE_LIMITS[key]:
        limit = _MESSAGE_LIMITS[key]
        return "…" + value[-(limit - 1) :]
    return value


def to_wire(status: TrainingJobStatus | dict[str, Any]) -> dict[str, Any]:
    """The status as it may be sent: finite numbers, strings within their limits, valid."""
    raw = status.to_wire() if isinstance(status, TrainingJobStatus) else status
    cleaned: dict[str, Any] = _clean(raw)
    try:
        TrainingJobStatus.model_validate(cleaned)
    except ValidationError as error:
        raise StatusError(describe(error, prefix="  status.")) from error
    return cleaned


def merge_patch(stored: dict[str, Any] | None, planned: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns the stored status into the planned one:
    what changed, and ``null`` for what the plan no longer has. Sending the planned status
    itself would merge it into the stored one, so a field the plan clears (an exit code a
    later failure lacks, ``slowestRank.stragglingSince`` once the rank keeps up) would stay.
    Lists are replaced whole, as a merge patch does. Empty: nothing to write."""
    stored = stored or {}
    patch: dict[str, Any] = {key: None for key in stored if key not in planned}
    for key, value in planned.items():
        before = stored.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif key not in stored or before != value:
            patch[key] = value
    return patch


@dataclass(frozen=True)
class GoodputWrite:
    """The value ``status.goodput`` was last given, and when it last changed."""

    value: float | None = None
    at: datetime | None = None


def goodput_to_write(
    ratio: float | None,
    stored: TrainingJobStatus | None,
    planned: TrainingJobStatus,
    last: GoodputWrite | None,
    now: datetime,
) -> GoodputWrite:
    """What ``status.goodput`` should say now: the new ratio (to 0.001) when the status is
    written anyway or ``GOODPUT_MIN_INTERVAL`` passed since it last changed, else the value
    already there. ``stored`` is the status as stored, ``planned`` the one the plan decided
    (the planner keeps out what the wire cannot carry, so the two compare as they are sent)."""
    old = stored.goodput if stored else None
    last = last or GoodputWrite(old, now)
    if ratio is None:
        return GoodputWrite(old, last.at)
    value = round(ratio, 3)
    writing = _without_goodput(planned) != _without_goodput(stored or TrainingJobStatus())
    due = last.at is None or (now - last.at).total_seconds() >= GOODPUT_MIN_INTERVAL
    if old is None or value == old or writing or due:
        return GoodputWrite(value, now if old is None or value != old else last.at)
    return GoodputWrite(old, last.at)


def _without_goodput(status: TrainingJobStatus) -> TrainingJobStatus:
    return status.model_copy(update={"goodput": None})


@dataclass(frozen=True)
class PacedStatus:
    """The status to write now, and when the progress held back from it is due."""

    status: TrainingJobStatus
    due_in: float | None = None
    """Seconds until the progress held back may be written (None: nothing held)."""


def pace_progress(
    stored: TrainingJobStatus | None,
    planned: TrainingJobStatus,
    written_at: datetime | None,
    now: datetime,
) -> PacedStatus:
    """``planned``, or — when it differs from ``stored`` only in progress and the last write
    (``written_at``, None when this process has made none) is younger than
    ``PROGRESS_MIN_INTERVAL`` — ``planned`` with that progress as stored. Any other change is
    written at once, the progress with it."""
    if stored is None or written_at is None:
        return PacedStatus(planned)
    held = _progress_as_stored(planned, stored)
    if held == planned or _without_goodput(held) != _without_goodput(stored):
        return PacedStatus(planned)
    # a wall clock stepped back holds progress for one interval, not for the step
    wait = min(PROGRESS_MIN_INTERVAL - (now - written_at).total_seconds(), PROGRESS_MIN_INTERVAL)
    return PacedStatus(held, wait) if wait > 0 else PacedStatus(planned)


def _progress_as_stored(planned: TrainingJobStatus, stored: TrainingJobStatus) -> TrainingJobStatus:
    before = {condition.type: condition for condition in stored.conditions}

    def as_stored(condition: Condition) -> Condition:
        old = before.get(condition.type)
        same = old is not None and (old.status, old.reason, old.observed_generation) == (
            condition.status,
            condition.reason,
            condition.observed_generation,
        )
        return condition.model_copy(update={"message": old.message}) if old and same else condition

    return planned.model_copy(
        update={
            "replicas": stored.replicas,
            "ready_replicas": stored.ready_replicas,
            "workers": stored.workers,
            "conditions": [as_stored(condition) for condition in planned.conditions],
        }
    )
