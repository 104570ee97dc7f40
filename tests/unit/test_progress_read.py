"""The operator's read of a running job's progress: one answer from one worker pod is enough,
but a live-recovery hot spare standing by answers with no training to report, and a job's
status must not go back to step 0 because the spare answered first."""

import json

from stub_http import Reply, StubServer

from torchkube.api.contract import LiveProgress, ProgressReport
from torchkube.operator.progress import read_progress


def worker(name: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"torchkube.io/role": "worker"},
        },
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "containerStatuses": [{"name": "trainer", "ready": True, "state": {"running": {}}}],
        },
    }


def test_a_standby_spares_report_is_passed_over_for_a_training_groups() -> None:
    standby = ProgressReport(
        live=LiveProgress(replica_groups=0, grad_accum_steps=1, standing_by=True)
    )
    training = ProgressReport(step=420, live=LiveProgress(replica_groups=2, grad_accum_steps=1))
    reports = {"/spare/progress": standby, "/trainer/progress": training}

    def answer(path: str) -> Reply | None:
        report = reports.get(path)
        return None if report is None else Reply(json.dumps(report.to_wire()).encode())

    server = StubServer(answer)
    try:
        template = "http://{pod_ip}:{port}/{pod}/progress"
        pods = [worker("spare"), worker("trainer")]
        report, responder = read_progress(template, pods, server.port, preferred="spare")
    finally:
        server.close()
    assert responder == "trainer" and report is not None and report.step == 420
    assert server.requests == ["/spare/progress", "/trainer/progress"]
