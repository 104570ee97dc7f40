"""Run a TrainingJob on this machine the way the operator runs it on a cluster.

Each local "worker" is what a pod runs: ``torchkube.elastic.launch`` (torchrun) with c10d
rendezvous against a separate store process, ``is_host=false``, the trainer's environment from
the same builder the operator uses, and a local folder standing in for the checkpoint volume.
The supervisor loop plays the operator and the kubelet, with the operator's own failure
policy (``torchkube.policy``): a worker that exits is classified and accounted for
exactly as its pod would be — a permanent code or an exhausted ``maxRestarts`` ends the run,
anything else starts it again after the policy's backoff — and the store is restarted in
place when it dies, as its pod's ``restartPolicy: Always`` does (one free incident). Workers
a launcher restarts in place are read from the store (``torchkube.elastic.restarts``) and
accounted for as the operator does (``accounting.in_place_due``). The ledger is folded as the
operator folds the job's status (``accounting.Outcome.ledger``), and each worker is its slot, so
under recovery live a worker lost again before committing a step (its termination message
says the first step it committed) spends ``maxRestarts`` as a pod would.

SIGTERM or SIGINT to ``torchkube run`` (a CI job's timeout, a supervisor, Ctrl-C) stops the
whole tree the way a pod deletion would: every agent gets SIGTERM, its workers write their
emergency checkpoint within the job's ``terminationGracePeriodSeconds``, then whatever is left
is killed. Nothing keeps running or writing into the work dir after the command returns.

``chaos`` kills workers (or the store) with SIGKILL, as a node loss would (the replacement
started at once or, with ``replace_after_seconds``, as late as a cluster would start the lost
pod's), kills a worker's training process alone, as a crash would, or stops one with SIGSTOP,
as a wedged GPU would leave it (the launcher's hang watchdog finds it), so recovery can be
watched. A worker to be killed at a step is told the step and holds still once it is done
(``torchkube.trainer.chaos``), so the kill lands at that step however late this loop's poll
sees it.
``replicas.spares`` starts that many extra workers, which stand by in the rendezvous as a pod
would; ``failurePolicy.replaceStragglers`` restarts the worker of a persistently slow rank,
with the straggler policy the operator follows (``torchkube.policy.stragglers``).
"""

import contextlib
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from torchkube.api import TrainingJob
from torchkube.api.contract import (
    ChaosPhase,
    Env,
    ProgressReport,
    chaos_hold_steps_value,
    read_progress,
)
from torchkube.api.ledger import Ledger
from torchkube.api.standby import stands_by
from torchkube.api.status import SlowestRank
from torchkube.api.times import parse_time
from torchkube.api.worker_launch import live, torchrun_args, trainer_env
from torchkube.elastic.restarts import RestartBoard
from torchkube.elastic.warm import workers_of
from torchkube.local.display import (
    FAILURES_FILE,
    LIGHTHOUSE,
    STORE,
    Failure,
    Summary,
    progress_line,
)
from torchkube.local.logs import last_line
from torchkube.local.ports import free_port
from torchkube.local.processes import children_of, descendants, kill_tree, stopped
from torchkube.local.threads import threads_per_process
from torchkube.policy import accounting, backoff, failures, stragglers

POLL_SECONDS = 0.25
FINISHED_EXIT_SECONDS = 30.0
"""How long the workers of a finished run get to exit by themselves, as the pods of a finished
job do, before what is left is stopped: an agent stopped while it winds down leaves its peer
waiting in torchrun's exit barrier for the barrier's 300 s (and the run for its grace)."""
STORE_STOP_SECONDS = 10.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
LIGHTHOUSE_FAILED_STARTS = 3
"""Starts in a row at which a local Lighthouse may exit by itself, no step trained between,
before the run ends: what stops it (torchft missing, its port taken) is this machine's, the
same at every start, and otherwise every replica group would wait out its quorum timeout and
restart, again and again, until maxRestarts ran out."""


def worker_name(index: int) -> str:
    """What a local worker is called where a pod's name would be (``POD_NAME``)."""
    return f"worker-{index}"


