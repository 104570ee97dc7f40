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
* **A signal ends the pod's launcher, always.** Deleted, preempted or suspended, a pod is
  sent SIGTERM, often a moment after its store pod went: the launcher stops its workers (their
  emergency checkpoint), leaves the rendezvous and exits ``128+N``, even when the signal came
  while it stopped them for the lost store or waited for the store to come back. It never
  re-joins, so a Terminating pod cannot train in the round a new store serves; and it exits
  only once its workers have (or the shutdown timeout has passed): a signal ends torchrun's
  wait for them, and the launcher's exit ends the pod's every process.
* **A join timeout is said as one.** When the store answers but fewer than ``--nnodes`` min
  agents came within ``join_timeout`` (the other pods still pulling their image, their node
  still being provisioned), the launcher exits with ``ExitCode.JOIN_TIMEOUT`` (76) and
  ``JOIN_TIMED_OUT`` in the termination message, leaving the rendezvous open: the operator
  refills the slot, free, and says which pods the job waits for.
* **A hung worker is found, shown and stopped.** Workers beat once per step into
  ``$TORCHKUBE_HEARTBEAT_DIR`` (``torchkube.elastic.heartbeat``); the watchdog thread
  (``torchkube.elastic.watchdog``) finds a worker that finished no step for the hang timeout,
  prints the Python stacks of all its threads, stops the pod's workers and exits with
  ``ExitCode.HUNG`` and the stuck ranks in the termination message.
* **Every in-place restart reaches the operator.** When torchrun restarts the workers after
  a failure, the launcher posts an ``InPlaceRestart`` to the rendezvous store
  (``torchkube.elastic.restarts``); the trainers serve the job's in ``/progress`` and the
  operator counts each like a pod failure. The record says whether the failed round had
  committed a step (the termination message's ``COMMITTED_STEP`` line, which it takes out
  for the next round: ``torchkube.elastic.termination``), as the pod's own termination
  message does when the pod fails: under live recovery a group lost again before committing
  one spends ``maxRestarts``.
* **Warm workers** (``torchkube.elastic.warm``): each round's workers are forked from a
  server that imported torch once, instead of starting fresh interpreters.
* **Spares and stopped agents** (``torchkube.elastic.torchrun``): a spare released when
  training ends exits 0 with ``STANDBY_RELEASED``; an agent stopped by a signal or a hang
  leaves the rendezvous at once, so the next round (with a spare in it) forms without
  waiting for its keep-alive to expire.

Run: ``python -m torchkube.elastic.launch [torchrun arguments] script-or--m-module [args]``.
"""

import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from torchkube.api.contract import (
    JOIN_TIMED_OUT,
    STANDBY_RELEASED,
    Env,
    ExitCode,
    InPlaceRestart,
)
from torchkube.api.hang import parse_configured
from torchkube.api.times import rfc3339
from torchkube.elastic import termination, torchrun, warm
from torchkube.elastic.restarts import RestartBoard, board_id
from torchkube.elastic.say import PREFIX, say
from torchkube.elastic.watchdog import Board, Watchdog
from torchkube.process_exit import exit_process

POLL_SECONDS = 0.2
REJOIN_DELAY_SECONDS = 1.0
DEFAULT_JOIN_TIMEOUT = 600.0
MESSAGE_TAIL = 1024
"""Characters of a failed worker's error kept in its in-place restart record."""
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
        return _signal_code(int(failures[min(failures)].exitcode))
    return 1


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the errors it was raised from or while handling, each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _signal_of(error: BaseException) -> int | None:
    """The signal that stopped torchrun, if one did, wherever it landed: torch raises it in
    the agent's loop, or while it shuts the workers down after another error (a lost store),
    which buries it under that error's context."""
    signals = (getattr(e, "sigval", None) for e in _chain(error))
    return next((int(signum) for signum in signals if signum is not None), None)


def _terminated(signum: int, error: BaseException) -> int:
    torchrun.finish_stopping_workers()
    torchrun.leave()  # deleted or preempted: the others need not wait for its keep-alive
    _report(f"stopped by signal {signum}: {error}")
    return 128 + signum


