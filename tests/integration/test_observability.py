"""The metrics and dashboards against a real Prometheus.

One scenario, everything real except the GPUs: Debian's Prometheus on loopback scrapes
(1 s interval, ``honor_labels`` as docs/metrics.md asks) the session's operator and the two
workers of a real CPU training run by the local runner (``torchkube run``, a
worker SIGKILLed at step 60). Meanwhile a TrainingJob of the same name and namespace runs on
KWOK nodes through a worker failure and a node loss, its "trainer" simulated through the
operator's progress endpoint, so restart, replacement, recovery and goodput metrics have data.

Then every PromQL expression of the dashboards (panels, annotations, variables) is evaluated
through Prometheus' HTTP API as Grafana would, with the template variables filled in, and must
return data (the DCGM panels need only be valid); the metric names, types and labels in
docs/metrics.md must match what the two endpoints expose; and ``torchkube plot`` draws the run.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from testbed import dashboards as d
from testbed import faults
from testbed.kwok import POOL_LABEL, NodePool, kwok_toleration
from testbed.operator import OperatorProcess
from testbed.prometheus import Prometheus, ScrapeJob
from testbed.volumes import delete_volume, prebound_volume
from testbed.wait import wait_for
from torchkube.api import GROUP, PLURAL, VERSION
from torchkube.api import labels as lbl
from torchkube.api.times import format_time
from torchkube.local.plot import read_run, render

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB = "quickstart"


class FakeTrainer:
    """What the KWOK job's trainer would report on ``GET /progress`` (KWOK pods run nothing):
    4 steps a second while every worker runs, a checkpoint every 20 steps, and after a worker
    is lost a restart from the newest checkpoint 1 s after all workers run again. Rank 1 is
    the slowest rank, 1.2× the other's compute time, or 3× while its pod is ``straggler``."""

    def __init__(self, api: Any, namespace: str, reports: dict[tuple[str, str], Any]) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.reports = namespace, reports
        self.step = self.checkpoint = self.resumes = 0
        self.straggler: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _running(self) -> list[str]:
        selector = f"{lbl.JOB_NAME}={JOB},{lbl.ROLE}={lbl.ROLE_WORKER}"
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return sorted(
            p.metadata.name
            for p in pods
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
        )

    def _run(self) -> None:
        members: list[str] = []
        restart_at: float | None = None
        while not self.stop.wait(0.25):
            running = self._running()
            if len(running) < 2 or (members and running != members):
                members, restart_at = [], None  # the group broke up: training stops
            elif not members:
                if restart_at is None:
                    restart_at = time.monotonic() + 1.0
                if time.monotonic() >= restart_at:
                    members = running
                    if self.step:  # resume from the newest checkpoint
                        self.step, self.resumes = self.checkpoint, self.resumes + 1
            else:
                self.step += 1
                if self.step % 20 == 0:
                    self.checkpoint = self.step
            report = {
                "step": self.step,
                "totalSteps": 100_000,
                "loss": 3.0,
                "tokensPerSecond": 4096.0,
                "worldSize": 2,
                "lastCheckpointStep": self.checkpoint,
                "resumes": self.resumes,
                "finished": False,
                "updated": format_time(datetime.now(UTC)),
            }
            if members:
                slowdown = 3.0 if members[1] == self.straggler else 1.2
                report["slowestRank"] = {
                    "rank": 1,
                    "pod": members[1],
                    "computeSeconds": 0.25 * slowdown / (1 + slowdown),
                    "medianSeconds": 0.25 / (1 + slowdown),
                    "slowdown": slowdown,
                }
            for pod in members:
                self.reports[(self.namespace, pod)] = report

    def __enter__(self) -> "FakeTrainer":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