@dataclass
class Chaos:
    """When to kill a worker: at given training steps and/or every so many seconds."""

    at_steps: list[int] = field(default_factory=list)
    every_seconds: float | None = None
    worker: int | None = None
    """Which worker to kill; None rotates through them."""
    restart: bool = True
    """Start a killed worker again, as the operator replaces a lost pod. False leaves it dead
    (a node that never comes back): an elastic job must carry on without it."""
    replace_after_seconds: float | None = None
    """Start a killed worker's replacement this many seconds after the kill, not at once: the
    time a cluster takes to schedule a lost pod's replacement and pull its image. None (or 0):
    at once."""
    store_at_steps: list[int] = field(default_factory=list)
    """Steps at which the rendezvous store is SIGKILLed (it is restarted like its pod)."""
    lighthouse_at_steps: list[int] = field(default_factory=list)
    """recovery live: steps at which the torchft Lighthouse is SIGKILLed; it is started again
    ``replace_after_seconds`` later (at once without it), as the operator replaces its pod."""
    stop_at_steps: list[int] = field(default_factory=list)
    """Steps at which a worker's training process is SIGSTOPped: a hang."""
    crash_at_steps: list[int] = field(default_factory=list)
    """Steps at which a worker's training process is SIGKILLed and its launcher lives on: a
    crash (a CUDA error, the kernel's OOM killer), which torchrun restarts in place."""
    poisson_seed: int | None = None
    """With ``every_seconds``: the gaps between timed kills are drawn from an exponential
    distribution of that mean (a Poisson process of losses), and each victim at random among
    the workers training (recovery live: those of the last quorum) and, with
    ``lighthouse_share``, the Lighthouse; seeded, so that a trial can be run again. The
    process runs from the first step trained, as losses during training are what it stands
    for: the job's start (on a loaded machine, most of a minute of importing torch) is not."""
    lighthouse_share: float = 0.0
    """Poisson kills: the share that hits the torchft Lighthouse (recovery live)."""
    compute_seconds: float | None = None
    """Each full micro-batch of a training step lasts at least this long, a step in
    proportion to its sequences (its processes wait out the rest after them): a step standing
    for an accelerator's, so that kills land mid-step in proportion, the step is as long
    against the failure detection as a GPU job's, and longer where fewer replica groups share
    the global batch."""
    in_phases: list[ChaosPhase] = field(default_factory=list)
    """recovery live: kills aimed inside phases, one at a time in this order — each armed
    once the one before has landed (``torchkube.trainer.chaos.hold_if_armed``): the first
    process to reach the armed phase holds there and its worker is SIGKILLed. A phase that
    needs a join (serving or receiving a state copy) comes with the next replacement."""
    in_phases_from_step: int = 1
    """The first step at which a phase is armed. A phase a training group holds (serving,
    reducing, committing) waits besides for two groups training: killing the only one starts
    the job over from its checkpoint — true, but not the loss aimed at."""
    late_seconds: float | None = None
    """Start the last worker this much later than the others: a pod whose image pull or node
    takes longer than ``joinTimeoutSeconds``. The others time out waiting for it (a free
    ``JoinTimeout``), are started again, and train with it once it arrives."""

    def __post_init__(self) -> None:
        self._draws = random.Random(self.poisson_seed)
        self._gap = self._next_gap()

    def _next_gap(self) -> float:
        if self.every_seconds is None:
            return math.inf
        if self.poisson_seed is None:
            return self.every_seconds
        return self._draws.expovariate(1 / self.every_seconds)

    def kill_due(self, step: int) -> bool:
        return _due(self.at_steps, step)

    def timed_kill_due(self, now: float, last_kill: float, started: float) -> bool:
        if now - max(last_kill, started) < self._gap:
            return False
        self._gap = self._next_gap()
        return True

    def poisson_victim(self, training: list[int], lighthouse: bool) -> int | None:
        """A Poisson kill's victim: :data:`LIGHTHOUSE` or one of the ``training`` workers."""
        if lighthouse and self._draws.random() < self.lighthouse_share:
            return LIGHTHOUSE
        return self._draws.choice(training) if training else None

    def store_due(self, step: int) -> bool:
        return _due(self.store_at_steps, step)

    def lighthouse_due(self, step: int) -> bool:
        return _due(self.lighthouse_at_steps, step)

    def stop_due(self, step: int) -> bool:
        return _due(self.stop_at_steps, step)

    def crash_due(self, step: int) -> bool:
        return _due(self.crash_at_steps, step)


def kill_candidates(
    alive: dict[int, datetime], slots: list[int] | None, reported: datetime | None
) -> list[int]:
    """The workers a Poisson kill may take: of those ``alive`` (slot → when its process
    started), the ones in the last quorum's ``slots`` as the report written at ``reported``
    names them (none named: every one alive). A replacement started after that report is not
    the group that trained in its slot but one still starting: at torchft's rates four groups
    would otherwise lose every replacement before it trains, which says nothing but that
    kills outpace starts."""
    return [
        i
        for i, started in sorted(alive.items())
        if not slots or (i in slots and (reported is None or started <= reported))
    ]


def _due(steps: list[int], step: int) -> bool:
    """Whether training reached the first of ``steps`` (taken off the list if so)."""
    if steps and step >= steps[0]:
        steps.pop(0)
        return True
    return False


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    started: datetime
    done: bool = False
    released: bool = False
    """Stopped on purpose (a straggler): its exit is no failure, and it is started again."""


