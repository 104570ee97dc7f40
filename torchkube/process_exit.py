"""How torchkube's processes end: with their result as the exit code, whatever native threads
torch left running.

By the time a launcher or a trainer returns its result, torch's native threads (a store
client's, a process group's, the agent's timers) may still be alive, and the interpreter's
finalisation destroys them: a C++ thread destroyed while joinable aborts the process
("terminate called without an active exception"). That is SIGABRT after the result was
printed, which turns a success or a permanent error (exit 3) into a crash the launcher or the
operator retries. Seen under CPU load only, so no process of torchkube takes the chance.
"""

import atexit
import logging
import os
import sys
from typing import NoReturn


def exit_process(code: int, *, run_exit_hooks: bool) -> NoReturn:
    """End the process with ``code`` once its output is flushed, skipping finalisation.

    ``run_exit_hooks`` runs the ``atexit`` hooks first (a user's metrics logger flushing its
    last records): what a finished trainer owes its user. Threads still running are not
    waited for, as finalisation would: a workload closes what it opened before it returns.
    """
    if run_exit_hooks:
        atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
