"""The hang rule (torchkube/api/hang.py) and the launcher's watchdog decisions
(torchkube/elastic/watchdog.py) on heartbeats written by hand; the watchdog with real
processes is tests/elastic/test_watchdog.py."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from torchkube.api.hang import HANG_MIN_SECONDS, hang_timeout, parse_configured
from torchkube.elastic.heartbeat import (
    BEAT_SECONDS,
    FIRST_STEP,
    Beat,
    Heartbeat,
    beat_file,
    read_beats,
    stack_file,
)
from torchkube.elastic.watchdog import (
    PEER_GRACE_SECONDS,
    STACK_HEADER,
    Declaration,
    Verdict,
    Watchdog,
    _Asking,
    describe,
    dump_stacks,
    innermost_frames,
    judge,
    looks_stuck,
    signal_thread,
)

T0 = 1_000_000.0


def beat(rank: int, stepped: float | None, written: float, pid: int = 0, **kw: object) -> Beat:
    fields: dict = {"median_step_seconds": 0.5, "collective_timeout_seconds": 600, **kw}
    return Beat(rank, rank, pid or 100 + rank, T0, written, 7, stepped, **fields)


def sleeping(pid: int) -> str:
    return "S"


def test_the_timeout_follows_the_step_time_with_a_floor_and_a_ceiling() -> None:
    assert hang_timeout(None, None) == HANG_MIN_SECONDS
    assert hang_timeout(None, 0.5) == HANG_MIN_SECONDS  # 10 × 0.5 s is less than a minute
    assert hang_timeout(None, 30.0) == 300.0
    assert hang_timeout(None, 30.0, collective_timeout_seconds=200) == 170.0  # below the NCCL one
    assert hang_timeout(None, 30.0, collective_timeout_seconds=70) == HANG_MIN_SECONDS
    assert hang_timeout(45, 30.0) == 45.0  # configured: as it is
    assert hang_timeout(0, 30.0) is None  # off


def test_the_environment_says_derive_off_or_seconds() -> None:
    assert parse_configured(None) is None and parse_configured("") is None
    assert parse_configured("0") == 0 and parse_configured("90") == 90.0


def test_no_verdict_while_a_worker_steps_or_before_the_first_step() -> None:
    now = T0 + 500
    assert judge([beat(0, now - 1, now)], now, None, sleeping) is None
    assert judge([beat(0, None, now)], now, 5, sleeping) is None
    assert judge([beat(0, now - 59, now)], now, None, sleeping) is None


def test_a_stopped_process_is_the_culprit_and_a_waiting_one_is_not() -> None:
    now = T0 + 500
    frozen = beat(1, now - 70, written=now - 69)  # its heartbeat thread stopped with it
    waiting = beat(0, now - 70, written=now)
    verdict = judge([waiting, frozen], now, None, sleeping)
    assert verdict == Verdict(idle=70, timeout=60, stuck=(frozen,), stopped=True)
    stopped = beat(1, now - 70, written=now)  # SIGSTOP seen by its state before its beat
    verdict = judge([waiting, stopped], now, None, lambda pid: "T" if pid == 101 else "S")
    assert verdict is not None and verdict.stuck == (stopped,) and verdict.stopped


def test_without_a_stopped_process_every_worker_is_stuck_but_only_waiting() -> None:
    now = T0 + 500
    beats = [beat(0, now - 61, now), beat(1, now - 61, now)]
    verdict = judge(beats, now, None, sleeping)
    assert verdict is not None and not verdict.stopped and verdict.stuck == tuple(beats)


class Board:
    def __init__(self, declared: Declaration | None = None, wins: bool = True) -> None:
        self.declared, self.wins = declared, wins
        self.claims: list[Declaration] = []

    def read(self) -> Declaration | None:
        return self.declared

    def claim(self, declaration: Declaration, older_than: float) -> bool:
        self.claims.append(declaration)
        return self.wins


def watchdog(board: Board, hung: list[str]) -> Watchdog:
    return Watchdog(
        folder=Path("/nonexistent"),
        configured=None,
        board=board,  # type: ignore[arg-type]
        where="pod-a",
        hung=hung.append,
        log=lambda line: None,
        current=set,
    )


def test_a_peers_declaration_restarts_waiting_workers_without_ending_the_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = T0 + 500
    killed: list[set[int]] = []
    board = Board(Declaration(now - 2, "pod-b", (3,), stopped=True))
    hung: list[str] = []
    dog = watchdog(board, hung)
    monkeypatch.setattr(dog, "_kill", killed.append)
    dog.check([beat(0, now - 20, now)], now)
    assert killed == [{100}] and hung == []


def test_an_old_declaration_is_ignored() -> None:
    now = T0 + 500
    board = Board(Declaration(now - 300, "pod-b", (3,), stopped=True))
    hung: list[str] = []
    dog = watchdog(board, hung)
    dog.check([beat(0, now - 20, now)], now)
    assert hung == [] and board.claims == []


def test_nobody_stopped_the_first_to_claim_ends_its_pod_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = T0 + 500
    monkeypatch.setattr("torchkube.elastic.watchdog.dump_stacks", lambda folder, beats: "")
    monkeypatch.setattr("torchkube.elastic.watchdog.process_state", lambda pid: "S")
    board = Board()
    hung: list[str] = []
    early = watchdog(board, hung)
    early.check([beat(0, now - 61, now)], now)  # past the timeout, within the grace
    assert hung == [] and board.claims == []
    late = watchdog(board, hung)
    monkeypatch.setattr(late, "_kill", lambda pids: None)
    late.check([beat(0, now - 61 - PEER_GRACE_SECONDS, now)], now)
    assert len(board.claims) == 1 and len(hung) == 1
    assert "every rank waits" in hung[0]


def test_looks_stuck_waits_a_few_steps_first() -> None:
    now = T0 + 500
    assert not looks_stuck([beat(0, now - 2, now)], now)
    assert looks_stuck([beat(0, now - 6, now)], now)
    assert not looks_stuck([beat(0, now - 6, now, median_step_seconds=3.0)], now)


DUMP = """--- rank 0 (local rank 1, pid 8)
Main thread 8:
  File "train.py", line 88 in train_step

