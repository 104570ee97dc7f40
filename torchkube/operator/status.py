"""The status the operator writes: made safe to send, checked against the model, diffed.

A status the apiserver refuses is worse than a stale one: the write fails, and with it every
later write of that job (the same bad value is planned again), so the failure it was meant to
record is lost. Everything the trainer reports or a pod says passes through :func:`to_wire`:
floats that JSON cannot carry (NaN, ±inf — a diverged loss) are dropped, strings are cut to
their schema's length, and the whole is validated with the pydantic model the CRD schema is
generated from, so what passes here passes the apiserver.
"""

import logging
import math
from typing import Any

from pydantic import ValidationError

from torchkube.api.errors import describe
from torchkube.api.status import TrainingJobStatus

log = logging.getLogger(__name__)

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


def to_wire(status: dict[str, Any]) -> dict[str, Any]:
    """The status as it may be sent: finite numbers, strings within their limits, valid."""
    cleaned: dict[str, Any] = _clean(status)
    try:
        TrainingJobStatus.model_validate(cleaned)
    except ValidationError as error:
        raise StatusError(describe(error, prefix="  status.")) from error
    return cleaned


def changed(previous: dict[str, Any] | None, planned: dict[str, Any]) -> bool:
    return planned != (previous or {})