class TrainerRun:
    """The quick-start job trained for real by ``torchkube run`` (a worker killed at step 60),
    its workers' metrics ports read from the runner's output."""

    def __init__(self, tmp_path: Path) -> None:
        manifest = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
        manifest["spec"]["trainer"]["evalIntervalSteps"] = 50  # so eval loss has data
        manifest["spec"]["trainer"]["evalBatches"] = 2
        self.job_file = tmp_path / "quickstart.yaml"
        self.job_file.write_text(yaml.safe_dump(manifest))
        self.workdir = tmp_path / "run"
        self.output = tmp_path / "torchkube-run.out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> list[int]:
        """Start the run; returns the workers' metrics ports (printed before they start)."""
        # A made-up device peak so MFU is a number on CPU (the trainer reads it from its env).
        env = {**os.environ, "TORCHKUBE_PEAK_FLOPS": "1e12"}
        argv = [sys.executable, "-m", "torchkube.cli", "run", str(self.job_file), "--fresh"]
        argv += ["--workdir", str(self.workdir), "--chaos-at-step", "60"]
        with self.output.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

        def ports() -> list[int] | None:
            text = self.output.read_text()
            line = next((x for x in text.splitlines() if x.startswith("metrics: ")), None)
            if line is None:
                assert self.proc is not None and self.proc.poll() is None, text
                return None
            return [int(port) for port in re.findall(r"127\.0\.0\.1:(\d+)/metrics", line)]

        found: list[int] = wait_for(ports, 60, what="torchkube run to print its metrics ports")
        self.ports = found
        return found

    def metrics_text(self) -> str:
        """``/metrics`` of the first worker that answers (all families exist from the start)."""

        def fetch() -> str | None:
            for port in self.ports:
                try:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/metrics", timeout=1
                    ) as response:
                        return str(response.read().decode())
                except OSError:
                    continue
            assert self.proc is not None and self.proc.poll() is None, self.output.read_text()
            return None

        text: str = wait_for(fetch, 120, interval=0.5, what="a trainer's /metrics")
        return text

    def wait(self, timeout: float) -> str:
        """Until the run ends; it must succeed. Returns its output."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"torchkube run took longer than {timeout:.0f}s") from None
        text = self.output.read_text()
        assert code == 0, f"torchkube run exited {code}:\n{text[-3000:]}"
        return text

    def stop(self) -> None:
        """SIGINT, as Ctrl-C: the runner stops its workers (they run in sessions of their own)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[TrainerRun]:
    run = TrainerRun(tmp_path)
    yield run
    run.stop()  # a failed test must not leave workers behind


def kwok_job(api: Any, namespace: str, pool: NodePool, volume_dir: Path) -> None:
    prebound_volume(api, namespace, f"{JOB}-checkpoints", str(volume_dir))
    body = {
        "apiVersion": "torchkube.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": JOB},
        "spec": {
            "replicas": {"min": 2, "max": 2},
            "resources": {"gpus": 8},
            "failurePolicy": {"replaceStragglers": True, "stragglerSeconds": 10},
            "scheduling": {
                "tolerations": [kwok_toleration()],
                "nodeSelector": {POOL_LABEL: pool.name},
                # One domain, the pool: the dashboard's placement panels have data.
                "topology": {"level": POOL_LABEL, "mode": "preferred"},
            },
        },
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


def running_workers(api: Any, namespace: str) -> list[Any]:
    selector = f"{lbl.JOB_NAME}={JOB},{lbl.ROLE}={lbl.ROLE_WORKER}"
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def job_status(api: Any, namespace: str) -> dict[str, Any]:
    body = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, JOB
    )
    return dict(body.get("status") or {})


def wait_restored(api: Any, namespace: str, restarts: int, avoid: set[str]) -> None:
    """Two workers Running again, none of them a lost one, and the failure counted."""

    def restored() -> bool:
        pods = running_workers(api, namespace)
        names = {p.metadata.name for p in pods}
        nodes = {p.spec.node_name for p in pods}
        return (
            len(pods) == 2
            and not names & avoid
            and not nodes & avoid
            and job_status(api, namespace).get("restarts") == restarts
        )

    wait_for(
        restored,
        60,
        what=f"2 workers Running after failure {restarts}",
        describe_last=lambda: str(job_status(api, namespace)),
    )


