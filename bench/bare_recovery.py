"""The limit of a restart-based recovery, ``recovery_e2e``'s contender beside torchkube's
"killed, never back" case: the same trainer, job and kill, with nothing between the loss and
the new world but what no restart can skip.

Two trainer processes in a static world of two (``torch.distributed``'s ``env://``, no agent,
no rendezvous); worker 0 holds still once the kill step is done (the trainer's chaos hook, as
under ``torchkube run``) and is SIGKILLed there. The survivor's collective fails on the dead
peer and its process ends: this harness, polling every 10 ms, takes that as the detection and
at once hands a world of one to a standby process that imported torch and the trainer before
the run began — no spawn, no import, no rendezvous to wait in. It resumes from the checkpoint
and trains on. What remains is the trainer's own start in a new world (process group, model
build), the checkpoint load and the first step: the floor of any design that restarts
training processes, though not of one that keeps them (live recovery, torchft).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.plain_torchrun import end_all, worker_env
from torchkube.api import TrainingJob
from torchkube.api.contract import Env, chaos_hold_steps_value, read_progress
from torchkube.local.processes import kill_tree, stopped
from torchkube.local.runner import free_port

POLL_SECONDS = 0.01
STANDBY = "standby"

STANDBY_PROGRAM = """
import importlib, json, os, sys
from torchkube.elastic.warm import PRELOAD, TRAINER_PRELOAD
for module in PRELOAD + TRAINER_PRELOAD:  # what torchkube's warm server imports for its workers
    importlib.import_module(module)
from torchkube.trainer.entrypoint import exit_with, main
print("standby: torch and the trainer imported", flush=True)
os.environ.update(json.loads(sys.stdin.readline()))
exit_with(main())
"""
"""Waits, with what torchkube's warm workers find imported, for one line: the environment of
its world of one."""


@dataclass
class BareResult:
    """What a run with one kill left behind (Unix times)."""

    killed_at: float | None
    """The kill (None: training ended or failed before the kill step)."""
    noticed_at: float | None
    """The survivor's process seen ended."""
    handed_at: float | None
    """The standby given its world of one."""
    log_dir: Path
    exit_codes: list[int | None]
    finished: bool
    """The trainer reported every step done."""


class BareRestart:
    """Worker 0 and 1 of ``job`` in a static world of two, and a standby, in ``workdir``."""

    def __init__(self, job: TrainingJob, workdir: Path) -> None:
        self.job = job
        self.checkpoint_dir = workdir / "checkpoints"
        self.log_dir = workdir / "logs"
        self.processes: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.PIPE,
            stdout=(self.log_dir / f"{name}.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def run(self, kill_step: int, timeout: float) -> BareResult:
        """Train; kill worker 0 at ``kill_step``; hand over to the standby when worker 1's
        process ends; wait for the standby to end (``timeout`` seconds in all)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        killed_at = noticed_at = handed_at = None
        world = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        world |= {"WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        trainer = [sys.executable, "-m", "torchkube.trainer"]
        try:
            standby = self._start(
                STANDBY,
                [sys.executable, "-c", STANDBY_PROGRAM],
                worker_env(self.job, 1, self.checkpoint_dir),
            )
            doomed = self._start(
                "worker-0",
                trainer,
                worker_env(self.job, 0, self.checkpoint_dir)
                | world
                | {"RANK": "0", Env.CHAOS_HOLD_AT_STEPS: chaos_hold_steps_value([kill_step])},
            )
            survivor = self._start(
                "worker-1",
                trainer,
                worker_env(self.job, 1, self.checkpoint_dir) | world | {"RANK": "1"},
            )
            while time.monotonic() < deadline and standby.poll() is None:
                if killed_at is None:
                    if survivor.poll() is not None:
                        break  # training ended (or failed) without the kill
                    if stopped(doomed.pid):
                        killed_at = time.time()
                        kill_tree(doomed.pid)
                        doomed.wait()
                elif noticed_at is None and survivor.poll() is not None:
                    noticed_at = time.time()
                    assert standby.stdin is not None
                    standby.stdin.write(json.dumps({Env.REPLICA_INDEX: "0"}).encode() + b"\n")
                    standby.stdin.flush()
                    handed_at = time.time()
                time.sleep(POLL_SECONDS)
        finally:
            end_all(self.processes)
        record = read_progress(self.checkpoint_dir)
        return BareResult(
            killed_at,
            noticed_at,
            handed_at,
            self.log_dir,
            [process.returncode for process in self.processes],
            bool(record and record.finished),
        )
