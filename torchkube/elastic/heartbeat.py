"""A worker's heartbeat: the last step it finished, for the launcher's hang watchdog.

The training loop calls :meth:`Heartbeat.beat` after every optimizer step. That call only
stores two numbers and appends the step's duration to a short window — no I/O, no
collective, nothing on the hot path. A daemon thread writes them once a second to
``$TORCHKUBE_HEARTBEAT_DIR/local-<LOCAL_RANK>.json`` (pod-local, atomically), with the time it
wrote them: a step count that stops moving says the worker stopped training; a write time that
stops moving says the whole process stopped (SIGSTOP, a wedged driver call holding the
interpreter). The launcher (``torchkube.elastic.watchdog``) reads those files.

The heartbeat also registers :mod:`faulthandler` on ``SIGUSR1``, and its file lists the
worker's Python threads: the launcher sends the signal to each thread of a hung worker, one at
a time, and each writes its own Python stack — from a C signal handler that needs neither the
main thread nor the interpreter lock — into ``stacks-<LOCAL_RANK>.txt``. Not faulthandler's
all-threads dump: it reads the other threads' frames while they run, and a thread ending
meanwhile crashes the worker half-way through its stacks.

A phase between steps that may outlast the hang timeout — an evaluation, a checkpoint save —
runs inside :meth:`Heartbeat.pausing`: the watchdog then allows it the collective timeout (a
collective inside it gives up then anyway) instead of the hang timeout — the one the heartbeat
was given (``collective_timeout_seconds``); without it, a pause gets the hang timeout too.

:meth:`Heartbeat.training` marks where the loop begins. Before it (rendezvous, a checkpoint's
load) start-up has timeouts of its own and the watchdog leaves the worker alone; from it the
first step is judged like a pause — it may compile for minutes, so waiting is allowed the
collective timeout — except that a worker stopped by a signal is a hang at the plain timeout.

Any training script can use it (the built-in trainer does)::

    heartbeat = Heartbeat.from_env()
    heartbeat.training()
    for step in ...:
        train_step()
        heartbeat.beat(step)
        with heartbeat.pausing("checkpoint"):
            save()

Without ``TORCHKUBE_HEARTBEAT_DIR`` (not under torchkube's launcher) it writes no file and
needs no thread.

The first beat of local rank 0 also tells the operator that the pod's workers committed a
step: the ``COMMITTED_STEP`` line of the pod's termination message
(:func:`torchkube.elastic.termination.mark_committed`), whether or not the watchdog is on. A
loop that calls :meth:`Heartbeat.beat` only for steps it committed (a live-recovery step whose
commit vote failed is not one) says so at its first. No torch.
"""

import contextlib
import faulthandler
import json
import os
import signal
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from torchkube.api.contract import Env
from torchkube.elastic import termination

BEAT_SECONDS = 1.0
"""How often the heartbeat thread writes the file."""
STEP_WINDOW = 64
"""Step durations the median step time is taken over."""
STACK_SIGNAL = signal.SIGUSR1
FIRST_STEP = "first step"
"""What a worker that began training but finished no step yet is doing, in its file."""


def beat_file(folder: Path, local_rank: int) -> Path:
    return folder / f"local-{local_rank}.json"


def stack_file(folder: Path, local_rank: int) -> Path:
    return folder / f"stacks-{local_rank}.txt"


@dataclass(frozen=True)
class Beat:
    """One worker's heartbeat as its file holds it (times are Unix seconds)."""

    rank: int
    local_rank: int
    pid: int
    started: float
    """When the heartbeat began (the worker's start, for a worker that has not stepped)."""
    written: float
    """When the heartbeat thread last wrote: it stops when the whole process stops."""
    step: int | None = None
    """The last step the worker finished; None before its first."""
    stepped: float | None = None
    """When it finished that step."""
    median_step_seconds: float | None = None
    collective_timeout_seconds: float | None = None
    paused: str | None = None
    """What the worker does between two steps that may outlast the hang timeout, if anything."""
    threads: tuple[tuple[int, str], ...] = ()
    """The worker's Python threads at the last write: native id (the main thread's is the
    pid) and name. A thread started since is not asked for its stack."""

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> "Beat":
        fields: dict[str, Any] = json.loads(text)
        fields["threads"] = tuple((int(i), str(n)) for i, n in fields.get("threads") or ())
        return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})


def python_threads() -> tuple[tuple[int, str], ...]:
    """This process's Python threads (native id, name), the ones the launcher asks for stacks."""
    return tuple(
        (thread.native_id, thread.name)
        for thread in threading.enumerate()
        if thread.native_id is not None
    )


