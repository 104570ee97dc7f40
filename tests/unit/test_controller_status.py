"""When the controller writes a job's status at once, and when it holds a count-only change."""

import time

from torchkube.operator.controller import COUNT_WRITE_INTERVAL, Controller, _Memory
from torchkube.operator.reconcile import Plan


def status(phase: str = "Pending", ready: int = 0, reason: str = "Creating") -> dict[str, object]:
    return {
        "phase": phase,
        "readyReplicas": ready,
        "workers": f"{ready}/512",
        "conditions": [
            {"type": "Created", "status": "True", "reason": reason, "message": f"{ready} ready"}
        ],
    }


def hold(current: dict[str, object], decided: dict[str, object], written_ago: float) -> float:
    memory = _Memory(status_written_at=time.monotonic() - written_ago)
    return Controller._status_hold(current, Plan(status=decided), memory)


def test_count_only_change_right_after_a_write_is_held_for_the_rest_of_the_interval() -> None:
    held = hold(status(ready=10), status(ready=11), written_ago=0.25)
    assert 0.5 < held <= COUNT_WRITE_INTERVAL - 0.25


def test_count_only_change_after_the_interval_is_written() -> None:
    assert hold(status(ready=10), status(ready=11), written_ago=COUNT_WRITE_INTERVAL + 0.1) == 0


def test_phase_condition_and_restart_changes_are_written_at_once() -> None:
    assert hold(status(), status(phase="Running"), written_ago=0) == 0
    assert hold(status(), status(reason="Other"), written_ago=0) == 0
    assert hold(status(), {**status(), "restarts": 1}, written_ago=0) == 0


def test_unchanged_status_holds_nothing() -> None:
    assert hold(status(ready=3), status(ready=3), written_ago=0) == 0
