"""spec.data against the real apiserver and the session's operator, on KWOK nodes: the prepare
pod comes first and alone, its end (faked the way a kubelet reports it: phase, exit code,
termination message) decides whether the workers start or the job fails."""

import json
from typing import Any

import pytest
from kube_jobs import Job

from testbed import faults
from testbed.wait import wait_for
from torchkube.api import labels as lbl
from torchkube.api.contract import PrepareReport

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SOURCE = {"path": "/opt/corpus"}


def prepare_pod(job: Job, attempt: int = 1) -> Any:
    """The job's prepare pod ``attempt``, once Running on its KWOK node."""

    def running() -> Any:
        pods = [p for p in job.pods(lbl.ROLE_PREPARE) if p.metadata.name.endswith(f"-{attempt}")]
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    found: Any = job.wait(running, 60, f"prepare pod {attempt} Running")
    return found


def test_workers_start_only_after_the_prepare_pod_succeeded(
    make_job: Any, isolated_pool: Any, api_client: Any
) -> None:
    pool = isolated_pool(nodes=2)
    job = make_job("prep", pool, replicas={"min": 2, "max": 2}, data={"source": SOURCE})
    pod = prepare_pod(job)
    status = job.status()
    assert status["data"]["phase"] == "Preparing" and status["data"]["pod"] == pod.metadata.name
    ready = next(c for c in status["conditions"] if c["type"] == "DataReady")
    assert ready["status"] == "False" and ready["reason"] == "Preparing"
    assert job.pods() == [] and job.pods(lbl.ROLE_RENDEZVOUS) == []

    report = PrepareReport(
        source="image:/opt/corpus",
        tokenizer="bytes",
        tokenizer_note="bytes: tiktoken is not installed",
        documents=40,
        train_tokens=123_456,
        val_tokens=6_500,
        vocab_size=257,
    )
    faults.succeed_pod(
        api_client, pod.metadata.name, job.namespace, message=json.dumps(report.to_wire())
    )
    workers = job.wait_running(2)
    data = job.status()["data"]
    assert data["phase"] == "Prepared" and data["tokenizer"] == "bytes"
    assert data["trainTokens"] == 123_456 and data["tokenizerNote"].startswith("bytes:")
    ready = next(c for c in job.status()["conditions"] if c["type"] == "DataReady")
    assert ready["status"] == "True" and "123,456 training" in ready["message"]
    env = {e.name: e.value for e in workers[0].spec.containers[0].env}
    assert json.loads(env["TORCHKUBE_TRAINER_CONFIG"])["dataPath"] == "/checkpoints/data/train.bin"
    job.wait_event("DataPrepared")


def test_a_permanent_prepare_failure_fails_the_job_with_its_reason(
    make_job: Any, isolated_pool: Any, api_client: Any
) -> None:
    pool = isolated_pool(nodes=1)
    job = make_job("prepfail", pool, replicas={"min": 1, "max": 1}, data={"source": SOURCE})
    # A transient failure first: a second prepare pod is started.
    first = prepare_pod(job)
    faults.fail_pod(api_client, first.metadata.name, job.namespace, exit_code=1, message="boom")
    second = prepare_pod(job, 2)
    words = "torchkube prepare-data: input /opt/corpus does not exist"
    faults.fail_pod(api_client, second.metadata.name, job.namespace, exit_code=3, message=words)
    wait_for(lambda: job.status().get("phase") == "Failed", 60, what="the job to fail")
    status = job.status()
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DataPreparationFailed"
    assert "input /opt/corpus does not exist" in failed["message"]
    assert status["data"]["phase"] == "Failed" and status["data"]["attempts"] == 2
    assert job.pods() == []  # no worker ever started