class Heartbeat:
    """The worker side: :meth:`beat` per step, a thread that writes, a stack dump on demand.
    Without a folder it writes no file (no launcher asked for it)."""

    def __init__(
        self,
        folder: Path | None,
        rank: int = 0,
        local_rank: int = 0,
        collective_timeout_seconds: float | None = None,
        says_committed: bool = False,
    ) -> None:
        self.folder = folder
        self.rank, self.local_rank = rank, local_rank
        self.collective_timeout_seconds = collective_timeout_seconds
        self.says_committed = says_committed
        """Whether the first beat goes into the pod's termination message (local rank 0)."""
        self._started = time.time()
        self._step: int | None = None
        self._stepped: float | None = None
        self._paused: str | None = None
        self._durations: deque[float] = deque(maxlen=STEP_WINDOW)
        self._stop = threading.Event()
        self._writing = threading.Lock()
        self._stacks: IO[str] | None = None
        self._thread: threading.Thread | None = None
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        self._stacks = stack_file(folder, local_rank).open("w")
        faulthandler.register(STACK_SIGNAL, file=self._stacks, all_threads=False)
        self._write()
        self._thread = threading.Thread(target=self._run, name="torchkube-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, collective_timeout_seconds: float | None = None) -> "Heartbeat":
        """The heartbeat the launcher asked for (``TORCHKUBE_HEARTBEAT_DIR``); without it, one
        that writes no file. Local rank 0's says the first step in the termination message."""
        folder = os.environ.get(Env.HEARTBEAT_DIR)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return cls(
            Path(folder) if folder else None,
            int(os.environ.get("RANK", "0")),
            local_rank,
            collective_timeout_seconds,
            says_committed=local_rank == 0,
        )

    def training(self) -> None:
        """The training loop begins: from now a worker that finishes no step is judged (see
        the module docstring). Written at once: a worker stopped before the thread's next
        write would otherwise look like one still starting."""
        self._stepped, self._paused = time.time(), FIRST_STEP
        self._write()

    def beat(self, step: int) -> None:
        """Step ``step`` is finished. Cheap enough for every step: two assignments, and one
        write at the first step: until the file shows a step, the watchdog takes the worker
        for one still starting, and a worker stopped before the thread's next write (a hang
        in its first second of training) was never judged. The first step's time (a compile,
        a cold cache) is not a step time the hang timeout should follow. Local rank 0's first
        beat also writes the termination message's ``COMMITTED_STEP`` line (module docstring)."""
        now = time.time()
        first = self._step is None
        if not first and self._stepped is not None:
            self._durations.append(now - self._stepped)
        self._step, self._stepped = step, now
        if first:
            if self._paused == FIRST_STEP:
                self._paused = None
            self._write()
            if self.says_committed:
                termination.mark_committed(step)

    @contextlib.contextmanager
    def pausing(self, what: str) -> Iterator[None]:
        """A phase between steps that may take longer than the hang timeout (``what``: an
        evaluation, a checkpoint): judged against the collective timeout instead. The time
        since the last step starts again after it: the phase is not a slow step. A pause
        inside the first step (live recovery's quorum) leaves the first step's allowance on."""
        before, self._paused = self._paused, what
        try:
            yield
        finally:
            self._paused = before
            if self._stepped is not None:
                self._stepped = time.time()

    def snapshot(self) -> Beat:
        durations = list(self._durations)
        return Beat(
            rank=self.rank,
            local_rank=self.local_rank,
            pid=os.getpid(),
            started=self._started,
            written=time.time(),
            step=self._step,
            stepped=self._stepped,
            median_step_seconds=statistics.median(durations) if durations else None,
            collective_timeout_seconds=self.collective_timeout_seconds,
            paused=self._paused,
            threads=python_threads(),
        )

    def _write(self) -> None:
        if self.folder is None:
            return
        path = beat_file(self.folder, self.local_rank)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        # The thread and the first beat share the temporary file.
        with self._writing, contextlib.suppress(OSError):  # a full disk must not stop training
            tmp.write_text(self.snapshot().to_json())
            os.replace(tmp, path)

    def _run(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            self._write()

    def close(self) -> None:
        """Stop beating (the launcher then ignores this worker's file: its pid is gone)."""
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join(timeout=2 * BEAT_SECONDS)
        faulthandler.unregister(STACK_SIGNAL)
        if self._stacks is not None:
            self._stacks.close()
            self._stacks = None


def read_beats(folder: Path) -> list[Beat]:
    """The heartbeats in ``folder`` whose process is still alive (a restarted worker's old
    file names a pid that is gone until the new one writes)."""
    beats = []
    for path in sorted(folder.glob("local-*.json")):
        try:
            found = Beat.from_json(path.read_text())
        except (OSError, ValueError, TypeError):
            continue
        if _alive(found.pid):
            beats.append(found)
    return beats


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = process_state(pid)
    return state is not None and state != "Z"


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process's main thread (R, S, D, T, Z, ...)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]
