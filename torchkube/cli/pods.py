"""Which of a job's pods to read logs from: pure functions over pod dicts (API field names).

Rank 0 is not a fixed pod. Every agent rendezvous through the store pod and torchrun hands out
ranks per round, so after a failure or a resize rank 0 may live in any worker slot. The built-in
trainer logs at INFO only on rank 0, untagged (``... INFO torchkube: step 12/100 | ...``), while
the other ranks log warnings tagged ``torchkube [rank N]``; so the pod whose log shows the newest
untagged trainer line holds rank 0 now. A custom command leaves no such mark, and then worker
slot 0 is the best guess -- the help of ``torchkube logs`` says so.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api.podfields import created, deleting, name, phase, role, slot
from torchkube.api.times import parse_time

RANK0_LINE = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) torchkube: ")
"""A trainer line from rank 0 (other ranks write ``torchkube [rank N]:``)."""

PROBE_TAIL_LINES = 200
"""Lines read from each worker to find rank 0: a few log intervals of the trainer."""


def workers(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worker pods ordered by slot, newest first within a slot."""
    found = [p for p in pods if role(p) == lbl.ROLE_WORKER]
    found.sort(key=lambda p: created(p) or datetime.min.replace(tzinfo=UTC), reverse=True)
    found.sort(key=lambda p: (slot(p) is None, slot(p) or 0))
    return found


def log_candidates(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workers whose logs matter now, by slot.

    While the job trains, that is the running workers: a failed worker's log is history. Once
    no worker runs (the job finished, or every worker just failed), the workers that ran on a
    node are what is left to read. Pods being deleted never count: they are on their way out
    (a suspended job's, for example).
    """
    running = [
        p for p in workers(pods) if phase(p) == "Running" and not deleting(p) and _on_node(p)
    ]
    if running:
        return running
    return [p for p in workers(pods) if _on_node(p) and phase(p) != "Pending" and not deleting(p)]


def _on_node(pod: dict[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def newest_per_slot(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One pod per slot (the newest), in slot order: what ``logs --all`` shows."""
    seen: set[int | None] = set()
    chosen = []
    for pod in pods:  # already by slot, newest first
        if slot(pod) not in seen:
            seen.add(slot(pod))
            chosen.append(pod)
    return chosen


def in_slot(pods: list[dict[str, Any]], index: int) -> dict[str, Any] | None:
    """The newest candidate in worker slot ``index``."""
    return next((p for p in pods if slot(p) == index), None)


def rank0_time(log: str) -> datetime | None:
    """When the newest rank-0 trainer line of a log (read with ``timestamps=true``) was written."""
    for line in reversed(log.splitlines()):
        stamp, _, text = line.partition(" ")
        if RANK0_LINE.search(text):
            return parse_time(stamp)
    return None


def pick_rank0(
    candidates: list[dict[str, Any]], probes: dict[str, str]
) -> tuple[dict[str, Any], str]:
    """The pod that holds rank 0, and how we know; ``probes`` maps pod name to its log tail.

    The newest rank-0 line wins, because a pod that held rank 0 before a re-rendezvous keeps
    its old lines. Without any such line: the lowest slot's newest pod.
    """
    if not candidates:
        raise ValueError("no candidate pods")
    marked = [(t, p) for p in candidates if (t := rank0_time(probes.get(name(p), "")))]
    if marked:
        _, pod = max(marked, key=lambda item: item[0])
        return pod, "its log shows rank 0"
    return candidates[0], "no pod's log shows rank 0 yet, so the lowest worker slot"
