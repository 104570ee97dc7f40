"""The launcher's hang watchdog: a worker that finishes no step is found, shown and stopped.

A hung worker keeps its pod Running while every other rank waits for it in a collective —
until NCCL's watchdog gives up (10 minutes by default), or for ever on gloo. Each launcher
reads its own workers' heartbeats (``torchkube.elastic.heartbeat``) once a second; when none of
them finished a step for the hang timeout (``torchkube.api.hang``) it looks for the cause:

Between two steps, an evaluation or a checkpoint save that says so (``Heartbeat.pausing``) is
allowed the collective timeout instead: a slow save is not a hang. So is the first step after
the loop begins (``Heartbeat.training``; a compile), but a worker stopped by a signal is a
hang at the plain timeout wherever it stopped.

* **A stopped worker** — its heartbeat thread stopped writing, or its main thread is stopped
  (``T``, e.g. SIGSTOP) or in uninterruptible sleep (``D``, a dead NFS mount): this pod is the
  culprit. The launcher gets the Python stacks of every thread of the stuck workers
  (``SIGUSR1`` to each thread's faulthandler in turn, ``SIGCONT`` so a stopped one can
  answer) and prints them
  to the pod's log, kills its workers, tells the other pods through the rendezvous store, and
  exits with ``ExitCode.HUNG``; the termination message names the ranks, so the job's status
  records a ``Hang`` failure with them and the operator replaces the pod.
* **Workers that only wait** — a peer elsewhere is the culprit: when its launcher's
  declaration appears in the store, this launcher kills its own stuck workers, so torchrun
  restarts them into the next round at once instead of after the collective timeout. If no
  declaration comes ``PEER_GRACE_SECONDS`` after the timeout, no process is stopped anywhere
  (a collective nobody finishes, a deadlock): the first launcher to declare it is the one
  that exits ``HUNG``, with its stacks; the others restart in place, stacks in their logs too.

The store is read only while this pod's workers are stuck, so healthy training costs it
nothing. Without the store (it is being replaced) a launcher decides from its own workers.
"""

import contextlib
import ctypes
import errno
import json
import os
import platform
import signal
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkube.api.contract import HANG_REPORT
from torchkube.api.hang import hang_timeout
from torchkube.elastic.heartbeat import STACK_SIGNAL, Beat, process_state, read_beats, stack_file
from torchkube.elastic.store_link import StoreLink

POLL_SECONDS = 1.0
FROZEN_SECONDS = 10.0
"""A heartbeat thread silent this long means its whole process stopped."""
STOPPED_STATES = frozenset({"T", "t", "D"})
"""Main-thread states of a worker that cannot finish its step by itself: stopped (SIGSTOP,
a debugger) or uninterruptible sleep (a dead network mount)."""
SIGNAL_STOPPED_STATES = frozenset({"T", "t"})
"""The stopped states no checkpoint or evaluation explains: a save may sleep in ``D`` on its
disk, or hold the GIL so that the heartbeat thread is silent, but it never stops itself."""
PEER_GRACE_SECONDS = 15.0
"""How long past the timeout waiting workers give a culprit elsewhere to be found."""
STUCK_SECONDS = 5.0
"""Workers without a step this long (and past three step times) ask the store whether a peer
declared a hang."""
DUMP_WAIT_SECONDS = 3.0
"""How long to wait for one thread's stack (one in a ``D`` state may never answer)."""
DUMP_QUIET_SECONDS = 0.1
"""A thread whose stack stopped growing this long (at a line's end) finished writing it."""
DUMP_POLL_SECONDS = 0.01
MAIN_THREAD = "Main thread"
"""How a dump names each worker's main thread, the one the termination message quotes."""
DUMP_BUDGET_SECONDS = 10.0
"""No thread of a process is asked after this long: its hang must still be acted on."""
STACK_HEADER = "Stack (most recent call first):\n"
"""faulthandler's first line of each thread's answer."""
NO_ANSWER = "(no answer: the thread did not run its signal handler)"
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC_TGKILL = getattr(_LIBC, "tgkill", None)
_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
MESSAGE_FRAMES = 4
"""Innermost frames of a culprit's main thread in the termination message."""


