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
  (``SIGUSR1`` to their faulthandler, ``SIGCONT`` so a stopped one can answer) and prints them
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
import json
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from torchkube.api.contract import HANG_REPORT
from torchkube.api.hang import hang_timeout
from torchkube.elastic.heartbeat import STACK_SIGNAL, Beat, process_state, read_beats, stack_file

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
"""How long to wait for a stuck worker's stacks (one in a ``D`` state may never answer)."""
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
        self.endpoint, self.key = endpoint, f"torchkube/hang/{run_id}"
        self.timeout = timeout
        self._store: Any = None

    def _connect(self) -> Any:
        if self._store is None and self.endpoint:
            from torch.distributed import TCPStore

            host, _, port = self.endpoint.rpartition(":")
            self._store = TCPStore(
                host.strip("[]"),
                int(port),
                is_master=False,
                timeout=timedelta(seconds=self.timeout),
                wait_for_workers=False,
            )
        return self._store

    def read(self) -> Declaration | None:
        try:
            store = self._connect()
            if store is None or not store.check([self.key]):
                return None
            return Declaration.from_json(store.get(self.key))
        except Exception:  # the store is away (restarting, replaced): decide alone
            self._store = None
            return None

    def claim(self, declaration: Declaration, older_than: float) -> bool:
        """Post ``declaration`` unless another one newer than ``older_than`` is there;
        True when ours is the one posted (without a store: True, we decide alone)."""
        try:
            store = self._connect()
            if store is None:
                return True
            current = store.get(self.key).decode() if store.check([self.key]) else ""
            found = Declaration.from_json(current) if current else None
            if found is not None and found.at >= older_than:
                return False
            posted = store.compare_set(self.key, current, declaration.to_json())
            return bool(posted.decode() == declaration.to_json())
        except Exception:
            self._store = None
            return True


def dump_stacks(folder: Path, beats: Sequence[Beat], wait: float = DUMP_WAIT_SECONDS) -> str:
    """The Python stacks of every thread of ``beats``' processes, from their faulthandler.

    A stopped process is continued so that its signal handler can run, and stopped again as
    soon as its stacks are written (it is killed right after: it must not train on with the
    others meanwhile); one in uninterruptible sleep answers only when the sleep ends, maybe
    never."""
    offsets = {}
    for beat in beats:
        path = stack_file(folder, beat.local_rank)
        offsets[beat.local_rank] = path.stat().st_size if path.exists() else 0
        with contextlib.suppress(ProcessLookupError):
            os.kill(beat.pid, STACK_SIGNAL)
            os.kill(beat.pid, signal.SIGCONT)

    def written() -> dict[int, str]:
        texts = {}
        for beat in beats:
            with contextlib.suppress(OSError), stack_file(folder, beat.local_rank).open() as f:
                f.seek(offsets[beat.local_rank])
                texts[beat.local_rank] = f.read()
        return texts

    deadline = time.monotonic() + wait
    texts = written()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        again = written()
        if again == texts and all("File" in t for t in again.values()):
            break  # every process answered and finished writing
        texts = again
    for beat in beats:
        with contextlib.suppress(ProcessLookupError):
            os.kill(beat.pid, signal.SIGSTOP)
    sections = []
    for beat in beats:
        text = texts.get(beat.local_rank, "").rstrip()
        body = text or "(no answer: the process did not run its signal handler)"
        title = f"--- rank {beat.rank} (local rank {beat.local_rank}, pid {beat.pid})"
        sections.append(f"{title}\n{body}")
    return "\n".join(sections)


def innermost_frames(dump: str, rank: int, frames: int = MESSAGE_FRAMES) -> str:
    """The top frames of ``rank``'s main thread from :func:`dump_stacks`' text, innermost
    first, for the one-line termination message."""
    if f"--- rank {rank} " not in dump:
        return ""
    section = dump.split(f"--- rank {rank} ", 1)[1].split("\n--- rank ", 1)[0]
    threads = [t for t in section.split("\n\n") if "most recent call first" in t]
    # Other threads start in threading's _bootstrap_inner; the main thread does not.
    main = next((t for t in threads if "in _bootstrap_inner" not in t), "")
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
        dump = dump_stacks(self.folder, verdict.stuck)
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
