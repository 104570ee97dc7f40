"""Plain torchrun, the reference of ``recovery_e2e``: the same trainer, job and kill, launched
as ``torchrun --nnodes=1:2 --rdzv-backend=c10d`` is on two nodes.

Two agents on loopback, one worker each. Its rendezvous store lives inside the first agent
(``is_host=true``), as the c10d backend puts it in the agent on the endpoint's host. The
rendezvous settings are torchrun's defaults (last call 30 s, keep-alive 5 s × 3, monitor
interval 0.1 s), or the ones torchkube passes (from the same job), so a comparison can tell
the part of the gain that is settings from the part that is design.

A kill takes a whole agent's process tree, as losing its node does: ``other`` is the agent
without the store, ``host`` the one with it (what losing rank 0's node means for torchrun).
Or it takes the agent's training process alone, as a crash does (a CUDA error, the OOM
killer): the agent lives on and restarts its worker in a new round (``--max-restarts``).
A whole agent killed may be replaced: the same command started again that many seconds
later, as a lost pod's replacement would be once scheduled and its image pulled. The victim's
trainer may be told to hold still once the kill step is done (``torchkube run``'s
``--chaos-at-step`` hook, :mod:`torchkube.trainer.chaos`: the same trainer runs here), so
that the kill lands at that step whatever the load.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from torchkube.api import TrainingJob
from torchkube.api.contract import Env, ProgressReport, chaos_hold_steps_value, read_progress
from torchkube.api.worker_launch import torchrun_args, trainer_env
from torchkube.elastic.warm import workers_of
from torchkube.local.processes import children_of, kill_tree, stopped
from torchkube.local.runner import free_port
from torchkube.local.threads import threads_per_process

AGENTS = 2


def torchkube_rdzv_conf(job: TrainingJob) -> tuple[str, str]:
    """The ``--rdzv-conf`` (without ``is_host``) and ``--monitor-interval`` torchkube's pods
    get for ``job``."""
    args = torchrun_args(job, endpoint="127.0.0.1:0", local_addr="127.0.0.1", nproc=1)
    conf = next(a for a in args if a.startswith("--rdzv-conf=")).split("=", 1)[1]
    monitor = next(a for a in args if a.startswith("--monitor-interval=")).split("=", 1)[1]
    parts = [p for p in conf.split(",") if not p.startswith("is_host=")]
    return ",".join(parts), monitor


def worker_env(job: TrainingJob, index: int, checkpoint_dir: Path) -> dict[str, str]:
    """Worker ``index``'s environment as torchkube's pods give it, less the launcher's, for
    one of two workers on this machine writing to ``checkpoint_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
    env |= trainer_env(job, index)
    cpus = len(os.sched_getaffinity(0))
    return env | {
        Env.CHECKPOINT_DIR: str(checkpoint_dir),
        Env.METRICS_PORT: "0",
        "OMP_NUM_THREADS": str(threads_per_process(cpus, AGENTS, 1)),
    }


def end_all(processes: list[subprocess.Popen[bytes]]) -> None:
    """Kill what is still running of ``processes`` (each with its tree) and reap them all."""
    for process in processes:
        if process.poll() is None:
            kill_tree(process.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)


@dataclass
class PlainResult:
    """What a run with one kill left behind."""

    killed_at: float | None
    """Unix time of the kill (None: training ended before the kill step)."""
    killed_step: int | None
    """The step of the trainer's progress report that triggered the kill."""
    log_dir: Path
    exit_codes: list[int | None]
    finished: bool
    """The trainer reported every step done."""
    replaced_at: float | None = None
    """Unix time the killed agent's replacement was started (None: none was)."""