@dataclass(frozen=True)
class Verdict:
    """What the watchdog found: this pod's workers finished no step for ``idle`` seconds."""

    idle: float
    timeout: float
    stuck: tuple[Beat, ...]
    """The workers that are stopped (culprits) or, when none is, all of this pod's workers."""
    stopped: bool
    """Whether ``stuck`` are stopped processes (else they only wait)."""


def judge(
    beats: Sequence[Beat],
    now: float,
    configured: float | None,
    states: Callable[[int], str | None] = process_state,
) -> Verdict | None:
    """This pod's verdict from its workers' heartbeats; None while they step, or before the
    training loop begins (``Heartbeat.training``: start-up has timeouts of its own). The first
    step is judged like a pause (its own times are not known; it may compile), except for a
    worker stopped by a signal."""
    stepping = [b for b in beats if b.stepped is not None]
    if not stepping:
        return None
    idle = now - max(b.stepped or 0.0 for b in stepping)
    medians = [b.median_step_seconds for b in stepping if b.median_step_seconds]
    limits = [b.collective_timeout_seconds for b in stepping if b.collective_timeout_seconds]
    collective = min(limits) if limits else None
    timeout = hang_timeout(configured, statistics.median(medians) if medians else None, collective)
    if timeout is None:
        return None
    signalled = tuple(b for b in beats if states(b.pid) in SIGNAL_STOPPED_STATES)
    if signalled and idle >= timeout:  # stopped, even in the middle of a save: the culprit
        return Verdict(idle, timeout, signalled, True)
    if collective and any(b.paused for b in stepping):
        timeout = max(timeout, collective)  # a checkpoint or evaluation: its collectives decide
    if idle < timeout:
        return None
    stopped = tuple(
        b for b in beats if now - b.written > FROZEN_SECONDS or states(b.pid) in STOPPED_STATES
    )
    if stopped:
        return Verdict(idle, timeout, stopped, True)
    return Verdict(idle, timeout, tuple(beats), False)


def stuck_for(beats: Sequence[Beat], now: float) -> float:
    """Seconds since this pod's workers last finished a step, or began training (0 before)."""
    times = [b.stepped for b in beats if b.stepped is not None]
    return now - max(times) if times else 0.0


def looks_stuck(beats: Sequence[Beat], now: float) -> bool:
    """Long enough without a step to ask the store whether a peer hung."""
    medians = [b.median_step_seconds for b in beats if b.median_step_seconds]
    pace = 3 * statistics.median(medians) if medians else 0.0
    return stuck_for(beats, now) > max(STUCK_SECONDS, pace)


