"""What every side reads of a Pod (or any object) as the API returns it: name, role, worker
slot, phase, when it was made, whether it is being deleted. Tolerant of missing fields, so the
operator's slim cache, the CLI's full objects and the tests read them the same way."""

from datetime import datetime
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api.times import parse_time


def _meta(body: dict[str, Any]) -> dict[str, Any]:
    return body.get("metadata") or {}


def name(body: dict[str, Any]) -> str:
    return str(_meta(body).get("name", ""))


def role(pod: dict[str, Any]) -> str:
    return str((_meta(pod).get("labels") or {}).get(lbl.ROLE, ""))


def slot(pod: dict[str, Any]) -> int | None:
    """The worker slot (replica index) a pod fills; None for the rendezvous store."""
    value = (_meta(pod).get("labels") or {}).get(lbl.REPLICA_INDEX)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase", "Unknown"))


def created(body: dict[str, Any]) -> datetime | None:
    return parse_time(_meta(body).get("creationTimestamp"))


def deleting(body: dict[str, Any]) -> bool:
    return bool(_meta(body).get("deletionTimestamp"))