Thread 10 (torchkube-heartbeat):
  File "threading.py", line 331 in wait
--- rank 1 (local rank 0, pid 7)
Main thread 7:
  File "train.py", line 270 in train_step
  File "train.py", line 117 in train
  File "multiprocessing/process.py", line 314 in _bootstrap
  File "multiprocessing/forkserver.py", line 274 in main

Thread 9 (torchkube-heartbeat):
  File "threading.py", line 331 in wait
  File "threading.py", line 1045 in _bootstrap_inner
  File "threading.py", line 1002 in _bootstrap"""


def test_the_message_names_the_main_threads_innermost_frames() -> None:
    frames = innermost_frames(DUMP, 1, frames=2)
    assert frames == 'File "train.py", line 270 in train_step ← File "train.py", line 117 in train'
    assert innermost_frames(DUMP, 5) == ""
    stuck = (beat(1, T0, T0, pid=7),)
    text = describe(Verdict(62.4, 60, stuck, True), {7: "T"})
    assert text == "rank 1 (pid 7, stopped by a signal) finished no step for 62s (hang timeout 60s)"


def test_declarations_survive_the_store() -> None:
    declared = Declaration(T0, "pod-b", (1, 2), stopped=False)
    assert Declaration.from_json(declared.to_json()) == declared
    assert Declaration.from_json(b"garbage") is None


def test_a_checkpoint_or_evaluation_is_allowed_the_collective_timeout() -> None:
    now = T0 + 1000
    saving = beat(0, now - 300, now - 300, paused="checkpoint")  # a stopped one would be found
    assert judge([saving], now, None, sleeping) is None
    stuck = beat(0, now - 601, now - 601, paused="checkpoint")
    verdict = judge([stuck], now, None, sleeping)
    assert verdict is not None and verdict.timeout == 600


def test_a_worker_stopped_by_a_signal_during_a_save_is_the_culprit_at_the_hang_timeout() -> None:
    """SIGSTOP while an async checkpoint is being written: no save stops itself, so it is
    found at the hang timeout, not the collective one (else its waiting peer would be named,
    after the peer grace)."""
    now = T0 + 1000
    stopped = beat(1, now - 61, now - 61, paused="checkpoint")
    waiting = beat(0, now - 61, now)
    verdict = judge([waiting, stopped], now, None, lambda pid: "T" if pid == 101 else "S")
    assert verdict == Verdict(idle=61, timeout=60, stuck=(stopped,), stopped=True)
    on_disk = beat(1, now - 61, now - 61, paused="checkpoint")  # D: a slow disk, not a hang
    assert judge([on_disk], now, None, lambda pid: "D") is None


def test_a_heartbeat_without_a_launcher_does_nothing(tmp_path: Path) -> None:
    idle = Heartbeat(None)
    idle.beat(1)
    with idle.pausing("checkpoint"):
        pass
    idle.close()
    live = Heartbeat(tmp_path, rank=3, local_rank=1, collective_timeout_seconds=90)
    try:
        live.beat(1)
        with live.pausing("evaluation"):
            assert live.snapshot().paused == "evaluation"
        live.beat(2)
        written = live.snapshot()
        assert (written.rank, written.step, written.paused) == (3, 2, None)
        assert written.median_step_seconds is not None and written.median_step_seconds < 1
    finally:
        live.close()


def test_the_first_step_is_on_disk_at_once(tmp_path: Path) -> None:
    """A worker stopped less than a heartbeat period after its first step must have that step
    on disk: a file that shows no step looks like a worker still starting, never hung, and
    its waiting peer would be blamed instead."""
    heartbeat = Heartbeat(tmp_path, rank=1, local_rank=0)
    try:
        assert Beat.from_json(beat_file(tmp_path, 0).read_text()).stepped is None
        heartbeat.beat(1)
        on_disk = Beat.from_json(beat_file(tmp_path, 0).read_text())
        assert on_disk.step == 1 and on_disk.stepped is not None
    finally:
        heartbeat.close()


def test_the_loop_beginning_is_on_disk_and_the_first_step_is_no_step_time(
    tmp_path: Path,
) -> None:
    heartbeat = Heartbeat(tmp_path, rank=1, local_rank=0)
    try:
        heartbeat.training()
        on_disk = Beat.from_json(beat_file(tmp_path, 0).read_text())
        assert (on_disk.step, on_disk.paused) == (None, FIRST_STEP)
        assert on_disk.stepped is not None
        time.sleep(0.3)  # a slow first step (a compile): not the pace of training
        heartbeat.beat(1)
        heartbeat.beat(2)
        on_disk = Beat.from_json(beat_file(tmp_path, 0).read_text())
        assert (on_disk.step, on_disk.paused) == (1, None)
        median = heartbeat.snapshot().median_step_seconds
        assert median is not None and median < 0.1
    finally:
        heartbeat.close()


def test_a_pause_inside_the_first_step_leaves_it_the_first_steps_allowance(
    tmp_path: Path,
) -> None:
    """Live recovery's quorum comes before the first step's compute: once it is answered
    the worker is still in its first step (a compile may take minutes), not in a plain one."""
    heartbeat = Heartbeat(tmp_path, rank=0, local_rank=0)
    try:
        heartbeat.training()
        with heartbeat.pausing("quorum"):
            assert heartbeat.snapshot().paused == "quorum"
        assert heartbeat.snapshot().paused == FIRST_STEP
        heartbeat.beat(1)
        with heartbeat.pausing("quorum"):
            pass
        assert heartbeat.snapshot().paused is None
    finally:
        heartbeat.close()


def test_the_first_step_is_judged_like_a_pause_but_a_stopped_worker_is_a_hang() -> None:
    now = T0 + 500
    compiling = replace(
        beat(0, now - 100, now, median_step_seconds=None, paused=FIRST_STEP), step=None
    )
    assert judge([compiling], now, 15, sleeping) is None  # the collective timeout: 600 s
    assert judge([compiling], now, 15, lambda pid: "T") == Verdict(
        idle=100, timeout=15, stuck=(compiling,), stopped=True
    )
    starting = replace(compiling, stepped=None, paused=None)
    assert judge([starting], now, 15, lambda pid: "T") is None  # start-up: its own timeouts


WORKER_STOPPED_BEFORE_ITS_FIRST_STEP = """
import os, signal, sys
from pathlib import Path
from torchkube.elastic.heartbeat import Heartbeat
Heartbeat(Path(sys.argv[1])).training()
os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_a_worker_stopped_before_its_first_step_is_found(tmp_path: Path) -> None:
    """A worker SIGSTOPped between start-up and its first step was never judged: the watchdog
    only looked at workers that had stepped, and its peers waited for the collective timeout."""
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER_STOPPED_BEFORE_ITS_FIRST_STEP, str(tmp_path)]
    )
    try:
        deadline = time.monotonic() + 30
        # Read once it stopped: a read before could hold the constructor's beat (not training).
        while os.waitid(os.P_PID, worker.pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT) is None:
            assert time.monotonic() < deadline, "the worker never began training and stopped"
            time.sleep(0.05)
        verdict = judge(read_beats(tmp_path), time.time() + 20, 15)
        assert verdict is not None and verdict.stopped
        assert [b.pid for b in verdict.stuck] == [worker.pid]
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()