class LocalRun:
    """One local run: start, supervise, summarise."""

    def __init__(
        self,
        job: TrainingJob,
        workdir: Path,
        workers: int | None = None,
        chaos: Chaos | None = None,
        out: TextIO = sys.stdout,
        nproc: int | str = 1,
        heartbeat_timeout_ms: int | None = None,
    ) -> None:
        # The rendezvous id (a pod gets the job's uid) must be the same for every worker.
        uid = job.uid or f"local-{job.name}-{os.getpid()}"
        self.job = job.model_copy(update={"metadata": {**job.metadata, "uid": uid}})
        self.workdir = workdir
        self.checkpoint_dir = workdir / "checkpoints"
        self.log_dir = workdir / "logs"
        self.count = workers or job.spec.replicas.pods
        self.chaos = chaos or Chaos()
        self.arm_dir = workdir / "chaos"
        self.aims_at_phases = bool(self.chaos.in_phases)
        self.phase_kills: list[ChaosPhase] = []
        """The phases a chaos kill landed in, in order (``Chaos.in_phases``)."""
        self.out = out
        self.nproc = nproc
        self.store_port = free_port()
        self.live = live(job)
        self.lighthouse_port = free_port() if self.live else None
        self.lighthouse: subprocess.Popen[bytes] | None = None
        self.lighthouse_log = self.log_dir / "lighthouse.log"
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        """The Lighthouse's failure detection, where not its own default (a benchmark whose
        steps stand for longer ones scales it with them)."""
        self.lighthouse_back_at: float | None = None
        """When a Lighthouse chaos killed is started again (its replacement pod's start)."""
        self._restarts_before_lighthouse_loss = 0
        self._lighthouse_exits: tuple[int, int] = (0, 0)
        """The Lighthouse's exits by itself (not a chaos kill) in a row at one step, and that
        step: a step trained since starts the count again."""
        self.metrics_ports = [free_port() for _ in range(self.count)]
        self.failures: list[Failure] = []
        self.ledger = Ledger()
        self._group_losses_counted = 0
        """recovery live: workers lost again before committing a step (counted)."""
        self.store: subprocess.Popen[bytes] | None = None
        self.store_restarts = 0
        self.workers: dict[int, _Worker] = {}
        self.waiting: dict[int, float] = {}
        """Workers to start again, and when (the failure policy's backoff)."""
        self._kills = 0
        self._step_kills = 0
        """--chaos-at-step kills done: the next one's victim follows from it (:meth:`_victim`)."""
        self._starts: dict[int, int] = {}
        """Times each worker was started: a live-recovery worker's own rendezvous is new each
        time (``torchrun_args``)."""
        self._stop: int | None = None
        self.stopped_by_caller = False
        self.slowest: SlowestRank | None = None
        self._hung: dict[int, Failure] = {}
        """Workers chaos stopped, until their launcher ends them: one failure each."""
        self.restart_board = RestartBoard(f"127.0.0.1:{self.store_port}", self.job.uid)
        earlier = self.progress()
        self._first_step = (earlier.last_checkpoint_step or 0) if earlier else 0
        """Where training starts: the checkpoint an earlier run in the work dir left."""
        self._in_place_counted: set[tuple[str, int]] = set()

    # ------------------------------------------------------------------ processes
    def _env(self, index: int) -> dict[str, str]:
        env = {**os.environ, **trainer_env(self.job, index)}
        env[Env.CHECKPOINT_DIR] = str(self.checkpoint_dir)
        # spec.data's files are under this folder, not under the pods' mount path.
        trainer = self.job.spec.trainer_config(str(self.checkpoint_dir))
        env[Env.TRAINER_CONFIG] = json.dumps(trainer.to_wire(), sort_keys=True)
        env[Env.METRICS_PORT] = (
            str(self.metrics_ports[index]) if self.job.spec.metrics.enabled else "0"
        )
        env[Env.TERMINATION_LOG] = str(self.log_dir / f"worker-{index}.termination")
        env[Env.POD_NAME], env[Env.NODE_NAME] = worker_name(index), socket.gethostname()
        if self.lighthouse_port is not None:
            env[Env.LIGHTHOUSE] = f"http://127.0.0.1:{self.lighthouse_port}"
        cpus = len(os.sched_getaffinity(0))
        env.setdefault("OMP_NUM_THREADS", str(threads_per_process(cpus, self.count, self.nproc)))
        if self.chaos.compute_seconds:
            env[Env.CHAOS_COMPUTE_SECONDS] = str(self.chaos.compute_seconds)
        if self.aims_at_phases:
            env[Env.CHAOS_ARM_DIR] = str(self.arm_dir)
        holds = self._hold_steps(index)
        if holds:
            env[Env.CHAOS_HOLD_AT_STEPS] = chaos_hold_steps_value(holds)
        for variable in self.job.spec.env:
            if variable.value is not None:
                env[variable.name] = variable.value
        return env

    def _start_store(self) -> None:
        self.store = subprocess.Popen(
            [sys.executable, "-m", "torchkube.elastic.store", "--port", str(self.store_port)],
            stdout=(self.log_dir / "store.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _start_lighthouse(self) -> None:
        """recovery live: torchft's Lighthouse, which forms every step's quorum of workers."""
        port = self.lighthouse_port
        assert port is not None
        detection = (
            ["--heartbeat-timeout-ms", str(self.heartbeat_timeout_ms)]
            if self.heartbeat_timeout_ms is not None
            else []
        )
        self.lighthouse = subprocess.Popen(
            [sys.executable, "-m", "torchkube.elastic.lighthouse", "--port", str(port), *detection],
            stdout=self.lighthouse_log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _start_worker(self, index: int) -> None:
        args = torchrun_args(
            self.job,
            endpoint=f"127.0.0.1:{self.store_port}",
            local_addr="127.0.0.1",
            nproc=self.nproc,
            index=index,
            incarnation=str(self._starts.setdefault(index, 0)),
        )
        self._starts[index] += 1
        assert args[:3] == ["python", "-m", "torchkube.elastic.launch"]
        log = self.log_dir / f"worker-{index}.log"
        termination = self.log_dir / f"worker-{index}.termination"
        termination.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, *args[1:]],
            env=self._env(index),
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers[index] = _Worker(index, proc, log, datetime.now(UTC))

    def _await_exit(self, seconds: float) -> None:
        """Wait up to ``seconds`` for every worker to exit by itself; a stop signal ends the
        wait (the workers are stopped next)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self._stop is None:
            if all(worker.proc.poll() is not None for worker in self.workers.values()):
                return
            time.sleep(POLL_SECONDS)

    def _stop_all(self, grace: float) -> None:
        """SIGTERM every agent (torchrun passes it to its workers, which write their
        emergency checkpoint), wait up to ``grace`` seconds, then kill what is left."""
        live = [w for w in self.workers.values() if w.proc.poll() is None]
        # Known before the agents go: an agent that dies first would orphan its workers,
        # which run in sessions of their own and are no longer found below it.
        trees = {w.proc.pid: descendants(w.proc.pid) for w in live}
        for worker in live:
            worker.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for worker in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for worker in self.workers.values():
            kill_tree(worker.proc.pid)
            for pid in trees.get(worker.proc.pid, []):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            worker.proc.wait()
        for server in (self.store, self.lighthouse):
            if server is not None and server.poll() is None:
                server.terminate()
                try:
                    server.wait(timeout=STORE_STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()

    # ------------------------------------------------------------------ observation
    def progress(self) -> ProgressReport | None:
        """The trainer's report from the work dir (the contract's ProgressReport)."""
        return read_progress(self.checkpoint_dir)

    def _termination_message(self, index: int) -> str:
        path = self.log_dir / f"worker-{index}.termination"
        return path.read_text().strip() if path.exists() else ""

    # ------------------------------------------------------------------ the loop
    def run(self, on_progress: Callable[[str], None] | None = None) -> Summary:
        """Train until the trainer finishes, the failure policy gives up, or a signal."""
        show = on_progress or self._print_progress
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        if self.aims_at_phases:  # an earlier run's armings are not this run's
            shutil.rmtree(self.arm_dir, ignore_errors=True)
            self.arm_dir.mkdir()
        started = time.monotonic()
        previous = self._catch_signals()
        grace = float(self.job.spec.checkpoint.termination_grace_period_seconds)
        try:
            self._start_store()
            if self.live:
                self._start_lighthouse()
            late = self.chaos.late_seconds
            for index in range(self.count):
                if late is not None and index == self.count - 1:
                    self.waiting[index] = time.monotonic() + late
                else:
                    self._start_worker(index)
            return self._supervise(show, started)
        finally:
            self._stop_all(grace)
            self._restore_signals(previous)

    def _supervise(self, show: Callable[[str], None], started: float) -> Summary:
        last_kill = 0.0
        trained_at: float | None = None
        while True:
            time.sleep(POLL_SECONDS)
            now = time.monotonic()
            record = self.progress()
            step = record.step if record else 0
            self._note_recoveries(step, now)
            window = self.job.spec.trainer.log_interval_steps
            show(progress_line(record, self.ledger.restarts, now - started, window))
            if self._stop is not None:
                name = signal.Signals(self._stop).name
                return self._finish(
                    False,
                    f"stopped by {name}: every worker was sent SIGTERM and given "
                    "terminationGracePeriodSeconds for its emergency checkpoint",
                    started,
                    record,
                )
            if record and record.finished:
                self._await_exit(FINISHED_EXIT_SECONDS)
                return self._finish(True, "training completed", started, record)
            if record and self.chaos.store_due(step):
                self._kill_store(record, now)
            if record and self.chaos.lighthouse_due(step):
                self._kill_lighthouse(record, now)
            if record and self.chaos.stop_due(step):
                self._signal_trainer(record, now, signal.SIGSTOP)
            if record and self.chaos.crash_due(step):
                self._crash(record, now)
            if record:
                self._replace_straggler(record, now)
            if trained_at is None and record and record.step >= 1:
                trained_at = now
            if record and self.aims_at_phases:  # first: its holder is not a step's
                self._phase_chaos(record, now, armed=step >= self.chaos.in_phases_from_step)
            clock = started if self.chaos.poisson_seed is None else trained_at
            kill = self._kill_due(step, now, last_kill, clock) if record else None
            if record and kill is not None and kill[0] == LIGHTHOUSE:
                last_kill = now
                self._kill_lighthouse(record, now)
            elif record and kill is not None:
                last_kill = now
                self._kill_one(*kill, record, now)
                if not self.workers and not self.waiting:
                    return self._finish(
                        False, "chaos killed every worker (none restarted)", started, record
                    )
            ended = (
                self._check_store(record, now)
                or self._check_lighthouse(record, now)
                or self._check_workers(record, now)
                or self._check_in_place()
            )
            if ended is not None:
                ok, message = ended
                return self._finish(ok, message, started, self.progress() or record)
            for index, at in list(self.waiting.items()):
                if now >= at:
                    del self.waiting[index]
                    self._start_worker(index)

    def _group_loss(self, found: failures.Failure) -> failures.Failure:
        """``found`` as the operator sees it under recovery live: the loss of its worker's
        replica group alone while other workers train on (``failures.live_group_losses``); one
        that finished training trained on through it; a hot spare standing by outside the
        quorum (``stands_by``) carries nothing."""
        record = self.progress()
        running = [
            worker_name(i)
            for i, w in self.workers.items()
            if (w.done or w.proc.poll() in (None, 0))  # exited 0: it finished training
            and not stands_by(i, w.started, record)
        ]
        return failures.live_group_losses(self.job, [found], running)[0]

    def _account(self, found: failures.Failure, say: bool = False) -> tuple[bool, str] | None:
        """The operator's decision on one failure; (False, why) when the run must end.
        ``say``: print it as accounted (an in-place restart that joins an incident is then
        said to follow the incident's cause, ``failures.followed``)."""
        now = datetime.now(UTC)
        job_policy = self.job.spec.failure_policy
        outcome = accounting.account(self.ledger, [found], job_policy, now)
        self.ledger = outcome.ledger
        if say:
            for written in outcome.records:
                self.out.write(f"\n{written.message}\n")
        counted = found.group_loss and bool(outcome.records[-1].counted)
        self._group_losses_counted += counted
        if found.group_loss:
            if outcome.fail_reason is None:
                spent = (outcome.counted, job_policy.max_restarts) if counted else None
                message = accounting.group_loss_message(found, outcome.group_losses, spent)
                self.out.write(f"\n{message}\n")
        elif found.survivors is not None:
            self.out.write(f"\n{accounting.trained_through_message(found)}\n")
        if outcome.fail_reason is not None:
            return False, outcome.fail_message
        return None

    def _check_in_place(self, settle: bool = False) -> tuple[bool, str] | None:
        """Workers a launcher restarted in place, each accounted for once, as the operator
        does it (``accounting.in_place_due``); ``settle``: the run ended, so none waits longer
        for the failure that may have caused it."""
        started = {
            worker_name(i): w.started for i, w in self.workers.items() if settle or not w.done
        }
        now = datetime.now(UTC) + (accounting.INCIDENT_WINDOW if settle else timedelta())
        due, _ = accounting.in_place_due(
            self.restart_board.read(),
            started,
            lambda pod, restart: (pod, restart) in self._in_place_counted,
            now,
            {worker_name(i): i for i in self.workers},
        )
        for found in due:
            self._in_place_counted.add((found.pod, found.restart_count or 0))
            verdict = self._account(self._group_loss(found), say=True)
            if verdict is not None:
                return False, verdict[1]
        return None

    def _check_store(self, record: ProgressReport | None, now: float) -> tuple[bool, str] | None:
        """A dead store is started again on its port, as the kubelet restarts its pod's
        container; its loss is one incident, free unless the run made no progress since the last
        (``failures.store_loss``) — under recovery live none, while a worker trains on through it
        (``failures.live_group_losses``)."""
        if self.store is None or self.store.poll() is None:
            return None
        self.store_restarts += 1
        code = self.store.returncode
        found = failures.Failure(
            reason="RendezvousStoreLost",
            message=f"rendezvous store exited with code {code}; restarted in place",
            pod="store",
            restart_count=self.store_restarts,
        )
        found = failures.store_loss(found, self.ledger.history, record.step if record else None)
        found = self._group_loss(found)
        self._start_store()
        lost = (f for f in self.failures if f.worker == STORE and f.recovered_at is None)
        shown = next(lost, None)
        if shown is None:
            self.failures.append(
                self._display_failure(STORE, "store lost", record, now, found.survivors)
            )
        else:  # a chaos kill, shown when done: whether the groups trained on is known now
            shown.live = found.survivors is not None
        return self._account(found)

    def _check_lighthouse(
        self, record: ProgressReport | None, now: float
    ) -> tuple[bool, str] | None:
        """A dead Lighthouse is started again on its port, as the operator replaces its pod
        (one chaos killed, once its replacement is due): the workers wait for it at their next
        quorum. Not a failure: nothing restarts. One that exits by itself at
        ``LIGHTHOUSE_FAILED_STARTS`` starts in a row, no step trained between, ends the run."""
        if self.lighthouse is None or self.lighthouse.poll() is None:
            return None
        if self.lighthouse_back_at is not None and now < self.lighthouse_back_at:
            return None
        killed, self.lighthouse_back_at = self.lighthouse_back_at is not None, None
        code = self.lighthouse.returncode
        if not killed:
            step = record.step if record else 0
            exits, at = self._lighthouse_exits
            self._lighthouse_exits = (exits + 1 if at == step else 1, step)
            if self._lighthouse_exits[0] >= LIGHTHOUSE_FAILED_STARTS:
                return False, self._lighthouse_cannot_serve(code)
        self._start_lighthouse()
        self.out.write(
            f"\ntorchft lighthouse exited with code {code}; started again: the replica groups "
            "wait for it at their next quorum (no restart)\n"
        )
        return None

    def _lighthouse_cannot_serve(self, code: int) -> str:
        """Why the run ends: the Lighthouse's own last word (its exception), then what it
        needs, which is the same at every start on this machine."""
        log = self.lighthouse_log
        said = failures.clip_message(last_line(log))
        return (
            f"the torchft Lighthouse exited with code {code} at {LIGHTHOUSE_FAILED_STARTS} "
            f"starts in a row, no step trained between"
            + (f": {said}" if said else "")
            + f" ({log}). Every step begins with a quorum it forms, so the replica groups "
            f"cannot train without it. It runs python -m torchkube.elastic.lighthouse on port "
            f"{self.lighthouse_port}: that needs torchft installed and the port free"
        )

    def _check_workers(self, record: ProgressReport | None, now: float) -> tuple[bool, str] | None:
        for worker in list(self.workers.values()):
            code = worker.proc.poll()
            if code is None or worker.done:
                continue
            if worker.released:
                del self.workers[worker.index]
                self._start_worker(worker.index)
                continue
            if code == 0:
                worker.done = True
                if all(w.done for w in self.workers.values()) and not self.waiting:
                    return True, "training completed"
                continue
            found = failures.classify_exit(
                code,
                self._termination_message(worker.index),
                self.job.spec.failure_policy,
                f"worker {worker.index}",
                started=worker.started,
            )
            found = self._group_loss(replace(found, slot=worker.index))
            hung = self._hung.pop(worker.index, None)
            if hung is not None:  # the stopped rank's last steps may have shown meanwhile
                hung.recovered_at = None
            elif not any(
                f.worker == worker.index and f.recovered_at is None for f in self.failures
            ):
                self.failures.append(
                    self._display_failure(
                        worker.index, f"exited with {code}", record, now, found.survivors
                    )
                )
            verdict = self._account(found)
            if verdict is not None:
                return False, f"{verdict[1]}; see {worker.log}"
            del self.workers[worker.index]
            wait = backoff.backoff_remaining(
                self.ledger, self.job.spec.failure_policy, datetime.now(UTC)
            )
            self.waiting[worker.index] = now + max(0.0, wait)
        return None

    def _display_failure(
        self,
        worker: int,
        reason: str,
        record: ProgressReport | None,
        now: float,
        survivors: int | None = None,
    ) -> Failure:
        report = record or ProgressReport()
        return Failure(
            worker,
            reason,
            now,
            report.step,
            report.last_checkpoint_step,
            live=survivors is not None,
        )

    # ------------------------------------------------------------------ chaos
    def _victim(self, pending: int) -> int:
        """The worker the ``pending``-th of the --chaos-at-step kills still to come takes."""
        if self.chaos.worker is not None:
            return self.chaos.worker
        return (self._step_kills + pending) % self.count

    def _hold_steps(self, index: int) -> list[int]:
        """The --chaos-at-step steps at which worker ``index`` is to be killed: it holds still
        after each (``torchkube.trainer.chaos``), so the kill lands there whatever the load."""
        return [s for k, s in enumerate(self.chaos.at_steps) if self._victim(k) == index]

    def _holding(self, index: int) -> bool:
        """Whether a training process of worker ``index`` stopped itself at a chaos step (one
        chaos stopped as a hang is not holding)."""
        worker = self.workers.get(index)
        if worker is None or index in self._hung:
            return False
        return any(stopped(pid) for pid in workers_of(worker.proc.pid, children_of()))

    def _kill_due(
        self, step: int, now: float, last_kill: float, started: float | None
    ) -> tuple[int, int] | None:
        """(worker, step) of the chaos kill due now, if one is. A --chaos-at-step kill is due
        once its worker holds at the step (or, where it cannot hold, a spare standing by, once
        the progress report shows the step); a --chaos-every one rotates."""
        if self.chaos.at_steps:
            victim, asked = self._victim(0), self.chaos.at_steps[0]
            seen = max(step, asked) if self._holding(victim) else step
            if self.chaos.kill_due(seen):
                self._step_kills += 1
                return victim, seen
        if started is not None and self.chaos.timed_kill_due(now, last_kill, started):
            if self.chaos.poisson_seed is None:
                rotated = self._kills % self.count
                return (self.chaos.worker if self.chaos.worker is not None else rotated), step
            drawn = self.chaos.poisson_victim(self._training(), self._serving())
            return None if drawn is None else (drawn, step)
        return None

    def _training(self) -> list[int]:
        """The workers alive in the last quorum (recovery live; else every worker alive): a
        Poisson kill's candidates (:func:`kill_candidates`)."""
        record = self.progress()
        slots = record.live.training_slots if record and record.live else None
        reported = parse_time(record.updated) if record and record.updated else None
        alive = {i: w.started for i, w in self.workers.items() if w.proc.poll() is None}
        return kill_candidates(alive, slots, reported)

    def _serving(self) -> bool:
        return self.lighthouse is not None and self.lighthouse.poll() is None

    def _phase_chaos(self, record: ProgressReport, now: float, armed: bool) -> None:
        """Kill the worker whose process holds in an armed phase; from
        ``Chaos.in_phases_from_step`` on (``armed``), arm the next phase when none is armed or
        held (``Chaos.in_phases``) — one a training group holds only while two groups train,
        so that the kill leaves a live peer. A holder whose worker is already gone is killed
        alone: a stopped process is never left behind."""
        for held in sorted(self.arm_dir.glob("held-*")):
            try:
                pid = int(held.read_text())
            except (OSError, ValueError):
                continue  # claimed, its pid not written yet: the next poll reads it
            held.unlink()
            phase = ChaosPhase(held.name.removeprefix("held-"))
            index = self._worker_of(pid)
            if index is not None and self._kill_one(index, record.step, record, now, phase):
                self.phase_kills.append(phase)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if armed and self.chaos.in_phases and not any(self.arm_dir.iterdir()):
            live = record.live  # restart mode: one group, and a restart is what it does
            if not live or live.replica_groups >= 2 or not self.chaos.in_phases[0].held_in_training:
                (self.arm_dir / f"arm-{self.chaos.in_phases.pop(0)}").touch()

    def _worker_of(self, pid: int) -> int | None:
        tree = children_of()
        for index, worker in self.workers.items():
            if pid == worker.proc.pid or pid in workers_of(worker.proc.pid, tree):
                return index
        return None

    def _kill_one(
        self, index: int, step: int, record: ProgressReport, now: float, during: str = ""
    ) -> bool:
        """SIGKILL worker ``index``'s whole tree (its pod), ``during`` a phase if aimed at one;
        False when it had already exited."""
        self._kills += 1
        worker = self.workers.get(index)
        if worker is None or worker.proc.poll() is not None:
            return False
        where = f" while {during}" if during else ""
        self.out.write(f"\nchaos: SIGKILL worker {index} at step {step}{where}\n")
        if self.live:
            self.out.write(
                "recovery live: the other workers keep training without it from their next "
                f"step; worker {index} is started again and joins from a live peer\n"
            )
        kill_tree(worker.proc.pid)
        worker.proc.wait()
        del self.workers[index]
        found = self._group_loss(
            failures.Failure(
                reason="NodeLost",
                message=f"worker {index} killed (chaos)",
                pod=f"worker {index}",
                started=worker.started,
                slot=index,
            )
        )
        failure = self._display_failure(index, "killed (chaos)", record, now, found.survivors)
        failure.step = step
        self.failures.append(failure)
        self._account(found)
        if self.chaos.restart and self.chaos.replace_after_seconds:
            self.waiting[index] = now + self.chaos.replace_after_seconds
        elif self.chaos.restart:
            self._start_worker(index)
        return True

    def _crash(self, record: ProgressReport, now: float) -> None:
        """SIGKILL a training process (``--chaos-crash-at-step``). The worker named by
        ``--chaos-worker`` may be starting again when the step comes (a replacement still
        importing, or under recovery live not yet in a quorum): the crash waits until it
        trains rather than hit its start, which is another loss."""
        named = self.chaos.worker
        starting = named is not None and named not in self._training()
        if starting or not self._signal_trainer(record, now, signal.SIGKILL, quiet=True):
            if named in (*self.workers, *self.waiting):
                self.chaos.crash_at_steps.insert(0, record.step)
            else:
                self.out.write(f"\nchaos: no training process to SIGKILL at step {record.step}\n")

    def _signal_trainer(
        self, record: ProgressReport, now: float, sig: signal.Signals, quiet: bool = False
    ) -> bool:
        """SIGSTOP one training process of a worker: it hangs mid-step, its launcher's
        watchdog finds it after the hang timeout and ends the worker with exit code 124. Or
        SIGKILL it: its launcher restarts the round in place, and no worker exits here.
        False when no worker has a training process (``quiet``: without saying so)."""
        tree = children_of()
        order = [(self._kills + i) % self.count for i in range(self.count)]
        self._kills += 1
        candidates = [self.chaos.worker] if self.chaos.worker is not None else order
        training = [
            (i, trainers)
            for i in candidates
            if i in self.workers and (trainers := workers_of(self.workers[i].proc.pid, tree))
        ]
        if not training:  # a spare stands by without a trainer
            if not quiet:
                self.out.write(
                    f"\nchaos: no training process to {sig.name} at step {record.step}\n"
                )
            return False
        index, trainers = training[0]
        self.out.write(
            f"\nchaos: {sig.name} a training process of worker {index} at step {record.step}\n"
        )
        hung = sig == signal.SIGSTOP
        what = "stopped (chaos: hung)" if hung else "crashed (chaos)"
        affected = self._group_loss(
            failures.Failure(reason="Unknown", message=what, pod=worker_name(index))
        )
        failure = self._display_failure(index, what, record, now, affected.survivors)
        self.failures.append(failure)
        if hung:
            self._hung[index] = failure
        with contextlib.suppress(ProcessLookupError):
            os.kill(trainers[0], sig)
        return True

    def _replace_straggler(self, record: ProgressReport, now: float) -> None:
        """The operator's straggler policy on this run's workers: the slowest rank tracked,
        and its worker stopped gracefully (emergency checkpoint) and started again once it
        has been a straggler for ``stragglerSeconds``."""
        at = datetime.now(UTC)
        job_policy = self.job.spec.failure_policy
        self.slowest = stragglers.track(self.slowest, record, job_policy, at)
        name = stragglers.overdue(self.slowest, job_policy, at)
        index = next((i for i in self.workers if worker_name(i) == name), None)
        if index is None or self.slowest is None or not stragglers.fresh(record, at):
            return
        worker = self.workers[index]
        if worker.released or worker.proc.poll() is not None:
            return
        self.out.write(f"\nstraggler: replacing worker {index} (rank {self.slowest.rank})\n")
        self.failures.append(self._display_failure(index, "replaced (straggler)", record, now))
        self._account(failures.straggler_failure(self.slowest, job_policy, worker.started))
        worker.released = True
        self.slowest = self.slowest.model_copy(update={"straggling_since": None})
        worker.proc.send_signal(signal.SIGTERM)

    def _kill_store(self, record: ProgressReport, now: float) -> None:
        if self.store is None or self.store.poll() is not None:
            return
        self.out.write(f"\nchaos: SIGKILL the rendezvous store at step {record.step}\n")
        self.failures.append(self._display_failure(STORE, "killed (chaos)", record, now))
        self.store.kill()
        self.store.wait()

    def _kill_lighthouse(self, record: ProgressReport, now: float) -> None:
        if self.lighthouse is None or self.lighthouse.poll() is not None:
            return
        away = self.chaos.replace_after_seconds or 0.0
        self.out.write(
            f"\nchaos: SIGKILL the torchft lighthouse at step {record.step}, its replacement in "
            f"{away:g} s\n"
        )
        self.failures.append(self._display_failure(LIGHTHOUSE, "killed (chaos)", record, now))
        self._restarts_before_lighthouse_loss = self.ledger.restarts
        self.lighthouse.kill()
        self.lighthouse.wait()
        self.lighthouse_back_at = now + away

    def _note_recoveries(self, step: int, now: float) -> None:
        for failure in self.failures:
            if failure.recovered_at is None and step > failure.step:
                failure.recovered_at = now
                if failure.worker == LIGHTHOUSE:  # the groups waited for it, or restarted
                    failure.live = self.ledger.restarts == self._restarts_before_lighthouse_loss

    def stop(self) -> None:
        """Stop the run from another thread as SIGTERM would (a caller's deadline): every
        worker gets SIGTERM and its grace, and :meth:`run` returns its summary."""
        self.stopped_by_caller = True
        self._stop = signal.SIGTERM

    # ------------------------------------------------------------------ signals
    def _catch_signals(self) -> dict[int, Any]:
        """SIGTERM/SIGINT end the run gracefully (checked by the loop), as a pod deletion
        would; only the main thread may set handlers (tests may run this elsewhere)."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def stop(signum: int, _frame: Any) -> None:
            self._stop = signum

        return {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _print_progress(self, line: str) -> None:
        if self.out.isatty():
            self.out.write("\r" + line[:200] + "\033[K")
        else:
            self._lines = getattr(self, "_lines", 0) + 1
            if self._lines % 20 == 1:
                self.out.write(line + "\n")
        self.out.flush()

    def _finish(
        self, ok: bool, message: str, started: float, record: ProgressReport | None
    ) -> Summary:
        self._check_in_place(settle=True)
        report = record or ProgressReport()
        epoch = time.time() - time.monotonic()
        with (self.log_dir / FAILURES_FILE).open("a") as lines:  # what `torchkube plot` draws
            lines.writelines(f"{failure.to_line(epoch)}\n" for failure in self.failures)
        return Summary(
            name=self.job.name,
            succeeded=ok,
            message=message,
            steps=report.step,
            total_steps=report.total_steps or self.job.spec.trainer.steps,
            loss=report.loss,
            tokens_per_step=self.job.spec.trainer.tokens_per_step,
            first_step=self._first_step,
            wall_seconds=time.monotonic() - started,
            failures=self.failures,
            restarts=self.ledger.restarts,
            replica_group_losses=self.ledger.group_losses,
            replica_group_losses_counted=self._group_losses_counted,
        )