def _rendezvous_lost(error: BaseException) -> str | None:
    """Why the agent lost its rendezvous (the store connection failed, the join timed out),
    or None for any other error."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    for current in _chain(error):
        if isinstance(current, RendezvousConnectionError):
            return "the rendezvous store is unreachable"
        if isinstance(current, RendezvousTimeoutError):
            return "the rendezvous timed out"
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


def _store_reachable_now(args: list[str]) -> bool:
    endpoint = _option(args, "rdzv-endpoint")
    return endpoint is None or _store_reachable(endpoint)


def _join_timeout_message(timed_out: torchrun.JoinTimedOut) -> str:
    """The termination message of a join timeout: what the operator shows in the job's
    status and event, and what the user has to look at (the pods that did not start)."""
    return (
        f"{JOIN_TIMED_OUT} {timed_out.agents} of at least {timed_out.minimum} agents came "
        f"within join_timeout {timed_out.seconds:.0f}s; the others' pods did not start in "
        "time (image pull, node provisioning, quota: see the job's WaitingForWorkers "
        "condition). Leaving the rendezvous open for them"
    )


def _announce_warmth() -> None:
    """Create ``$TORCHKUBE_WARM_FILE`` once a worker can start without importing torch (at
    once with warm workers off): the pod's startup probe, and so the operator's count of warm
    spares, waits for it."""
    path = os.environ.get(Env.WARM_FILE)

    def warmed(seconds: float | None, error: BaseException | None = None) -> None:
        if error is not None:
            say(f"the worker server failed after {seconds:.1f}s ({error}): workers will fail")
        elif seconds is not None:
            say(f"workers start warm: their server imported torch in {seconds:.1f}s")
        if not path:
            return
        try:
            Path(path).touch()
        except OSError as error:
            say(f"cannot create {path} ({error}): the pod's startup probe will not pass")

    if warm.enabled():
        warm.when_ready(warmed)
    else:
        warmed(None)


def _report(message: str) -> None:
    """One line on stderr and the container's termination message (``torchkube run`` points
    ``TORCHKUBE_TERMINATION_LOG`` at a file of its own), above its committed-step line."""
    line = message if message.startswith(PREFIX) else f"{PREFIX}{message}"
    print(line, file=sys.stderr, flush=True)
    termination.write(message)


def _start_watchdog(folder: Path, args: list[str], hang_marker: Path) -> Watchdog | None:
    """Heartbeats and the hang watchdog, unless ``failurePolicy.hangTimeoutSeconds`` is 0."""
    configured = parse_configured(os.environ.get(Env.HANG_TIMEOUT_SECONDS))
    if configured is not None and configured <= 0:
        return None
    os.environ[Env.HEARTBEAT_DIR] = str(folder / "heartbeats")

    def hung(report: str) -> None:
        hang_marker.write_text(report)
        os.kill(os.getpid(), signal.SIGTERM)  # stop torchrun as on a pod deletion

    board = Board(_option(args, "rdzv-endpoint"), _option(args, "rdzv-id") or "none")
    where = os.environ.get(Env.POD_NAME) or socket.gethostname()
    return Watchdog(
        folder / "heartbeats", configured, board, where, hung, say, torchrun.healthy_workers
    ).start()


def _report_in_place_restarts(args: list[str]) -> None:
    """Post each in-place restart of the workers to the rendezvous store, for the operator
    (``torchkube.elastic.restarts``), and tell the workers where to read the job's."""
    endpoint = _option(args, "rdzv-endpoint")
    if endpoint:
        os.environ[Env.RENDEZVOUS_ENDPOINT] = endpoint
    board = RestartBoard(endpoint, board_id(_option(args, "rdzv-id")) or "none")
    pod = os.environ.get(Env.POD_NAME) or socket.gethostname()

    def restarted(count: int, failures: Any) -> None:
        first = failures[min(failures)] if failures else None
        code = None if first is None else _signal_code(int(first.exitcode))
        message = "" if first is None else str(first.message or "")
        committed = termination.take_committed()
        record = InPlaceRestart(
            pod=pod,
            node=os.environ.get(Env.NODE_NAME),
            restart=count,
            exit_code=code,
            message=message[-MESSAGE_TAIL:],
            time=rfc3339(time.time()),
            committed_step=committed,
        )
        posted = board.post(record)
        since = "no step committed" if committed is None else f"committed from step {committed}"
        say(
            f"a worker failed with exit code {code}: restarting the workers in place "
            f"(restart {count}, {since}; "
            f"{'reported to' if posted else 'store away, not reported to'} the operator)"
        )

    torchrun.on_failure_restart(restarted)