@dataclass(frozen=True)
class Declaration:
    """A hang one launcher announced to the others through the rendezvous store."""

    at: float
    where: str
    ranks: tuple[int, ...]
    stopped: bool

    def to_json(self) -> str:
        return json.dumps(
            {"at": self.at, "where": self.where, "ranks": self.ranks, "stopped": self.stopped}
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> "Declaration | None":
        try:
            data = json.loads(raw)
            return cls(float(data["at"]), str(data["where"]), tuple(data["ranks"]), data["stopped"])
        except (ValueError, KeyError, TypeError):
            return None


class Board:
    """Hang declarations in the job's rendezvous store (one key per job). Every call is best
    effort: a store that is away answers nothing and stores nothing."""

    def __init__(self, endpoint: str | None, run_id: str, timeout: float = 5.0) -> None:
        self.key = f"torchkube/hang/{run_id}"
        self._link = StoreLink(endpoint, timeout)

    def read(self) -> Declaration | None:
        """The declaration posted, None without one or a store (then decide alone)."""

        def read(store: Any) -> Declaration | None:
            return Declaration.from_json(store.get(self.key)) if store.check([self.key]) else None

        return self._link.call(read, None)

    def claim(self, declaration: Declaration, older_than: float) -> bool:
        """Post ``declaration`` unless another one newer than ``older_than`` is there;
        True when ours is the one posted (without a store: True, we decide alone)."""

        def claim(store: Any) -> bool:
            current = store.get(self.key).decode() if store.check([self.key]) else ""
            found = Declaration.from_json(current) if current else None
            if found is not None and found.at >= older_than:
                return False
            posted = store.compare_set(self.key, current, declaration.to_json())
            return bool(posted.decode() == declaration.to_json())

        return self._link.call(claim, True)


def dump_stacks(folder: Path, beats: Sequence[Beat], wait: float = DUMP_WAIT_SECONDS) -> str:
    """The Python stacks of every thread of ``beats``' processes, each written by the thread
    itself (see ``torchkube.elastic.heartbeat``).

    The threads of one process are asked one at a time (their handlers share one file, and
    faulthandler ignores a second thread's signal while the first writes); the processes at
    once. A stopped process is continued so that its handlers can run, and stopped again once
    its threads answered (it is killed right after: it must not train on with the others
    meanwhile). A thread in uninterruptible sleep answers only when the sleep ends, maybe
    never: each thread is given ``wait`` seconds, a process's threads
    ``DUMP_BUDGET_SECONDS`` in all, and the main thread, the one a dead mount holds, is
    asked last."""
    askings = [_Asking(folder, beat) for beat in beats]
    for asking in askings:
        with contextlib.suppress(ProcessLookupError):
            os.kill(asking.beat.pid, signal.SIGCONT)
    while not all(asking.done for asking in askings):
        for asking in askings:
            asking.poll(time.monotonic(), wait)
        time.sleep(DUMP_POLL_SECONDS)
    for asking in askings:
        with contextlib.suppress(ProcessLookupError):
            os.kill(asking.beat.pid, signal.SIGSTOP)
    return "\n".join(asking.text() for asking in askings)


class _Asking:
    """One process's threads asked for their stacks in turn: the next is asked once the last
    one's text stopped growing at a line's end, or ``wait`` passed; none after the process's
    ``DUMP_BUDGET_SECONDS``."""

    def __init__(self, folder: Path, beat: Beat) -> None:
        self.beat = beat
        self.path = stack_file(folder, beat.local_rank)
        others = [(tid, name) for tid, name in beat.threads if tid != beat.pid]
        self.queue = [*others, (beat.pid, "main")]
        self.stacks: dict[int, str] = {}
        self.current: tuple[int, str] | None = None
        self.previous: int | None = None
        self.asked_again: set[int] = set()
        self.began: float | None = None
        self.asked_at = self.changed_at = 0.0
        self.offset = 0
        self.seen = ""

    @property
    def done(self) -> bool:
        return self.current is None and not self.queue

    def poll(self, now: float, wait: float) -> None:
        self.began = now if self.began is None else self.began
        if self.current is None:
            if self.queue and now - self.began >= DUMP_BUDGET_SECONDS:
                self.queue.clear()  # the rest stay unasked: the hang must be acted on
            elif self.queue:
                self._ask(self.queue.pop(0), now)
            return
        text = self._read()
        if text != self.seen:
            self.seen, self.changed_at = text, now
        if text and text.endswith("\n") and now - self.changed_at >= DUMP_QUIET_SECONDS:
            self._answered(text)
        elif not text and not _thread_alive(self.beat.pid, self.current[0]):
            self._settled("")  # it ended before it could answer
        elif now - self.asked_at >= wait and text:
            self._answered(text)
        elif now - self.asked_at >= wait:
            self._settled(NO_ANSWER)

    def text(self) -> str:
        """``--- rank …`` then the main thread, then the others, as the worker listed them."""
        beat = self.beat
        title = f"--- rank {beat.rank} (local rank {beat.local_rank}, pid {beat.pid})"
        blocks = [f"{MAIN_THREAD} {beat.pid}:\n{self.stacks.get(beat.pid, NO_ANSWER).rstrip()}"]
        blocks += [
            f"Thread {tid} ({name}):\n{self.stacks[tid].rstrip()}"
            for tid, name in beat.threads
            if tid != beat.pid and self.stacks.get(tid)
        ]
        return "\n".join([title, "\n\n".join(blocks)])

    def _ask(self, thread: tuple[int, str], now: float) -> None:
        self.current, self.asked_at, self.changed_at, self.seen = thread, now, now, ""
        try:
            self.offset = self.path.stat().st_size
            asked = signal_thread(self.beat.pid, thread[0], STACK_SIGNAL)
        except OSError as error:
            self._settled(f"(not asked: {error})")
            return
        if not asked:
            self._settled("")  # gone

    def _answered(self, text: str) -> None:
        """``text`` is the asked thread's stack, unless the thread before was still writing
        (its signal is ignored meanwhile): what comes before this thread's header is the
        previous one's rest, and a thread that wrote nothing of its own is asked once more."""
        assert self.current is not None
        if not text.startswith(STACK_HEADER) and self.previous in self.stacks:
            rest, header, own = text.partition(STACK_HEADER)
            self.stacks[self.previous] += rest
            text = header + own
            if not header and self.current[0] not in self.asked_again:
                self.asked_again.add(self.current[0])
                self.queue.insert(0, self.current)
                self.current = None
                return
        self._settled(text.removeprefix(STACK_HEADER))

    def _settled(self, stack: str) -> None:
        assert self.current is not None
        self.stacks[self.current[0]] = stack
        self.previous, self.current = self.current[0], None

    def _read(self) -> str:
        with contextlib.suppress(OSError), self.path.open() as f:
            f.seek(self.offset)
            return f.read()
        return ""


def signal_thread(pid: int, tid: int, signum: int) -> bool:
    """``signum`` to thread ``tid`` of process ``pid`` alone (``tgkill``; ``os.kill`` would go
    to whichever thread the kernel picks); False when the thread is gone. A C library older
    than glibc 2.30 has no ``tgkill`` function: the system call is made by its number."""
    if _LIBC_TGKILL is not None:
        result = _LIBC_TGKILL(pid, tid, signum)
    elif _SYS_TGKILL is not None:
        result = _LIBC.syscall(_SYS_TGKILL, pid, tid, signum)
    else:
        raise OSError(errno.ENOSYS, f"no tgkill on {platform.machine()}")
    if result == 0:
        return True
    if ctypes.get_errno() == errno.ESRCH:
        return False
    raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {signum})")


