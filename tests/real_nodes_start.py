"""The real nodes and their trainer image, made ready behind the e2e tests that come first
(the fixture is tests/e2e/conftest.py's ``real_nodes_start``).

Putting the trainer image (about 6 GB) on the two real nodes is minutes of disk I/O with little
CPU: ``docker save`` streamed into each node's containerd, which writes every layer again, as
containerd's importer does. Started at the first e2e test of a session that will run real-node
tests, it runs beside the chart's and the images' tests instead of before the real-node ones.

The starter is a thread that outlives what it starts: each component dies with the thread that
started it (``PR_SET_PDEATHSIG``, :mod:`testbed.process`), so the thread waits to be released
after the session has stopped them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import pytest

from testbed.cluster import Cluster, ClusterConfig
from testbed.docker import BuiltImage, Docker, DockerDaemon, build_image, ensure_base_image

REPO = Path(__file__).resolve().parents[1]
TRAINER_TAG = "torchkube/trainer:test"
NODE_MONITOR_GRACE_S = 20
"""The real-node cluster's node-monitor grace period (test_real_nodes counts on it)."""

Say = Callable[[str], None]


def say_past_capture(request: pytest.FixtureRequest, prefix: str) -> Say:
    """Print past pytest's capture: image builds and imports run for minutes."""
    capman = request.config.pluginmanager.getplugin("capturemanager")

    def emit(message: str) -> None:
        with capman.global_and_fixture_disabled() if capman else nullcontext():
            print(f"\n[{prefix}] {message}", flush=True)

    return emit


def build_trainer(docker: Docker, report: Say) -> BuiltImage:
    """The Dockerfile's trainer target on the local base (torch from the package index)."""
    base = ensure_base_image(docker, report=report)
    return build_image(
        docker,
        REPO,
        "trainer",
        TRAINER_TAG,
        {"PYTHON_BASE": base, "TRAINER_BASE": base},
        report=report,
    )


class RealNodesStart(threading.Thread):
    """Docker, the trainer build, the real-node cluster and the image on its nodes, in order.

    Messages are kept for the main thread to print (pytest's capture is not thread-safe); a
    failure is kept and raised to the fixture that waits for the step it broke."""

    def __init__(self) -> None:
        super().__init__(name="real-nodes-start", daemon=True)
        self.messages: list[str] = []
        self.daemon_process = DockerDaemon(report=self._note)
        self.results: dict[str, object] = {}
        self.error: BaseException | None = None
        self.finished = False
        self.changed = threading.Condition()
        self.release = threading.Event()

    def _note(self, message: str) -> None:
        with self.changed:
            self.messages.append(message)

    def _done(self, step: str, result: object) -> None:
        with self.changed:
            self.results[step] = result
            self.changed.notify_all()

    def run(self) -> None:
        try:
            docker = self.daemon_process.start()
            self._done("docker", docker)
            self._done("built", build_trainer(docker, self._note))
            config = ClusterConfig(
                pools=[], real_nodes=2, node_monitor_grace_period_s=NODE_MONITOR_GRACE_S
            )
            cluster = Cluster(config, report=self._note)
            self._done("cluster", cluster.start())
            assert cluster.real_nodes is not None
            self._note(
                f"cluster with real nodes up in {cluster.started_in_s:.1f} s; nodes "
                + ", ".join(f"{n.name} {n.started_in_s:.1f} s" for n in cluster.real_nodes.nodes)
            )
            self._done("loaded", cluster.real_nodes.load_image(docker, TRAINER_TAG))
        except BaseException as exc:
            self.error = exc
        finally:
            with self.changed:
                self.finished = True
                self.changed.notify_all()
        self.release.wait()

    def wait_for(self, step: str, say: Say, timeout: float = 3600) -> object:
        """The result of ``step`` (``docker``, ``built``, ``cluster`` or ``loaded``) once it
        is there, printing what the thread reported meanwhile; fails the test with the
        starter's error."""
        started = time.monotonic()
        with self.changed:
            self.changed.wait_for(lambda: step in self.results or self.finished, timeout)
            messages, self.messages = self.messages, []
        for message in messages:
            say(message)
        if step not in self.results:
            reason = f"{type(self.error).__name__}: {self.error}" if self.error else "timed out"
            pytest.fail(f"real nodes: no {step} -- {reason}", pytrace=False)
        waited = time.monotonic() - started
        if waited > 1:
            say(f"waited {waited:.1f} s for {step}")
        return self.results[step]

    def stop(self, failed: bool) -> None:
        """Stop the cluster and a daemon started here, then let the thread end."""
        with self.changed:
            self.changed.wait_for(lambda: self.finished, timeout=600)
        cluster = self.results.get("cluster")
        if isinstance(cluster, Cluster):
            cluster.stop(failed=failed)
        self.daemon_process.stop()
        self.release.set()
        self.join(timeout=60)