def test_a_failed_check_does_not_end_the_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog is a daemon thread: an exception escaping one poll (say, torch's agent
    read while it changes rounds) ended it silently, a later hang of this pod was never
    declared, and its peers blamed themselves after the grace."""
    monkeypatch.setattr("torchkube.elastic.watchdog.POLL_SECONDS", 0.01)
    monkeypatch.setattr("torchkube.elastic.watchdog.process_state", lambda pid: "T")
    monkeypatch.setattr("torchkube.elastic.watchdog.dump_stacks", lambda folder, beats: "")
    now = T0 + 500
    frozen = beat(0, now - 70, written=now - 69)  # its heartbeat thread stopped with it
    monkeypatch.setattr("torchkube.elastic.watchdog.read_beats", lambda folder: [frozen])
    monkeypatch.setattr("torchkube.elastic.watchdog.time.time", lambda: now)
    calls: list[int] = []

    def current() -> set[int]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the agent is between rounds")
        return {100}

    hung: list[str] = []
    logged: list[str] = []
    dog = Watchdog(
        folder=Path("/nonexistent"),
        configured=None,
        board=Board(),  # type: ignore[arg-type]
        where="pod-a",
        hung=hung.append,
        log=logged.append,
        current=current,
    )
    monkeypatch.setattr(dog, "_kill", lambda pids: None)
    dog.start()
    dog._thread.join(5)
    assert len(hung) == 1 and "stopped" in hung[0], (hung, logged)
    assert any("between rounds" in line for line in logged), logged


WORKER_WITH_THREADS_COMING_AND_GOING = """
import sys, threading, time
from pathlib import Path
from torchkube.elastic.heartbeat import Heartbeat

