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
from pathlib import Path

import pytest

from testbed.cluster import Cluster, ClusterConfig
from testbed.docker import BuiltImage, Docker, DockerDaemon, build_image, ensure_base_image
from testbed.pytest_plugin import uncaptured

REPO = Path(__file__).resolve().parents[1]
TRAINER_TAG = "torchkube/trainer:test"
NODE_MONITOR_GRACE_S = 20
"""The real-node cluster's node-monitor grace period (test_real_nodes counts on it)."""

Say = Callable[[str], None]


def say_past_capture(request: pytest.FixtureRequest, prefix: str) -> Say:
    """Print past pytest's capture: image builds and imports run for minutes."""

    def emit(message: str) -> None:
        with uncaptured(request):
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
    """Docker, the real-node cluster, the trainer build and its import into the nodes, in
    order, each step's result or error kept for the fixtures that wait on it.

    Messages from the thread are kept for the main thread to print (pytest's capture is not
    thread-safe); the main thread's own (a stop, a test's image load) are printed at once."""

    STEPS = ("docker", "cluster", "built", "loaded")

    def __init__(self, say: Say, trainer: bool) -> None:
        super().__init__(name="real-nodes-start", daemon=True)
        self.say = say
        self.trainer = trainer
        """Whether any selected test needs the trainer image (else no build, no import)."""
        self.messages: list[str] = []
        self.daemon_process = DockerDaemon(report=self._note)
        self.results: dict[str, object] = {}
        self.errors: dict[str, str] = {}
        self.finished = False
        self.changed = threading.Condition()
        self.cancel = threading.Event()
        self.release = threading.Event()

    def _note(self, message: str) -> None:
        if threading.current_thread() is threading.main_thread():
            self.say(message)
            return
        with self.changed:
            self.messages.append(message)

    def _settle(self, step: str, result: object = None, error: str = "") -> None:
        with self.changed:
            if error:
                self.errors[step] = error
            else:
                self.results[step] = result
            self.changed.notify_all()

    def _step(self, step: str, make: Callable[[], object]) -> object:
        """``make()`` as ``step``, unless the session is over; None when it failed."""
        if self.cancel.is_set():
            self._settle(step, error="the session ended first")
            return None
        try:
            result = make()
        except Exception as exc:
            self._settle(step, error=f"{type(exc).__name__}: {exc}")
            return None
        self._settle(step, result)
        return result

    def run(self) -> None:
        try:
            docker = self._step("docker", self.daemon_process.start)
            if not isinstance(docker, Docker):
                return
            cluster = self._step("cluster", self._start_cluster)
            if not self.trainer:
                return
            built = self._step("built", lambda: build_trainer(docker, self._note))
            if built is None:
                self._settle("loaded", error=f"no trainer image ({self.errors['built']})")
            elif isinstance(cluster, Cluster) and cluster.real_nodes is not None:
                self._step("loaded", lambda: cluster.real_nodes.load_image(docker, TRAINER_TAG))
            else:
                self._settle("loaded", error=f"no cluster ({self.errors['cluster']})")
        finally:
            with self.changed:
                cause = next(iter(self.errors.items()), None)
                for step in self.STEPS:
                    if step not in self.results and step not in self.errors:
                        self.errors[step] = (
                            f"not started: no {cause[0]} ({cause[1]})" if cause else "not asked for"
                        )
                self.finished = True
                self.changed.notify_all()
            self.release.wait()

    def _start_cluster(self) -> Cluster:
        config = ClusterConfig(
            pools=[], real_nodes=2, node_monitor_grace_period_s=NODE_MONITOR_GRACE_S
        )
        cluster = Cluster(config, report=self._note).start()
        assert cluster.real_nodes is not None
        self._note(
            f"cluster with real nodes up in {cluster.started_in_s:.1f} s; nodes "
            + ", ".join(f"{n.name} {n.started_in_s:.1f} s" for n in cluster.real_nodes.nodes)
        )
        return cluster

    def _flush(self) -> None:
        with self.changed:
            messages, self.messages = self.messages, []
        for message in messages:
            self.say(message)

    def settled(self, step: str, timeout: float = 3600) -> bool:
        """Wait until ``step`` has its result or its error; whether it has its result."""
        with self.changed:
            self.changed.wait_for(
                lambda: step in self.results or step in self.errors or self.finished, timeout
            )
        self._flush()
        return step in self.results

    def wait_for(self, step: str, timeout: float = 3600) -> object:
        """The result of ``step`` once it is there; fails the test with the reason it is not."""
        started = time.monotonic()
        if not self.settled(step, timeout):
            reason = self.errors.get(step, f"not there after {timeout:.0f} s")
            pytest.fail(f"real nodes: no {step} -- {reason}", pytrace=False)
        waited = time.monotonic() - started
        if waited > 1:
            self.say(f"waited {waited:.1f} s for {step}")
        return self.results[step]

    def stop(self, failed: bool) -> None:
        """Stop the cluster and a daemon started here, then let the thread end. A step under
        way is let finish (at most 10 minutes: an import); none starts after it."""
        self.cancel.set()
        with self.changed:
            done = self.changed.wait_for(lambda: self.finished, timeout=600)
        self._flush()
        if not done:
            self.say("the starter is still busy; what it started ends with this process")
            return
        try:
            cluster = self.results.get("cluster")
            if isinstance(cluster, Cluster):
                cluster.stop(failed=failed)
        finally:
            self.daemon_process.stop()
            self._flush()
            self.release.set()
            self.join(timeout=60)