def _signal_code(code: int) -> int:
    """A worker's exit code as a shell shows it: a signal ``N`` (negative) is ``128+N``."""
    return 128 - code if code < 0 else code


def _ended(error: BaseException, markers: tuple[Path, Path]) -> int | None:
    """The launcher's exit code when torchrun ended for a reason it knows, else None."""
    permanent, hang = markers
    if permanent.exists():
        _report(f"permanent error, not retrying: {permanent.read_text().strip()}")
        return ExitCode.CONFIG_ERROR
    if hang.exists():
        torchrun.leave()
        _report(hang.read_text())
        return ExitCode.HUNG
    if _caused_by(error, torchrun.StandbyReleased):
        say("the rendezvous closed while this spare stood by: training is over")
        _report(STANDBY_RELEASED)
        return ExitCode.OK
    return None


def _caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    return any(isinstance(current, kind) for current in _chain(error))


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing import SignalException

    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    termination.take_committed()  # a new launcher's workers have committed nothing yet
    folder = Path(tempfile.mkdtemp(prefix="torchkube-"))
    marker, hang_marker = folder / "permanent-error", folder / "hang"
    os.environ[Env.PERMANENT_ERROR_FILE] = str(marker)
    done = threading.Event()
    threading.Thread(target=_watch, args=(marker, done), daemon=True).start()
    args = sys.argv[1:] if argv is None else argv
    watchdog = _start_watchdog(folder, args, hang_marker)
    budget = _join_timeout(args)
    _lose_a_forgetful_store()
    torchrun.track()
    torchrun.report_failures_lightly()
    _report_in_place_restarts(args)
    if warm.enabled():
        warm.patch_torchrun()
        warm.start(args)
    _announce_warmth()
    try:
        return _run_rounds(args, (marker, hang_marker), budget)
    except SignalException as error:  # it came between two rounds, waiting for the store
        return _terminated(int(error.sigval), error)
    finally:
        done.set()
        if watchdog is not None:
            watchdog.stop()


def _run_rounds(args: list[str], markers: tuple[Path, Path], budget: float) -> int:
    """torchrun, run again through a new store connection after each store loss, until it
    ends for a reason of its own."""
    from torch.distributed.run import parse_args, run

    lost_since: float | None = None
    while True:
        started = time.monotonic()
        try:
            run(parse_args(args))
            return 0
        except BaseException as error:  # torchrun signals failures with several types
            ended = _ended(error, markers)
            if ended is not None:
                return ended
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
            signum = _signal_of(error)
            if signum is not None:
                return _terminated(signum, error)
            why = _rendezvous_lost(error)
            if why is None:
                code = _exit_code(error)
                _report(f"workers failed with exit code {code}: {error}")
                return code
            timed_out = torchrun.timed_out()
            if timed_out is not None and _store_reachable_now(args):
                _report(_join_timeout_message(timed_out))
                return ExitCode.JOIN_TIMEOUT
            now = time.monotonic()
            if lost_since is None or now - started > HEALTHY_RUN_SECONDS:
                lost_since = now
            say(f"{why}; re-joining through a new connection to the store")
            if not _wait_for_store(_option(args, "rdzv-endpoint"), lost_since + budget):
                _report(
                    f"{why} for {time.monotonic() - lost_since:.0f}s "
                    f"(join_timeout {budget:.0f}s); giving up"
                )
                return ExitCode.RENDEZVOUS_LOST


def exit_with(code: int) -> NoReturn:
    """End the launcher with ``code``: no exit hooks (multiprocessing's would wait for workers
    an error left behind), no finalisation (:mod:`torchkube.process_exit`)."""
    exit_process(code, flush_logs=True)


if __name__ == "__main__":
    exit_with(main())
