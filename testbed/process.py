"""One control-plane component as an operating-system process: start, watch, log, stop.

Each component runs in its own process group (so ``stop`` also reaches anything it forked) with
stdout and stderr in one log file. On Linux the child is asked to die with its parent, so a test
run killed with SIGKILL does not leave an apiserver behind holding ports.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from testbed.errors import ClusterError
from torchkube.local.logs import tail

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """Linux only: deliver SIGTERM to this child when the thread that started it exits."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Process:
    """A named child process with its own process group and log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The process id, once started."""
        return self._popen.pid if self._popen else None

    def start(self) -> Process:
        """Start the process; a missing or unexecutable binary raises :class:`ClusterError`."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )
            except OSError as exc:
                raise ClusterError(self.name, f"cannot execute {self.argv[0]}: {exc}") from exc
        return self

    def returncode(self) -> int | None:
        """The exit status, or None while it runs (or before it started)."""
        return self._popen.poll() if self._popen else None

    def alive(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._popen is not None and self._popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The last lines of this component's log."""
        return tail(self.log_path, lines)

    def error(self, reason: str) -> ClusterError:
        """A :class:`ClusterError` for this component with the tail of its log."""
        return ClusterError(self.name, reason, self.log_path, self.tail())

    def check_alive(self) -> None:
        """Raise :class:`ClusterError` if the process has exited."""
        code = self.returncode()
        if code is not None:
            raise self.error(f"exited with code {code}")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the whole process group (no-op once it is gone)."""
        if self._popen is None or self._popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signum)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for exit; return whether it exited."""
        if self._popen is None:
            return True
        try:
            self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the process group and reap it: an abrupt loss, like a machine dying."""
        self.signal(signal.SIGKILL)
        self.wait(10)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        self.signal(signal.SIGTERM)
        if not self.wait(timeout):
            self.kill()


def stop_all(processes: Sequence[Process], timeout: float = 5.0) -> None:
    """Stop several processes at once: SIGTERM all, wait for all, SIGKILL stragglers."""
    for proc in processes:
        proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in processes:
        if not proc.wait(max(0.0, deadline - time.monotonic())):
            proc.kill()
