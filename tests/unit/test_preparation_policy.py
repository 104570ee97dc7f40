"""spec.data: the prepare pod before any worker, its report in the status, retries and the
job's failure (torchkube/operator/preparation.py, through the planner)."""

import json
from typing import Any

from planner import (
    NOW,
    child,
    condition,
    created_slots,
    make_job,
    own_children,
    pod,
    run,
    running_status,
)

from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.api.contract import PrepareReport
from torchkube.api.status import DataStatus, TrainingJobStatus
from torchkube.operator import builders
from torchkube.operator.preparation import MAX_ATTEMPTS

REPORT = PrepareReport(
    source="claim:corpus/texts",
    tokenizer="bytes",
    tokenizer_note="bytes: tiktoken is not installed",
    documents=12,
    train_tokens=9000,
    val_tokens=500,
    vocab_size=257,
)


def data_job(status: TrainingJobStatus | dict[str, Any] | None = None) -> TrainingJob:
    """Job ``demo`` (2 workers) whose data comes from claim ``corpus``."""
    source = {"claim": {"name": "corpus", "path": "texts"}}
    return make_job(status, replicas={"min": 2, "max": 2}, data={"source": source})


def prepare(attempt: int, phase: str = "Running", **kw: Any) -> dict[str, Any]:
    """Prepare pod ``attempt`` of job ``demo``, as the watch cache keeps it."""
    body = pod(0, phase=phase, role=lbl.ROLE_PREPARE, **kw)
    body["metadata"]["name"] = f"demo-prepare-{attempt}"
    return body


def prepared(plan: Any) -> DataStatus:
    assert plan.status.data is not None
    data: DataStatus = plan.status.data
    return data


def test_the_prepare_pod_comes_first_and_no_worker_before_it_succeeds() -> None:
    job = data_job(TrainingJobStatus())
    result = run(job, [], children=own_children())
    ((created),) = [result.create_pods]
    assert [p["metadata"]["name"] for p in created] == ["demo-prepare-1"]
    assert created_slots(result) == []
    assert prepared(result).phase == "Preparing" and prepared(result).attempts == 1
    assert condition(result, "DataReady")["status"] == "False"
    assert condition(result, "DataReady")["reason"] == "Preparing"
    # Running: nothing more is created, workers wait.
    result = run(data_job(result.status), [prepare(1)])
    assert result.create_pods == [] and result.status.phase == "Pending"


def test_no_prepare_pod_while_the_claims_name_belongs_to_someone_else() -> None:
    taken = [child("Service", "demo"), child("PersistentVolumeClaim", "demo-checkpoints", "x")]
    result = run(data_job(TrainingJobStatus()), [], children=taken)
    assert result.create_pods == []
    assert condition(result, "Created")["reason"] == "NameConflict"


def test_success_copies_the_report_into_the_status_and_starts_the_workers() -> None:
    done = prepare(1, phase="Succeeded", exit_code=0, reason="Completed", message="")
    done["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = json.dumps(
        REPORT.to_wire()
    )
    result = run(data_job(TrainingJobStatus()), [done])
    data = prepared(result)
    assert data.phase == "Prepared" and data.tokenizer == "bytes"
    assert data.tokenizer_note == "bytes: tiktoken is not installed"
    assert (data.train_tokens, data.val_tokens, data.documents) == (9000, 500, 12)
    ready = condition(result, "DataReady")
    assert ready["status"] == "True" and "tokenizer bytes" in ready["message"]
    assert created_slots(result) == [0, 1]
    assert any(e.reason == "DataPrepared" for e in result.events)
    # Prepared stays prepared: the pod may be gone (clean-up), workers go on.
    again = run(data_job(result.status), [])
    assert created_slots(again) == [0, 1] and prepared(again).phase == "Prepared"


def test_a_transient_failure_is_retried_in_a_new_pod_then_the_job_fails() -> None:
    failed = [prepare(1, phase="Failed", exit_code=1, message="GET https://x: timed out")]
    result = run(data_job(TrainingJobStatus()), failed)
    assert [p["metadata"]["name"] for p in result.create_pods] == ["demo-prepare-2"]
    assert result.status.phase == "Pending" and prepared(result).attempts == 2
    pods = [
        prepare(n, phase="Failed", exit_code=1, message="GET https://x: timed out")
        for n in range(1, MAX_ATTEMPTS + 1)
    ]
    result = run(data_job(TrainingJobStatus()), pods)
    assert result.create_pods == []
    assert result.status.phase == "Failed"
    failed_condition = condition(result, "Failed")
    assert failed_condition["reason"] == "DataPreparationFailed"
    assert (
        "timed out" in failed_condition["message"] and "3 attempts" in failed_condition["message"]
    )


def test_a_permanent_failure_fails_the_job_at_once_with_the_steps_words() -> None:
    words = "torchkube prepare-data: GET https://x/a.txt: HTTP 404 Not Found"
    result = run(data_job(TrainingJobStatus()), [prepare(1, "Failed", exit_code=3, message=words)])
    assert result.status.phase == "Failed" and result.create_pods == []
    message = condition(result, "Failed")["message"]
    assert "HTTP 404 Not Found" in message and "permanent" in message
    assert prepared(result).phase == "Failed"
    assert condition(result, "DataReady")["reason"] == "DataPreparationFailed"


def test_an_exit_0_without_a_report_is_a_failure_that_names_the_image() -> None:
    done = prepare(1, phase="Succeeded", exit_code=0, reason="Completed", message="hello")
    result = run(data_job(TrainingJobStatus()), [done])
    assert result.status.phase == "Failed"
    assert "torchkube trainer image" in condition(result, "Failed")["message"]


def test_jobs_without_data_have_no_prepare_step() -> None:
    job = make_job(replicas={"min": 2, "max": 2})
    result = run(job, [], children=own_children())
    assert created_slots(result) == [0, 1] and result.status.data is None


def test_prepare_pod_reads_the_source_claim_and_writes_to_the_checkpoint_volume() -> None:
    job = data_job()
    body = builders.prepare_pod(job, 2)
    assert body["metadata"]["name"] == "demo-prepare-2"
    assert body["metadata"]["labels"][lbl.ROLE] == "prepare"
    (container,) = body["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["torchkube", "prepare-data"]
    assert json.loads(command[command.index("--source") + 1]) == {
        "claim": {"name": "corpus", "path": "texts"}
    }
    assert command[command.index("--output") + 1] == "/checkpoints/data"
    assert command[command.index("--report") + 1] == "/dev/termination-log"
    assert command[command.index("--claim-mount") + 1] == "/data-source"
    volumes = {v["name"]: v["persistentVolumeClaim"] for v in body["spec"]["volumes"]}
    assert volumes == {
        "checkpoints": {"claimName": "demo-checkpoints"},
        "data-source": {"claimName": "corpus", "readOnly": True},
    }
    assert body["spec"]["restartPolicy"] == "Never"
    # The workers then read what it wrote.
    worker = builders.worker_pod(job, 0, "x")
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    trainer = json.loads(env["TORCHKUBE_TRAINER_CONFIG"])
    assert trainer["dataPath"] == "/checkpoints/data/train.bin"
    assert trainer["evalDataPath"] == "/checkpoints/data/val.bin"


def test_a_running_job_keeps_its_workers_after_the_status_says_prepared() -> None:
    status = running_status(data=DataStatus(phase="Prepared", source="x").to_wire())
    result = run(data_job(status), [pod(0), pod(1), pod(0, role="rendezvous")], now=NOW)
    assert result.create_pods == [] and result.delete_pods == []
