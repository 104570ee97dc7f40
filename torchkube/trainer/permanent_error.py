"""How the trainer says that a job cannot run (a permanent error), so nothing retries it.

No torch here: the entry point reports a configuration error before torch is imported.
"""

import contextlib
import os
import sys
import time
from pathlib import Path

from torchkube.api.contract import PROGRESS_FILE, TERMINATION_LOG, Env, ExitCode, ProgressReport
from torchkube.api.times import rfc3339
from torchkube.trainer.files import write_json_atomic
from torchkube.trainer.loader import RunEnv


def report_permanent_error(message: str, run_env: RunEnv | None = None) -> None:
    """Say why the job cannot run, everywhere the operator and a human look.

    One line on stderr; the line in ``$TORCHKUBE_PERMANENT_ERROR_FILE``, which tells
    ``torchkube.elastic.launch`` to stop torchrun instead of restarting the workers and to
    exit 3 (plain torchrun would exit 1); Kubernetes' termination message
    (``/dev/termination-log``); and on rank 0 an ``error`` / ``permanent`` entry in
    ``progress.json`` when the checkpoint folder is usable.
    """
    print(f"torchkube-trainer: error: {message}", file=sys.stderr, flush=True)
    if os.environ.get(Env.PERMANENT_ERROR_FILE):  # torchkube.elastic.launch stops torchrun
        with contextlib.suppress(OSError):
            Path(os.environ[Env.PERMANENT_ERROR_FILE]).write_text(message + "\n")
    env = run_env or RunEnv(
        checkpoint_dir=Path(os.environ[Env.CHECKPOINT_DIR])
        if os.environ.get(Env.CHECKPOINT_DIR)
        else None,
        rank=int(os.environ.get("RANK", "0") or 0),
    )
    log_path = env.termination_log or Path(
        os.environ.get(Env.TERMINATION_LOG, str(TERMINATION_LOG))
    )
    if log_path.exists():
        with contextlib.suppress(OSError):
            log_path.write_text(f"permanent error (exit {ExitCode.CONFIG_ERROR}): {message}\n")
    if env.rank == 0 and env.checkpoint_dir is not None and env.checkpoint_dir.is_dir():
        path = env.checkpoint_dir / PROGRESS_FILE
        with contextlib.suppress(OSError, ValueError):
            known = ProgressReport.model_validate_json(path.read_text()) if path.exists() else None
            report = (known or ProgressReport()).model_copy(
                update={
                    "error": message,
                    "permanent": True,
                    "exit_code": int(ExitCode.CONFIG_ERROR),
                    "updated": rfc3339(time.time()),
                }
            )
            write_json_atomic(path, report.to_wire())
