"""The end of a process's log: what it said last before it exited (a crash's exception comes
last), for ``torchkube run``'s messages and the test control plane's errors alike."""

from __future__ import annotations

import os
from pathlib import Path

WINDOW = 64 * 1024
"""Bytes read from the end: a long log is not read whole to show its last lines."""


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log ('' when it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - WINDOW))
            data = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def last_line(path: Path) -> str:
    """The last line of a log that says something ('' when none does)."""
    said = (line.strip() for line in reversed(tail(path).splitlines()))
    return next((line for line in said if line), "")
