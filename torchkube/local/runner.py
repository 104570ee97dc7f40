"""Run a TrainingJob on this machine the way the operator runs it on a cluster.

Each local "worker" is what a pod runs: ``torchkube.elastic.launch`` (torchrun) with c10d
rendezvous against a separate store process, ``is_host=false``, the trainer's environment from
the same builder the operator uses, and a local folder standing in for the checkpoint volume.
The supervisor loop plays the operator: a worker that exits with a retryable code is started
again (a replacement pod), a permanent code or an exhausted ``maxRestarts`` ends the run.
``chaos`` kills workers with SIGKILL, as a node loss would, so recovery can be watched.
"""

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from torchkube.api import TrainingJob
from torchkube.local.display import Failure, Summary, progress_line
from torchkube.local.processes import kill_tree
from torchkube.operator.builders import torchrun_args, trainer_env

POLL_SECONDS = 0.25
STORE_START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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

    def due(self, step: int, now: float, last_kill: float, started: float) -> bool:
        if self.at_steps and step >= self.at_steps[0]:
            self.at_steps.pop(0)
            return True
        if self.every_seconds is not None:
            return now - max(last_kill, started) >= self.every_seconds
        return False


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    done: bool = False


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
    ) -> None:
        # The rendezvous id (a pod gets the job's uid) must be the same for every worker.
        uid = job.uid or f"local-{job.name}-{os.getpid()}"
        self.job = job.model_copy(update={"metadata": {**job.metadata, "uid": uid}})
        self.workdir = workdir
        self.checkpoint_dir = workdir / "checkpoints"
        self.log_dir = workdir / "logs"
        self.count = workers or job.spec.replicas.target
        self.chaos = chaos or Chaos()
        self.out = out
        self.nproc = nproc
        self.store_port = free_port()
        self.metrics_ports = [free_port() for _ in range(self.count)]
        self.failures: list[Failure] = []
        self.restarts = 0
        self.store: subprocess.Popen[bytes] | None = None
        self.workers: dict[int, _Worker] = {}
        self._kills = 0

    # ------------------------------------------------------------------ processes
    def _env(self, index: int) -> dict[str, str]:
        env = {**os.environ, **trainer_env(self.job, index)}
        env["TORCHKUBE_CHECKPOINT_DIR"] = str(self.checkpoint_dir)
        env["TORCHKUBE_METRICS_PORT"] = (
            str(self.metrics_ports[index]) if self.job.spec.metrics.enabled else "0"
        )
        env["TORCHKUBE_TERMINATION_LOG"] = str(self.log_dir / f"worker-{index}.termination")
        env.setdefault("OMP_NUM_THREADS", "1")
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

    def _start_worker(self, index: int) -> None:
        args = torchrun_args(
            self.job,
            endpoint=f"127.0.0.1:{self.store_port}",
            local_addr="127.0.0.1",
            nproc=self.nproc,
        )
        assert args[:3] == ["python", "-m", "torchkube.elastic.launch"]
        log = self.log_dir / f"worker-{index}.log"
        proc = subprocess.Popen(
            [sys.executable, *args[1:]],
            env=self._env(index),
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers[index] = _Worker(index, proc, log)

    def _stop_all(self) -> None:
        for worker in self.workers.values():
            if worker.proc.poll() is None:
                kill_tree(worker.proc.pid)
                worker.proc.wait()
        if self.store is not None and self.store.poll() is None:
            self.store.terminate()
            self.store.wait(timeout=30)

    # ------------------------------------------------------------------ observation
    def progress(self) -> dict[str, Any] | None:
        path = self.checkpoint_dir / "progress.json"
        try:
            record: dict[str, Any] = json.loads(path.read_text())
            return record
        except (OSError, ValueError):
            return None

    def _termination_message(self, index: int) -> str:
        path = self.log_dir / f"worker-{index}.termination"
        return path.read_text().strip() if path.exists() else ""

    # ------------------------------------------------------------------ the loop
    def run(self, on_progress: Callable[[str], None] | None = None) -> Summary:
        """Train until the trainer finishes or the failure policy gives up."""
        show = on_progress or self._print_progress
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        last_kill = 0.0
        self._start_store()
        for index in range(self.count):
            self._start_worker(index)
        policy = self.job.spec.failure_policy
        try:
            while True:
                time.sleep(POLL_SECONDS)
                now = time.monotonic()
                record = self.progress()
                step = int((record or {}).get("step", 0))
                self._note_recoveries(step, now)
                show(progress_line(record, self.restarts, now - started))
                if record and record.get("finished"):
                    return self._finish(True, "training completed", started, record)
                if record and self.chaos.due(step, now, last_kill, started):
                    last_kill = now
                    self._kill_one(record, now)
                    if not self.workers:
                        return self._finish(
                            False, "chaos killed every worker (none restarted)", started, record
                        )
                for worker in list(self.workers.values()):
                    code = worker.proc.poll()
                    if code is None or worker.done:
                        continue
                    if code == 0:
                        worker.done = True
                        if all(w.done for w in self.workers.values()):
                            record = self.progress() or record
                            return self._finish(True, "training completed", started, record)
                        continue
                    if policy.is_permanent_exit(code):
                        reason = self._termination_message(worker.index) or f"exit code {code}"
                        return self._finish(
                            False,
                            f"worker {worker.index} failed permanently: {reason}",
                            started,
                            record,
                        )
                    self.restarts += 1
                    if not any(
                        f.worker == worker.index and f.recovered_at is None for f in self.failures
                    ):
                        self.failures.append(
                            Failure(
                                worker.index,
                                f"exited with {code}",
                                now,
                                step,
                                (record or {}).get("lastCheckpointStep"),
                            )
                        )
                    if self.restarts > policy.max_restarts:
                        return self._finish(
                            False,
                            f"{self.restarts} restarts exceed failurePolicy.maxRestarts "
                            f"({policy.max_restarts}); see {worker.log}",
                            started,
                            record,
                        )
                    self._start_worker(worker.index)
        finally:
            self._stop_all()

    def _kill_one(self, record: dict[str, Any], now: float) -> None:
        index = self.chaos.worker if self.chaos.worker is not None else self._kills % self.count
        self._kills += 1
        worker = self.workers.get(index)
        if worker is None or worker.proc.poll() is not None:
            return
        self.out.write(f"\nchaos: SIGKILL worker {index} at step {record.get('step')}\n")
        self.failures.append(
            Failure(
                index,
                "killed (chaos)",
                now,
                int(record.get("step", 0)),
                record.get("lastCheckpointStep"),
            )
        )
        kill_tree(worker.proc.pid)
        worker.proc.wait()
        if not self.chaos.restart:
            del self.workers[index]
            return
        self.restarts += 1
        self._start_worker(index)

    def _note_recoveries(self, step: int, now: float) -> None:
        for failure in self.failures:
            if failure.recovered_at is None and step > failure.step:
                failure.recovered_at = now

    def _print_progress(self, line: str) -> None:
        if self.out.isatty():
            self.out.write("\r" + line[:200] + "\033[K")
        else:
            self._lines = getattr(self, "_lines", 0) + 1
            if self._lines % 20 == 1:
                self.out.write(line + "\n")
        self.out.flush()

    def _finish(
        self, ok: bool, message: str, started: float, record: dict[str, Any] | None
    ) -> Summary:
        record = record or {}
        return Summary(
            name=self.job.name,
            succeeded=ok,
            message=message,
            steps=int(record.get("step", 0)),
            total_steps=int(record.get("totalSteps") or self.job.spec.trainer.steps),
            loss=record.get("loss"),
            tokens_per_second=record.get("tokensPerSecond"),
            wall_seconds=time.monotonic() - started,
            failures=self.failures,
        )