def deep(depth):
    return time.sleep(3600) if depth == 0 else deep(depth - 1)

def short_lived_threads():
    while True:
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()

def the_main_loop():
    heartbeat.beat(1)
    while True:
        sum(range(100))

heartbeat = Heartbeat(Path(sys.argv[1]))
heartbeat.training()
for _ in range(4):  # deep stacks: an all-threads dump takes long enough to meet a thread's end
    threading.Thread(target=deep, args=(100,), daemon=True).start()
for _ in range(8):
    threading.Thread(target=short_lived_threads, daemon=True).start()
print("ready", flush=True)
the_main_loop()
"""


def test_stacks_of_a_stopped_worker_whose_threads_come_and_go(tmp_path: Path) -> None:
    """faulthandler's all-threads dump walks the other threads while they run (the stopped
    worker is continued so that its handler can answer): a thread ending meanwhile frees the
    state the dump reads, and the worker died of a segmentation fault with half a dump (a
    real-node hang test, CI stop 25; here about one dump in fifty crashed). Each thread now
    writes its own stack, one at a time."""
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER_WITH_THREADS_COMING_AND_GOING, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        time.sleep(BEAT_SECONDS * 1.5)  # the heartbeat thread wrote the threads it saw
        dumps, until = 0, time.monotonic() + 10
        while time.monotonic() < until:
            worker.send_signal(signal.SIGSTOP)
            (found,) = read_beats(tmp_path)
            dump = dump_stacks(tmp_path, [found], wait=2)
            assert worker.poll() is None, f"the worker died ({worker.returncode}) after {dumps}"
            assert "in the_main_loop" in innermost_frames(dump, 0), dump
            assert len(re.findall(r"\(deep\)\):\n  File ", dump)) == 4, dump  # each answered
            dumps += 1
            worker.send_signal(signal.SIGCONT)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()


def test_a_thread_is_signalled_alone_and_a_gone_one_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``tgkill`` reaches one thread of another process (``os.kill`` reaches whichever the
    kernel picks); a C library before glibc 2.30 has no function for it, the system call
    is made by its number."""
    received: list[int] = []
    ready = threading.Event()

    def waiting() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
        ready.set()
        received.append(signal.sigwait([signal.SIGUSR2]))

    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    try:
        thread = threading.Thread(target=waiting)
        thread.start()
        ready.wait()
        assert thread.native_id is not None
        assert signal_thread(os.getpid(), thread.native_id, signal.SIGUSR2)
        thread.join(timeout=5)
        assert received == [signal.SIGUSR2] and not thread.is_alive()
        deadline = time.monotonic() + 5  # join returns a moment before the thread is gone
        while signal_thread(os.getpid(), thread.native_id, 0):
            assert time.monotonic() < deadline, "an ended thread is still signalled"
            time.sleep(0.01)

        monkeypatch.setattr("torchkube.elastic.watchdog._LIBC_TGKILL", None)  # glibc < 2.30
        assert signal_thread(os.getpid(), os.getpid(), 0)  # the system call by its number
        assert not signal_thread(os.getpid(), thread.native_id, 0)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR2])


def test_a_thread_still_writing_when_the_next_is_asked_keeps_its_rest(tmp_path: Path) -> None:
    """A thread descheduled mid-dump looks finished; the next one's signal is ignored while
    it writes, and the rest of its stack was filed under the next thread (the main thread's,
    which the termination message quotes, among them)."""
    threads = ((100, "MainThread"), (101, "a"), (102, "b"))
    folder = tmp_path
    stack_file(folder, 0).write_text("")
    asking = _Asking(folder, Beat(0, 0, 100, T0, T0, threads=threads))
    asking.current = (101, "a")
    asking._answered(STACK_HEADER + '  File "a.py", line 1 in outer\n')
    asking.current = (102, "b")
    asking._answered('  File "a.py", line 2 in still_a\n')  # a's rest, b not answered
    assert asking.queue[0] == (102, "b"), "b is asked again"
    asking.current = asking.queue.pop(0)
    asking._answered('  File "a.py", line 3 in more_a\n' + STACK_HEADER + '  File "b.py"\n')
    assert asking.stacks[101].count("File") == 3 and "b.py" not in asking.stacks[101]
    assert asking.stacks[102] == '  File "b.py"\n'
