"""Polling with a deadline: how every readiness check and test assertion of the harness waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A condition did not hold before its deadline; the message says what was awaited."""


def wait_for(
    condition: Callable[[], T | None],
    timeout: float,
    *,
    interval: float = 0.2,
    what: str = "condition",
    describe_last: Callable[[], str] | None = None,
) -> T:
    """Call ``condition`` until it returns something truthy, and return that.

    Exceptions from ``condition`` propagate: checks that can fail transiently catch their own.
    ``describe_last`` adds the observed state to the timeout message (e.g. a pod's phase), which
    is what makes a timed-out integration test debuggable.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            detail = f"; last seen: {describe_last()}" if describe_last else ""
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)
