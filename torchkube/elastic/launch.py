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
  ``--max-restarts`` times, exits with ``ExitCode.CONFIG_ERROR`` (3) and puts the line in the
  container's termination message, which ``kubectl describe`` and the job status show.

* **Re-joins that work.** torchrun (2.15) caches the worker store address of the first
  round when agents share their TCP store, so after a scale-down the next agent to join waits
  forever for an address nobody publishes. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` makes
  every round publish its own; the launcher sets it unless the caller chose otherwise.
* **A lost store costs one re-rendezvous, not the pod.** When the rendezvous store goes away
  (its pod restarted, its node lost), torchrun's agent fails: its TCPStore client never
  reconnects. The launcher then stops the workers (they write their emergency checkpoint, as
  on any SIGTERM) and runs a new agent with a new connection, which waits for the store to be
  back and re-joins; every agent does the same, so the job resumes as one new round. Only if
  the store stays away for a whole ``join_timeout`` does the launcher exit, with
  ``ExitCode.RENDEZVOUS_LOST`` (75), which the operator counts as an infrastructure failure.

Run: ``python -m torchkube.elastic.launch [torchrun arguments] script-or--m-module [args]``.
"""

import contextlib
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from torchkube.api.contract import TERMINATION_LOG, Env, ExitCode

POLL_SECONDS = 0.2
REJOIN_DELAY_SECONDS = 1.0
DEFAULT_JOIN_TIMEOUT = 600.0
HEALTHY_RUN_SECONDS = 60.0
"""An agent that ran this long before losing the store starts a fresh retry budget."""


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


def _rendezvous_lost(error: BaseException) -> str | None:
    """Why the agent lost its rendezvous (the store connection failed, the join timed out),
    or None for any other error."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RendezvousConnectionError):
            return "the rendezvous store is unreachable"
        if isinstance(current, RendezvousTimeoutError):
            return "the rendezvous timed out"
        current = current.__cause__ or current.__context__
    return None


def _lose_a_forgetful_store() -> None:
    """Make torchrun notice a store that restarted *quickly*, before anyone noticed it was
    gone. Its TCPStore client reconnects by itself, but the new store holds no rendezvous:
    torch then blocks a whole read timeout in ``get`` and, worse, lets an agent that joins
    meanwhile form a round of its own beside the running one (two trainings, one checkpoint
    folder). Once an agent has seen the rendezvous state, a store without it is a lost store:
    the launcher re-joins every agent through it as one new round."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    backend = c10d.C10dRendezvousBackend
    if getattr(backend, "_torchkube_patched", False):
        return
    original = backend.get_state

    def get_state(self: Any) -> Any:
        if getattr(self, "_torchkube_had_state", False) and not self._call_store(
            "check", [self._key]
        ):
            raise RendezvousConnectionError(
                "the rendezvous store restarted and no longer holds the rendezvous"
            )
        result = original(self)
        if result is not None:
            self._torchkube_had_state = True
        return result

    backend.get_state = get_state  # type: ignore[method-assign]
    backend._torchkube_patched = True  # type: ignore[attr-defined]


def _option(argv: list[str], name: str) -> str | None:
    """The value of torchrun's ``--name=value`` (either spelling of the name)."""
    for arg in argv:
        for spelling in (name, name.replace("-", "_")):
            if arg.startswith(f"--{spelling}="):
                return arg.split("=", 1)[1]
    return None


def _join_timeout(argv: list[str]) -> float:
    """``join_timeout`` from ``--rdzv-conf``: how long the store may stay away."""
    for item in (_option(argv, "rdzv-conf") or "").split(","):
        key, _, value = item.partition("=")
        if key.strip() == "join_timeout" and value.strip():
            return float(value)
    return DEFAULT_JOIN_TIMEOUT


def _store_reachable(endpoint: str) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def _wait_for_store(endpoint: str | None, until: float) -> bool:
    """Wait until the store accepts connections again (a restarted container, a new pod
    behind the same name); False when ``until`` passed first. torch's own client would
    block a whole read timeout per attempt."""
    while time.monotonic() < until:
        if endpoint is None or _store_reachable(endpoint):
            return True
        time.sleep(REJOIN_DELAY_SECONDS)
    return False


def _log(message: str) -> None:
    print(f"torchkube: {message}", file=sys.stderr, flush=True)


def _report(message: str) -> None:
    print(f"torchkube: {message}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):  # not in a pod: stderr is enough
        TERMINATION_LOG.write_text(message[-4096:])


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.run import parse_args, run

    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    marker = Path(tempfile.mkdtemp(prefix="torchkube-")) / "permanent-error"
    os.environ[Env.PERMANENT_ERROR_FILE] = str(marker)
    done = threading.Event()
    threading.Thread(target=_watch, args=(marker, done), daemon=True).start()
    args = sys.argv[1:] if argv is None else argv
    budget = _join_timeout(args)
    _lose_a_forgetful_store()
    lost_since: float | None = None
    try:
        while True:
            started = time.monotonic()
            try:
                run(parse_args(args))
                return 0
            except BaseException as error:  # torchrun signals failures with several types
                if isinstance(error, KeyboardInterrupt | SystemExit) and not marker.exists():
                    raise
                if marker.exists():
                    _report(f"permanent error, not retrying: {marker.read_text().strip()}")
                    return ExitCode.CONFIG_ERROR
                why = _rendezvous_lost(error)
                if why is None:
                    code = _exit_code(error)
                    _report(f"workers failed with exit code {code}: {error}")
                    return code
                now = time.monotonic()
                if lost_since is None or now - started > HEALTHY_RUN_SECONDS:
                    lost_since = now
                _log(f"{why}; re-joining through a new connection to the store")
                if not _wait_for_store(_option(args, "rdzv-endpoint"), lost_since + budget):
                    _report(
                        f"{why} for {time.monotonic() - lost_since:.0f}s "
                        f"(join_timeout {budget:.0f}s); giving up"
                    )
                    return ExitCode.RENDEZVOUS_LOST
    finally:
        done.set()


if __name__ == "__main__":
    sys.exit(main())
