"""torchrun, with the two answers a pod owes its operator: how the workers ended, and whether
retrying could help.

It takes exactly torchrun's arguments and runs torchrun's own ``run()`` in-process. What it
adds:

* **The worker's exit code.** torchrun exits 1 whatever its workers did; here the first
  failed worker's code becomes the container's exit code (a signal ``N`` becomes ``128+N``),
  so ``failurePolicy.permanentExitCodes`` and ``OOMKilled`` mean what they say.
* **No restart loop on permanent errors.** A worker that hits a configuration error writes a
  line to ``$TORCHKUBE_PERMANENT_ERROR_FILE`` before exiting (the built-in trainer does; any
  script may). The launcher then stops torchrun at once instead of restarting the workers
  ``--max-restarts`` times, exits with ``PERMANENT_EXIT_CODE`` and puts the line in the
  container's termination message, which ``kubectl describe`` and the job status show.

* **Re-joins that work.** torchrun (2.15) caches the worker store address of the first
  round when agents share their TCP store, so after a scale-down the next agent to join waits
  forever for an address nobody publishes. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` makes
  every round publish its own; the launcher sets it unless the caller chose otherwise.

Run: ``python -m torchkube.elastic.launch [torchrun arguments] script-or--m-module [args]``.
"""

import contextlib
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

PERMANENT_EXIT_CODE = 3
PERMANENT_ERROR_ENV = "TORCHKUBE_PERMANENT_ERROR_FILE"
TERMINATION_LOG = Path("/dev/termination-log")
POLL_SECONDS = 0.2


def _watch(marker: Path, done: threading.Event) -> None:
    """Stop torchrun (as on SIGTERM) as soon as a worker reports a permanent error."""
    while not done.wait(POLL_SECONDS):
        if marker.exists():
            os.kill(os.getpid(), signal.SIGTERM)
            return


def _exit_code(error: BaseException) -> int:
    failures = getattr(error, "failures", None)
    if failures:
        first = failures[min(failures)]
        code = int(first.exitcode)
        return 128 - code if code < 0 else code
    signum = getattr(error, "sigval", None)
    if signum is not None:
        return 128 + int(signum)
    return 1


def _report(message: str) -> None:
    print(f"torchkube: {message}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):  # not in a pod: stderr is enough
        TERMINATION_LOG.write_text(message[-4096:])


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.run import parse_args, run

    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    marker = Path(tempfile.mkdtemp(prefix="torchkube-")) / "permanent-error"
    os.environ[PERMANENT_ERROR_ENV] = str(marker)
    done = threading.Event()
    threading.Thread(target=_watch, args=(marker, done), daemon=True).start()
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
        return 0
    except BaseException as error:  # torchrun signals failures with several exception types
        if isinstance(error, KeyboardInterrupt | SystemExit) and not marker.exists():
            raise
        if marker.exists():
            _report(f"permanent error, not retrying: {marker.read_text().strip()}")
            return PERMANENT_EXIT_CODE
        code = _exit_code(error)
        _report(f"workers failed with exit code {code}: {error}")
        return code
    finally:
        done.set()


if __name__ == "__main__":
    sys.exit(main())
