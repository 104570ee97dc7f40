"""The process entry point shared by ``python -m torchkube.trainer`` and user scripts.

Configuration errors are caught before torch is imported and reported as one line with exit
code 3, which the operator treats as permanent. See docs/trainer.md for all exit codes.
"""

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from torchkube.api.contract import ExitCode
from torchkube.process_exit import exit_process
from torchkube.trainer.loader import ConfigError, load_config, preflight
from torchkube.trainer.permanent_error import report_permanent_error

if TYPE_CHECKING:
    from torchkube.trainer.workload import Workload


def main(argv: Sequence[str] | None = None, workload: "Workload | None" = None) -> int:
    """Validate the configuration, then train ``workload`` (default: the built-in GPT).

    Returns the process exit code; :func:`exit_with` turns it into one.
    """
    try:
        spec, run_env = load_config(sys.argv[1:] if argv is None else argv)
        preflight(spec, run_env)
    except ConfigError as e:
        report_permanent_error(str(e))
        return ExitCode.CONFIG_ERROR
    from torchkube.trainer.train import run  # torch is imported only for a valid config

    return run(spec, run_env, workload)


def exit_with(code: int) -> NoReturn:
    """End the trainer with ``code``. A failed run exits at once (:mod:`torchkube.process_exit`),
    without waiting for a checkpoint thread that may be stuck on a dead peer; a finished one
    through the interpreter's own exit, which a warm worker needs to end at all."""
    if code != ExitCode.OK:
        exit_process(code, flush_logs=False)
    sys.exit(code)
