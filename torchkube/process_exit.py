"""How torchkube's processes end when they must not linger: with their result as the exit code,
whatever native threads torch left running, and at once.

By the time a launcher returns its result, torch's native threads (a store client's, the
agent's timers) may still be alive, and the interpreter's finalisation destroys them: a C++
thread destroyed while joinable aborts the process ("terminate called without an active
exception"). That is SIGABRT after the result was printed, which turns a success or a
permanent error (exit 3) into a crash the operator retries; seen under CPU load only, so the
launcher never takes the chance. A failed trainer ends the same way, without waiting for a
checkpoint thread that may be stuck on a dead peer. (A finished trainer exits through the
interpreter: ``torchkube.trainer.entrypoint.exit_with``.)
"""

import contextlib
import logging
import os
import sys
from typing import NoReturn


def exit_process(code: int, *, flush_logs: bool) -> NoReturn:
    """End the process with ``code`` once its output is flushed, skipping finalisation and
    exit hooks. ``flush_logs`` also flushes the logging handlers, which takes their locks: not
    for a failed trainer, where a stuck thread may hold one."""
    if flush_logs:
        logging.shutdown()
    with contextlib.suppress(Exception):  # a closed pipe must not turn the result into another
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
