"""Real torchrun agents on loopback for the elastic tests: the launcher as a pod runs it, the
rendezvous store as a killable process, and the steps the workload logged."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from torchkube.api.worker_launch import TORCHRUN_MONITOR_INTERVAL
from torchkube.elastic.warm import workers_of
from torchkube.local.ports import free_port

SCRIPT = Path(__file__).parent / "elastic" / "steps_script.py"


def rdzv_args(
    port: int,
    *,
    nnodes: str = "1:2",
    max_restarts: int = 10,
    join_timeout: int = 90,
    keep_alive: int = 1,
    last_call: int = 2,
    monitor_interval: float = TORCHRUN_MONITOR_INTERVAL,
) -> list[str]:
    conf = (
        f"is_host=false,join_timeout={join_timeout},last_call_timeout={last_call},close_timeout=5,"
        f"keep_alive_interval={keep_alive},keep_alive_max_attempt=3"
    )
    return [
        f"--nnodes={nnodes}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=test-job",
        f"--rdzv-conf={conf}",
        f"--max-restarts={max_restarts}",
        f"--monitor-interval={monitor_interval}",
        "--local-addr=127.0.0.1",
    ]


def launch(args: list[str], out: Path, agent: str, **env: str) -> subprocess.Popen[bytes]:
    log = (out / f"{agent}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "torchkube.elastic.launch", *args, str(SCRIPT)],
        env={**os.environ, "OUT": str(out), "AGENT": agent, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


class Store:
    """The rendezvous store process, killable and restartable on its port like the store
    pod's container (restartPolicy Always: same name, same address)."""

    def __init__(self, out: Path) -> None:
        self.port = free_port()
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchkube.elastic.store", "--port", str(self.port)],
            stdout=(self.out / "store.log").open("ab"),
            stderr=subprocess.STDOUT,
        )

    def listening(self) -> bool:
        """Whether the store accepts connections (its start imports torch: seconds)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)


def trained_together(out: Path, at_least: int) -> bool:
    """``at_least`` steps logged, the last by both agents: an agent that arrives more than
    the rendezvous' last call (2 s) after the first finds it training alone, for a while."""
    logged = steps(out)
    return len(logged) >= at_least and logged[-1][1] == 2


def steps(out: Path) -> list[tuple[int, int, str]]:
    path = out / "steps.log"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(step), int(world), agent) for step, world, agent in rows]


def wait_for(predicate, timeout: float, what: str, out: Path):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.log")))
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")


def kill_agent(out: Path, agent: str) -> None:
    """SIGKILL an agent and its workers, as a node loss would. torchrun starts each worker
    in a session of its own, so they are found by their environment, not their group."""
    wanted = {f"OUT={out}".encode(), f"AGENT={agent}".encode()}
    for proc in Path("/proc").iterdir():
        try:
            environ = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if proc.name.isdigit() and wanted <= environ:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def worker_pids(out: Path, agent: str) -> list[int]:
    """The worker processes (not the agent, nor its forkserver) of ``agent``."""
    wanted = {f"OUT={out}".encode(), f"AGENT={agent}".encode()}
    children: dict[int, list[int]] = {}
    launchers = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = set((proc / "environ").read_bytes().split(b"\0"))
            cmdline = (proc / "cmdline").read_bytes()
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(parent, []).append(int(proc.name))
        if wanted <= environ and b"torchkube.elastic.launch" in cmdline:
            launchers.append(int(proc.name))
    return [pid for launcher in launchers for pid in workers_of(launcher, children)]
