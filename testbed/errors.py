"""The one error the harness raises: it always names the component that failed and why."""

from __future__ import annotations

from pathlib import Path


class ClusterError(RuntimeError):
    """A component of the test cluster could not be built, started, or kept running.

    The message carries the component, the reason, and the tail of the component's log, so a
    failing test run says what broke without anyone digging through a work dir.
    """

    def __init__(
        self, component: str, reason: str, log_path: Path | None = None, log_tail: str = ""
    ):
        self.component = component
        self.reason = reason
        self.log_path = log_path
        self.log_tail = log_tail
        message = f"{component}: {reason}"
        if log_path is not None:
            message += f"\n--- last lines of {log_path} ---\n{log_tail.rstrip()}\n---"
        elif log_tail:
            message += f"\n---\n{log_tail.rstrip()}\n---"
        super().__init__(message)