def _thread_alive(pid: int, tid: int) -> bool:
    return Path(f"/proc/{pid}/task/{tid}").exists()


def innermost_frames(dump: str, rank: int, frames: int = MESSAGE_FRAMES) -> str:
    """The top frames of ``rank``'s main thread from :func:`dump_stacks`' text, innermost
    first, for the one-line termination message."""
    if f"--- rank {rank} " not in dump:
        return ""
    section = dump.split(f"--- rank {rank} ", 1)[1].split("\n--- rank ", 1)[0]
    main = next((t for t in section.split("\n\n") if f"\n{MAIN_THREAD} " in f"\n{t}"), "")
    lines = [line.strip() for line in main.splitlines() if line.strip().startswith("File ")]
    return " ← ".join(lines[:frames])


def describe(verdict: Verdict, states: dict[int, str | None]) -> str:
    """The hang in one sentence: which ranks, how long, in what state."""
    ranks = ", ".join(
        f"rank {b.rank} (pid {b.pid}, {_state_words(states.get(b.pid))})" for b in verdict.stuck
    )
    waiting = (
        ""
        if verdict.stopped
        else "; no process of the job is stopped: every rank waits (a collective nobody "
        "finishes, a deadlock)"
    )
    return (
        f"{ranks} finished no step for {verdict.idle:.0f}s (hang timeout {verdict.timeout:.0f}s)"
        f"{waiting}"
    )


def _state_words(state: str | None) -> str:
    return {
        "T": "stopped by a signal",
        "t": "stopped by a debugger",
        "D": "in uninterruptible sleep (I/O)",
        "R": "running",
        "S": "sleeping",
    }.get(state or "", f"state {state or 'unknown'}")


