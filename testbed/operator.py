"""Run the operator as a real process against a test cluster (tests, benchmarks, dev cluster).

A subprocess, not an in-process kopf runner: tests kill it with SIGKILL mid-failure and start
it again, exactly as a crashed or rescheduled operator pod would be.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from testbed.wait import wait_for
from torchkube.local.logs import tail
from torchkube.local.ports import free_port


class OperatorProcess:
    """``torchkube operator`` with a kubeconfig, its own ports and a log file."""

    def __init__(self, kubeconfig: Path, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.extra_env = dict(env or {})
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> OperatorProcess:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            # KWOK pods have made-up IPs: never send progress requests to them.
            "TORCHKUBE_PROGRESS_URL": "",
            "TORCHKUBE_METRICS_PORT": str(self.metrics_port),
            "TORCHKUBE_HEALTH_PORT": str(self.health_port),
            "TORCHKUBE_RESYNC_SECONDS": "5",
            **self.extra_env,
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchkube.cli", "operator"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self.healthy, timeout, what="the operator's /healthz", describe_last=self.tail)
        return self

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(
                f"the operator exited ({self.proc and self.proc.returncode}):\n{self.tail()}"
            )
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}/healthz", timeout=1
            ) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def metrics(self, names: Sequence[str] = ()) -> str:
        """The exposition; with ``names``, only the samples named (prometheus_client's
        ``name[]`` filter): a benchmark that polls the operator while counting its CPU must
        not have it format every family each time."""
        query = urllib.parse.urlencode([("name[]", name) for name in names])
        url = f"http://127.0.0.1:{self.metrics_port}/metrics" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url) as response:
            return str(response.read().decode())

    def tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log yet)"
        return tail(self.log_path, lines)

    def kill(self) -> None:
        """SIGKILL: no clean-up, as when a node or the container dies."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