class PlainTorchrun:
    """Two plain torchrun agents for ``job`` in ``workdir``; ``settings`` is ``defaults`` or
    ``torchkube`` (the rendezvous settings torchkube's pods get).

    ``share_store=False`` sets torch's ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, as
    ``torchkube.elastic.launch`` does: by default torchrun hands its rendezvous store to the
    workers and caches the first round's worker address, so the workers of a round restarted
    with both agents alive wait for an address nobody publishes (no step in 150 s here)."""

    def __init__(
        self, job: TrainingJob, workdir: Path, settings: str, share_store: bool = True
    ) -> None:
        if settings not in ("defaults", "torchkube"):
            raise ValueError(f"settings must be 'defaults' or 'torchkube', not {settings!r}")
        self.job, self.workdir, self.settings = job, workdir, settings
        self.share_store = share_store
        self.checkpoint_dir = workdir / "checkpoints"
        self.log_dir = workdir / "logs"
        self.port = free_port()
        self.agents: list[subprocess.Popen[bytes]] = []

    def command(self, host: bool) -> list[str]:
        replicas = self.job.spec.replicas
        flags = [
            f"--nnodes={replicas.min}:{replicas.max}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            f"--rdzv-id={self.job.name}",
            "--max-restarts=10",
        ]
        is_host = f"is_host={str(host).lower()}"
        if self.settings == "torchkube":
            conf, monitor = torchkube_rdzv_conf(self.job)
            flags += [f"--rdzv-conf={conf},{is_host}", f"--monitor-interval={monitor}"]
        else:
            flags.append(f"--rdzv-conf={is_host}")
        return [sys.executable, "-m", "torch.distributed.run", *flags, "-m", "torchkube.trainer"]

    def env(self, index: int, hold_at: int | None = None) -> dict[str, str]:
        env = worker_env(self.job, index, self.checkpoint_dir)
        env["LOGLEVEL"] = "INFO"  # the agents' rendezvous milestones, with times
        if not self.share_store:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        if hold_at is not None:
            env[Env.CHAOS_HOLD_AT_STEPS] = chaos_hold_steps_value([hold_at])
        return env

    def _start(self, index: int, hold_at: int | None = None) -> subprocess.Popen[bytes]:
        agent = subprocess.Popen(
            self.command(host=index == 0),
            env=self.env(index, hold_at),
            stdout=(self.log_dir / f"worker-{index}.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.agents.append(agent)
        return agent

    def progress(self) -> ProgressReport | None:
        return read_progress(self.checkpoint_dir)

    def run(
        self,
        kill_step: int,
        victim: str,
        timeout: float,
        target: Literal["agent", "trainer"] = "agent",
        watch: Callable[[ProgressReport | None], None] | None = None,
        hold: bool = False,
        replace_after: float | None = None,
    ) -> PlainResult:
        """Train; once past ``kill_step`` SIGKILL the ``victim`` agent's tree (``host`` or
        ``other``), or with ``target="trainer"`` its training process alone; wait for the
        survivor to end (or ``timeout`` seconds in all). ``watch`` sees each progress record
        read (every 0.1 s). ``hold``: the victim's trainer stops itself once ``kill_step`` is
        done and the kill waits for that. ``replace_after``: the killed agent is started again
        (without the hold) that many seconds after the kill."""
        if replace_after is not None and target != "agent":
            raise ValueError("only a whole agent killed is replaced")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        killed_at: float | None = None
        killed_step: int | None = None
        replaced_at: float | None = None
        doomed_index = 0 if victim == "host" else 1
        try:
            for index in range(AGENTS):
                self._start(index, kill_step if hold and index == doomed_index else None)
            doomed, survivor = self.agents[doomed_index], self.agents[1 - doomed_index]
            while time.monotonic() < deadline and survivor.poll() is None:
                record = self.progress()
                if watch is not None:
                    watch(record)
                if killed_at is None:
                    if hold:
                        trainers = workers_of(doomed.pid, children_of())
                        due = any(stopped(pid) for pid in trainers)
                    else:
                        due = bool(record and record.step >= kill_step)
                        wanted = due and target == "trainer"
                        trainers = workers_of(doomed.pid, children_of()) if wanted else []
                    if due and target == "agent":
                        killed_at = time.time()
                        killed_step = kill_step if hold else record.step if record else None
                        kill_tree(doomed.pid)
                        doomed.wait()
                    elif due and trainers:
                        killed_at = time.time()
                        killed_step = kill_step if hold else record.step if record else None
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(trainers[0], signal.SIGKILL)
                elif (
                    replace_after is not None
                    and replaced_at is None
                    and time.time() >= killed_at + replace_after
                ):
                    replaced_at = time.time()
                    self._start(doomed_index)
                time.sleep(0.1)
        finally:
            end_all(self.agents)
        record = self.progress()
        return PlainResult(
            killed_at,
            killed_step,
            self.log_dir,
            [agent.returncode for agent in self.agents],
            bool(record and record.finished),
            replaced_at,
        )