class Watchdog:
    """The launcher's thread: judge once a second, act once per hang.

    ``hung(report)`` is called when this pod is the culprit (the launcher stops torchrun and
    exits ``HUNG`` with ``report``); a peer's hang only kills this pod's stuck workers, which
    torchrun restarts into the next round."""

    def __init__(
        self,
        folder: Path,
        configured: float | None,
        board: Board,
        where: str,
        hung: Callable[[str], None],
        log: Callable[[str], None],
        current: Callable[[], set[int]],
    ) -> None:
        self.folder, self.configured, self.board = folder, configured, board
        self.where, self.hung, self.log = where, hung, log
        self.current = current
        """The pids of the workers torchrun runs now: only they are judged."""
        self._done = threading.Event()
        self._handled: set[int] = set()
        """Worker pids already acted on (a killed worker's file may linger a moment)."""
        self._thread = threading.Thread(target=self._run, name="torchkube-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()

    def _run(self) -> None:
        failed = ""
        while not self._done.wait(POLL_SECONDS):
            try:
                current = self.current()
                beats = [b for b in read_beats(self.folder) if b.pid in current - self._handled]
                if beats:
                    self.check(beats, time.time())
            except Exception as error:  # one bad poll must not end hang detection for good
                if repr(error) != failed:
                    failed = repr(error)
                    self.log(f"hang watchdog: a check failed ({failed}); checking on")

    def check(self, beats: Sequence[Beat], now: float) -> None:
        verdict = judge(beats, now, self.configured)
        if verdict is not None and verdict.stopped:
            self._culprit(verdict, now)
            return
        if not looks_stuck(beats, now):
            return
        declared = self.board.read()
        last_step = now - stuck_for(beats, now)
        if declared is not None and declared.at >= last_step and declared.where != self.where:
            self._restart(beats, declared)
            return
        if verdict is not None and verdict.idle >= verdict.timeout + PEER_GRACE_SECONDS:
            mine = Declaration(now, self.where, tuple(b.rank for b in beats), False)
            if self.board.claim(mine, older_than=last_step):
                self._culprit(verdict, now, announce=False)

    def _culprit(self, verdict: Verdict, now: float, announce: bool = True) -> None:
        states = {b.pid: process_state(b.pid) for b in verdict.stuck}
        sentence = describe(verdict, states)
        self._handled.update(b.pid for b in verdict.stuck)
        try:
            dump = dump_stacks(self.folder, verdict.stuck)
        except Exception as error:  # the hang is acted on with or without its stacks
            dump = f"(no stacks: {error!r})"
        self.log(
            f"hang: {sentence}; Python stacks of every thread (most recent call first):\n{dump}"
        )
        if announce:
            ranks = tuple(b.rank for b in verdict.stuck)
            self.board.claim(Declaration(now, self.where, ranks, verdict.stopped), older_than=now)
        where = "; ".join(
            f"rank {b.rank}'s main thread at {innermost_frames(dump, b.rank)}"
            for b in verdict.stuck
            if innermost_frames(dump, b.rank)
        )
        self._kill(self.current() | {b.pid for b in verdict.stuck})
        self.hung(
            f"{HANG_REPORT} {sentence}"
            + (f"; {where}" if where else "")
            + "; the stacks of every thread are in this pod's log"
        )
        self._done.set()

    def _restart(self, beats: Sequence[Beat], declared: Declaration) -> None:
        ranks = ", ".join(str(r) for r in declared.ranks)
        if not declared.stopped:
            self.log(f"stacks of this pod's workers:\n{dump_stacks(self.folder, beats)}")
        self.log(
            f"a hang was found at {declared.where} (rank {ranks}); restarting this pod's "
            "workers so that they re-join at once"
        )
        self._handled.update(b.pid for b in beats)
        self._kill({b.pid for b in beats})

    @staticmethod
    def _kill(pids: set[int]) -> None:
        """SIGKILL: a worker blocked in a collective never reaches its SIGTERM handler's
        step boundary, and no checkpoint can be taken without the hung rank anyway."""
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
