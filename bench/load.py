"""A bounded CPU load beside the benchmark: one busy process per core.

A real control-plane node is never idle, so every operator figure is taken twice: on an
idle machine and with this load running (the scheduler, the apiserver, the operators and the
load then share the cores, as they would with other system pods and controllers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

BUSY_LOOP = "while True: pass"

CONDITIONS = ("idle", "loaded")
"""What a figure's condition may be: ``loaded`` runs one busy process per core."""


@contextlib.contextmanager
def cpu_load(condition: str, processes: int | None = None) -> Iterator[int]:
    """Run ``processes`` busy loops (default: one per core) for the block when ``condition``
    is ``loaded``; yields how many run."""
    if condition not in CONDITIONS:
        raise ValueError(f"condition must be one of {CONDITIONS}, not {condition!r}")
    count = 0 if condition == "idle" else (processes or os.cpu_count() or 1)
    busy = [
        subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True)
        for _ in range(count)
    ]
    try:
        yield count
    finally:
        for proc in busy:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