def test_dashboards_and_docs_against_a_real_prometheus(
    api_client: Any,
    namespace: str,
    operator: OperatorProcess,
    progress_reports: Any,
    isolated_pool: Any,
    trainer: TrainerRun,
    tmp_path: Path,
) -> None:
    pool = isolated_pool(nodes=3)
    ports = trainer.start()
    jobs = [
        ScrapeJob("torchkube-operator", [f"127.0.0.1:{operator.metrics_port}"]),
        # Kubernetes service discovery would add the pod's namespace as a target label.
        ScrapeJob("torchkube-workers", [f"127.0.0.1:{p}" for p in ports], {"namespace": namespace}),
    ]
    volume = f"pv-{namespace}-{JOB}-checkpoints"
    with Prometheus(tmp_path / "prometheus", jobs) as prom:
        started = time.time()
        # Scraped before the job exists, so the start-up histogram's increase is seen.
        prom.wait_for_series("torchkube_job_startup_seconds_count")
        trainer_text = trainer.metrics_text()  # while it runs: a fast run is over in 40 s
        kwok_job(api_client, namespace, pool, tmp_path / "volume")
        try:
            with FakeTrainer(api_client, namespace, progress_reports.reports) as fake:
                run_kwok_scenario(api_client, namespace, prom, fake)
            output = trainer.wait(timeout=300)
        finally:
            delete_volume(api_client, volume)
        print(output[output.index("quickstart: succeeded") :])
        time.sleep(3)  # the last scrapes of the operator's final values
        ended = time.time()

        # The faults come faster than a pace window (20 s of steps): no time left is estimated.
        unmeasured = ["torchkube_job_estimated_remaining_seconds"]
        checked = d.evaluate(
            prom, {"namespace": namespace, "job": JOB}, started, ended, unexercised=unmeasured
        )
        print(f"{checked} dashboard expressions returned data")

        goodput = prom.query(f'torchkube_job_goodput_ratio{{namespace="{namespace}", job="{JOB}"}}')
        assert goodput and 0 < float(goodput[0]["value"][1]) < 1
        lost = prom.query(
            f'sum by (cause) (torchkube_job_badput_seconds_total{{namespace="{namespace}", '
            f'job="{JOB}"}})'
        )
        by_cause = {r["metric"]["cause"]: float(r["value"][1]) for r in lost}
        print(f"badput by cause: {by_cause}")
        assert by_cause["recovery"] > 0 and by_cause["scheduling"] > 0
        status = job_status(api_client, namespace)
        assert 0 < status["goodput"] < 1, status

    documented = d.documented_metrics()
    operator_docs = {k: v for k, v in documented.items() if not k.startswith("torchkube_train_")}
    trainer_docs = {k: v for k, v in documented.items() if k.startswith("torchkube_train_")}
    assert d.compare_metrics(operator_docs, d.exposed_metrics(operator.metrics())) == []
    assert d.compare_metrics(trainer_docs, d.exposed_metrics(trainer_text)) == []

    run = read_run(trainer.workdir)
    assert len(run.failures) == 1 and run.steps[-1].step == 200
    picture = render(run, tmp_path / "run.png")
    assert picture.read_bytes()[:4] == b"\x89PNG"


def run_kwok_scenario(api: Any, namespace: str, prom: Prometheus, fake: FakeTrainer) -> None:
    """Start, a worker exiting 137, the node of another worker deleted, a worker ended by its
    hang watchdog (124), then the slowest rank a straggler until its pod is replaced."""
    wait_for(lambda: len(running_workers(api, namespace)) == 2, 60, what="2 running workers")
    prom.wait_for_series(
        f'torchkube_job_restarts_total{{namespace="{namespace}", job="{JOB}", reason="ExitCode"}}'
    )
    time.sleep(4)  # some training
    victim = running_workers(api, namespace)[0].metadata.name
    faults.fail_pod(api, victim, namespace, exit_code=137)
    wait_restored(api, namespace, 1, {victim})
    time.sleep(5)  # training passes the step it had reached
    pod = running_workers(api, namespace)[0]
    faults.delete_node(api, pod.spec.node_name, wait=False)
    wait_restored(api, namespace, 2, {pod.metadata.name, pod.spec.node_name})
    time.sleep(5)
    hung = running_workers(api, namespace)[0].metadata.name
    faults.fail_pod(api, hung, namespace, exit_code=124)
    wait_restored(api, namespace, 3, {hung})
    time.sleep(5)
    slow = max(p.metadata.name for p in running_workers(api, namespace))
    fake.straggler = slow  # rank 1 of the sorted members: 3× the median for 10 s → replaced

    def straggler_replaced() -> dict[str, Any] | None:
        status = job_status(api, namespace)
        last = status.get("lastFailure") or {}
        names = {p.metadata.name for p in running_workers(api, namespace)}
        done = last.get("reason") == "Straggler" and len(names) == 2 and slow not in names
        return status if done else None

    status = wait_for(straggler_replaced, 60, what="the straggler replaced")
    assert "exitCode" not in status["lastFailure"], status["lastFailure"]  # the Hang's is gone

    def no_straggler() -> dict[str, Any] | None:
        status = job_status(api, namespace)  # its replacement reports as rank 1, at 1.2×
        return None if "stragglingSince" in (status.get("slowestRank") or {}) else status

    wait_for(no_straggler, 30, what="the replacement not to be a straggler")
