"""What the cluster commands print, without a cluster: tables, descriptions, the choice of the
rank-0 pod, error sentences and the local check of a job file.

Objects are built as the API returns them (camelCase, RFC 3339 times) by the small builders
below, and ``NOW`` is fixed, so every expected string is exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import training_jobs
import urllib3
import yaml
from click.testing import CliRunner
from kubernetes.client.exceptions import ApiException

from torchkube.api.status import ProgressRecord, TrainingJobStatus
from torchkube.cli import manifest, render
from torchkube.cli import pods as p
from torchkube.cli.cluster import follow_logs, logs, status, submit
from torchkube.cli.errors import (
    ClientError,
    Target,
    api_error,
    connection_error,
    refusal_details,
    translate,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
TARGET = Target("https://127.0.0.1:6443", "admin@test", "team-a", "/kubeconfig")


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


SPEC = {
    "image": "ghcr.io/torchkube/torchkube-trainer:0.1.0",
    "command": ["-m", "torchkube.trainer"],
    "args": [],
    "resources": {"gpus": 8, "gpuResourceName": "nvidia.com/gpu"},
    "nprocPerNode": "auto",
    "replicas": {"min": 2, "max": 4},
    "checkpoint": {"mountPath": "/checkpoints", "intervalSteps": 200, "keep": 3},
    "failurePolicy": {"maxRestarts": 10, "permanentExitCodes": [2, 3]},
    "runPolicy": {"suspend": False, "cleanPodPolicy": "Running"},
    "trainer": {"model": "gpt2", "strategy": "fsdp", "steps": 20000},
}
"""A job as the API server returns it, defaults filled in: what the CLI reads and renders."""


def job(name: str = "gpt", namespace: str = "team-a", **status: Any) -> dict[str, Any]:
    return training_jobs.manifest(
        name,
        SPEC,
        namespace=namespace,
        uid="u-1",
        created=NOW - timedelta(seconds=3600),
        status=status or None,
    )


def running_status(**extra: Any) -> dict[str, Any]:
    return {
        "phase": "Running",
        "workers": "4/4",
        "desiredReplicas": 4,
        "worldSize": 32,
        "restarts": 2,
        "restartsCountTowardsMax": 1,
        "progress": {
            "step": 1200,
            "totalSteps": 20000,
            "loss": 3.14159,
            "tokensPerSecond": 51234.4,
            "stepSeconds": 0.6,
            "estimatedRemainingSeconds": 11280,
            "remaining": "3h8m",
        },
        "latestCheckpoint": {"step": 1000, "time": ago(300)},
        **extra,
    }


def pod(
    name: str,
    slot: int | None,
    phase: str = "Running",
    created: float = 60,
    node: str | None = "node-a",
    **status: Any,
) -> dict[str, Any]:
    labels = {"torchkube.io/job-name": "gpt"}
    if slot is None:
        labels["torchkube.io/role"] = "rendezvous"
    else:
        labels |= {"torchkube.io/role": "worker", "torchkube.io/replica-index": str(slot)}
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels, "creationTimestamp": ago(created)},
        "spec": {"containers": [{"name": "trainer"}]},
        "status": {"phase": phase, **status},
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


def deleting(body: dict[str, Any]) -> dict[str, Any]:
    body["metadata"]["deletionTimestamp"] = ago(1)
    return body


# --- cells ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600 + 300, "3h5m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (50 * 3600, "2d2h"),
        (8 * 86400, "8d"),
        (2 * 365 * 86400 + 3 * 86400, "2y3d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_ages_read_like_kubectl(seconds: int, text: str) -> None:
    assert render.human_duration(seconds) == text


def test_cells_show_a_dash_for_what_is_not_reported_yet() -> None:
    status = TrainingJobStatus.lenient
    assert render.step_cell(None) == "-"
    assert render.step_cell(ProgressRecord(step=7)) == "7"
    assert render.step_cell(ProgressRecord(step=7, total_steps=100)) == "7/100 (7%)"
    assert render.loss_cell(ProgressRecord(step=1)) == "-"
    assert render.checkpoint_cell(status({}), NOW) == "-"
    assert render.checkpoint_cell(status({"latestCheckpoint": {"step": 5}}), NOW) == "5"
    assert render.goodput_cell(status({})) == "-"
    assert render.goodput_cell(status({"goodput": 0.9312})) == "93.1%"
    assert render.goodput_cell(status({"goodput": {"ratio": 0.5}})) == "50.0%", "older operators"
    assert render.goodput_cell(status({"goodput": "high", "phase": "Running"})) == "-"
    assert status({"goodput": "high", "phase": "Running"}).phase == "Running", "the rest is read"
    assert render.age(None, NOW) == "-"


# --- status -----------------------------------------------------------------------------


def test_status_table() -> None:
    jobs = [
        job("gpt", **running_status(goodput=0.95)),
        job("fresh"),
    ]
    assert render.status_table(jobs, NOW).splitlines() == [
        "NAME    PHASE     WORKERS   RESTARTS   STEP              REMAINING   LOS"
        "S     CHECKPOINT      GOODPUT   AGE",
        "gpt     Running   4/4       2          1200/20000 (6%)   3h8m        3.1"
        "416   1000 (5m ago)   95.0%     60m",
        "fresh   -         -         0          -                 -           -  "
        "      -               -         60m",
    ]


def test_status_table_says_which_queue_a_job_waits_in() -> None:
    queued = job("big", phase="Queued", queue={"name": "team-a", "workload": "trainingjob-big-1"})
    row = render.status_table([queued], NOW).splitlines()[1]
    assert row.split()[:3] == ["big", "Queued", "(team-a)"]
    status = render.status_of(queued)
    assert render.queue_line(status) == "waiting in LocalQueue team-a (Workload trainingjob-big-1)"
    status.queue = status.queue.model_copy(update={"admitted_workers": 2, "cluster_queue": "gpus"})
    assert "by ClusterQueue gpus at 2 workers" in render.queue_line(status)


def test_status_says_a_waiting_jobs_place_in_line_where_kueue_reports_it() -> None:
    place = {"positionInLocalQueue": 2, "positionInClusterQueue": 5}
    queued = job("big", phase="Queued", queue={"name": "team-a", "workload": "w", **place})
    row = render.status_table([queued], NOW).splitlines()[1]
    assert row.split()[1:5] == ["Queued", "(team-a,", "2", "ahead)"]
    status = render.status_of(queued)
    assert render.queue_line(status) == (
        "waiting in LocalQueue team-a, 2 ahead (5 ahead in its ClusterQueue) (Workload w)"
    )
    first = job("next", phase="Queued", queue={"name": "q", "positionInLocalQueue": 0})
    assert render.phase_cell(render.status_of(first)) == "Queued (q, next)"


def test_status_table_all_namespaces_and_wide() -> None:
    text = render.status_table(
        [job("gpt", namespace="b", **running_status())], NOW, all_namespaces=True, wide=True
    )
    header, row = text.splitlines()
    assert header.split() == [
        "NAMESPACE",
        "NAME",
        "PHASE",
        "WORKERS",
        "RESTARTS",
        "STEP",
        "REMAINING",
        "LOSS",
        "CHECKPOINT",
        "TOKENS/S",
        "WORLD",
        "GOODPUT",
        "AGE",
    ]
    assert row.split()[:2] == ["b", "gpt"] and "51,234" in row and " 32 " in row


# --- describe ---------------------------------------------------------------------------


def test_describe_has_every_section_in_order() -> None:
    failure = {
        "reason": "OOMKilled",
        "message": "worker 1 killed for memory",
        "pod": "gpt-worker-1-aaaaa",
        "node": "node-b",
        "exitCode": 137,
        "retryable": True,
        "time": ago(90),
    }
    body = job(
        **running_status(
            conditions=[
                {
                    "type": "Running",
                    "status": "True",
                    "reason": "WorkersRunning",
                    "message": "4 workers running",
                    "lastTransitionTime": ago(30),
                }
            ],
            failures=[failure],
        )
    )
    pods = [
        pod("gpt-worker-1-bbbbb", 1, created=30),
        pod("gpt-rendezvous-zzzzz", None, created=3000),
        pod(
            "gpt-worker-1-aaaaa",
            1,
            phase="Failed",
            created=3000,
            containerStatuses=[
                {"ready": False, "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
            ],
        ),
        deleting(pod("gpt-worker-0-ccccc", 0)),
    ]
    events = [
        {
            "type": "Warning",
            "reason": "WorkerFailed",
            "message": "worker gpt-worker-1-aaaaa exited with 137",
            "count": 3,
            "firstTimestamp": ago(120),
            "lastTimestamp": ago(90),
            "source": {"component": "torchkube-operator"},
        },
        {
            "type": "Normal",
            "reason": "Created",
            "message": "created service gpt",
            "lastTimestamp": ago(3600),
            "source": {"component": "torchkube-operator"},
        },
    ]
    text = render.describe(body, pods, events, NOW)
    lines = text.splitlines()
    headings = ["Spec:", "Conditions:", "Failures (last 1, oldest first):", "Pods:", "Events:"]
    assert [line for line in lines if line in headings] == headings
    assert "Name:       gpt" in lines
    assert "Restarts:   2 (1 of maxRestarts 10 used)" in lines
    assert "Progress:   step 1200/20000 (6%), loss 3.1416, 51,234 tokens/s" in lines
    assert "Time left:  3h8m at 0.6 s/step (the recent pace)" in lines
    assert "Goodput:    -" in lines
    assert "  Replicas:       min 2, max 4, desired unset (max)" in lines
    assert "  Trainer:        model gpt2, strategy fsdp, steps 20000" in lines
    assert (
        "  Checkpoint:     gpt-checkpoints (created, 10Gi) at /checkpoints, every 200 steps, "
        "keep 3" in lines
    )
    # Pods: the store first, then by slot; a deleting pod is Terminating, a dead one says why.
    pod_rows = text.split("Pods:\n")[1].split("\nEvents:")[0].splitlines()
    assert [row.split()[0] for row in pod_rows[1:]] == [
        "gpt-rendezvous-zzzzz",
        "gpt-worker-0-ccccc",
        "gpt-worker-1-aaaaa",
        "gpt-worker-1-bbbbb",
    ]
    assert "Terminating" in pod_rows[2] and "OOMKilled (exit 137)" in pod_rows[3]
    # Events oldest first; repeats counted the kubectl way.
    event_rows = text.split("Events:\n")[1].splitlines()
    assert event_rows[1].split()[:2] == ["Normal", "Created"]
    assert "90s (x3 over 2m)" in event_rows[2]
    failures = text.split("Failures (last 1, oldest first):\n")[1].split("\nPods:")[0]
    assert failures.splitlines()[1].split()[:6] == [
        "90s",
        "OOMKilled",
        "gpt-worker-1-aaaaa",
        "node-b",
        "137",
        "yes",
    ]


@pytest.mark.parametrize(
    ("status", "text"),
    [
        ({"phase": "Running", "progress": {"step": 5, "totalSteps": 10}}, "- (measuring the pace)"),
        ({"phase": "Running", "progress": {"step": 5, "stepSeconds": 0.5}}, "- (no total steps)"),
        ({"phase": "Restarting", "progress": {"step": 5, "stepSeconds": 0.5}}, "-"),
        ({"phase": "Succeeded", "progress": {"step": 10, "estimatedRemainingSeconds": 0}}, "0s"),
        ({}, "-"),
    ],
)
def test_time_left_says_why_it_is_not_known(status: dict[str, Any], text: str) -> None:
    lines = render.describe(job(**status), [], [], NOW).splitlines()
    assert f"Time left:  {text}" in lines, lines
    row = render.status_table([job(**status)], NOW).splitlines()[1].split("   ")
    assert [cell.strip() for cell in row if cell.strip()][5] == text.split(" ")[0]


def test_describe_says_replica_groups_lost_apart_from_restarts() -> None:
    """recovery live: a lost group restarted nothing, so it is not among the restarts."""
    body = job(phase="Running", restarts=1, restartsCountTowardsMax=1, replicaGroupLosses=3)
    lines = render.describe(body, [], [], NOW).splitlines()
    assert (
        "Restarts:   1 (1 of maxRestarts 10 used; 3 replica groups lost while the others "
        "trained on (recovery live, not restarts))" in lines
    ), lines


@pytest.mark.parametrize(
    ("topology", "line"),
    [
        (
            {"level": "example.com/rack", "domains": ["rack-3"], "domainCount": 1},
            "example.com/rack rack-3",
        ),
        (
            {"level": "example.com/rack", "domains": ["<none>", "rack-1"], "domainCount": 2},
            "example.com/rack: spread over 2 domains: <none>, rack-1",
        ),
        (
            {"level": "h", "domains": ["a", "b"], "domainCount": 5},
            "h: spread over 5 domains: a, b and 3 more",
        ),
        ({"level": "example.com/rack"}, "example.com/rack: no worker on a node"),
    ],
)
def test_describe_shows_the_domains_the_workers_occupy(topology: dict[str, Any], line: str) -> None:
    lines = render.describe(job(**running_status(topology=topology)), [], [], NOW).splitlines()
    assert f"Topology:   {line}" in lines, lines


def test_describe_has_no_topology_line_without_one() -> None:
    text = render.describe(job(**running_status()), [], [], NOW)
    assert "Topology:" not in text


def dispatched_job(**status: Any) -> dict[str, Any]:
    body = job(**status)
    body["spec"] = {**body["spec"], "managedBy": "kueue.x-k8s.io/multikueue"}
    return body


def test_status_shows_the_worker_cluster_a_dispatched_job_runs_on() -> None:
    jobs = [dispatched_job(**running_status()), job("local", **running_status())]
    rows = render.status_table(jobs, NOW, dispatched={"u-1": "worker-1"}).splitlines()
    assert rows[1].split()[:3] == ["gpt", "Running", "(on"] and "worker-1)" in rows[1]


def test_describe_says_where_a_dispatched_job_runs_or_that_it_waits_to_be_sent() -> None:
    sent = render.describe(dispatched_job(**running_status()), [], [], NOW, "worker-1")
    assert "Runs on:    worker cluster worker-1, dispatched by MultiKueue" in sent
    waiting = render.describe(dispatched_job(phase="Queued"), [], [], NOW)
    assert "Runs on:    not dispatched yet" in waiting
    assert "Runs on:" not in render.describe(job(**running_status()), [], [], NOW)


def test_describe_of_a_job_without_status() -> None:
    text = render.describe(job(), [], [], NOW)
    assert "Phase:      -" in text
    for heading in ("Conditions:", "Failures:", "Pods:", "Events:"):
        assert f"{heading}\n  <none>" in text


# --- which pod holds rank 0 ---------------------------------------------------------------


def test_rank0_is_the_pod_with_the_newest_untagged_trainer_line() -> None:
    w0, w1 = pod("w0", 0), pod("w1", 1)
    probes = {
        # Slot 0 held rank 0 until a re-rendezvous; now its process is rank 1.
        "w0": "2026-03-01T11:00:00.51Z 11:00:00 INFO torchkube: step 5/100\n"
        "2026-03-01T11:10:00Z 11:10:00 WARNING torchkube [rank 1]: world size changed\n",
        # Fractional seconds of different lengths compare as times, not as strings.
        "w1": "2026-03-01T11:00:00.6Z 11:00:00 INFO torchkube: step 6/100\n",
    }
    assert p.pick_rank0([w0, w1], probes) == (w1, "its log shows rank 0")
    assert p.rank0_time(probes["w1"]) == datetime(2026, 3, 1, 11, 0, 0, 600000, tzinfo=UTC)


def test_without_a_rank0_line_the_lowest_slot_is_chosen() -> None:
    chosen, how = p.pick_rank0([pod("w0", 0), pod("w1", 1)], {"w0": "", "w1": "plain output"})
    assert p.name(chosen) == "w0" and "lowest worker slot" in how


def test_log_candidates() -> None:
    failed = pod("old-1", 1, phase="Failed", created=300)
    new = pod("new-1", 1, created=10)
    zero = pod("w-0", 0, created=200)
    pending = pod("pend-2", 2, phase="Pending", node=None)
    store = pod("store", None)
    # While workers run: only running ones, by slot, newest first.
    assert [p.name(c) for c in p.log_candidates([failed, new, zero, pending, store])] == [
        "w-0",
        "new-1",
    ]
    # A finished job: what ran on a node, not pods being deleted or never scheduled.
    done = pod("done-0", 0, phase="Succeeded")
    leaving = deleting(pod("leaving-1", 1, phase="Succeeded"))
    assert [p.name(c) for c in p.log_candidates([done, leaving, pending])] == ["done-0"]
    # --all shows the newest pod of each slot.
    both = p.log_candidates([failed, pod("done-1", 1, phase="Succeeded", created=5), done])
    assert [p.name(c) for c in p.newest_per_slot(both)] == ["done-0", "done-1"]
    assert p.in_slot(both, 1) is not None and p.in_slot(both, 5) is None


# --- error sentences ----------------------------------------------------------------------


def status_body(code: int, reason: str, message: str, **details: Any) -> str:
    """An error response's body as the apiserver writes it."""
    return json.dumps(
        {"kind": "Status", "code": code, "reason": reason, "message": message, "details": details}
    )


@pytest.mark.parametrize(
    ("code", "body", "expected"),
    [
        (
            404,
            status_body(404, "NotFound", 'namespaces "x" not found', name="x", kind="namespaces"),
            'namespace "x" does not exist on the API server at https://127.0.0.1:6443 (context '
            "admin@test); pick an existing one with -n/--namespace (kubectl get namespaces "
            "lists them)",
        ),
        (
            404,
            status_body(404, "NotFound", "not found", name="gpt", kind="trainingjobs"),
            'TrainingJob "gpt" not found in namespace "team-a"; torchkube status lists the jobs '
            "there (-A for all namespaces)",
        ),
        (
            404,
            "404 page not found\n",
            "the API server at https://127.0.0.1:6443 (context admin@test) does not serve "
            "TrainingJobs (torchkube.io/v1alpha1); install the CRD first: torchkube crd | "
            "kubectl apply --server-side -f -",
        ),
        (
            401,
            status_body(401, "Unauthorized", "Unauthorized"),
            "the API server at https://127.0.0.1:6443 (context admin@test) did not accept your "
            "credentials (401 Unauthorized); log in again or choose another context with --context",
        ),
        (
            403,
            status_body(403, "Forbidden", 'User "dev" cannot create resource "trainingjobs"'),
            'you may not create TrainingJob "gpt": User "dev" cannot create resource '
            '"trainingjobs"; ask a cluster admin for access or choose another context with '
            "--context",
        ),
        (
            409,
            status_body(409, "Conflict", "the object has been modified"),
            'could not create TrainingJob "gpt": it changed while this command wrote it (the '
            "object has been modified); run the command again",
        ),
        (
            500,
            status_body(500, "InternalError", "etcdserver: request timed out"),
            "the API server at https://127.0.0.1:6443 (context admin@test) failed to create "
            'TrainingJob "gpt" (500 Internal Server Error: etcdserver: request timed out); try '
            "again, and look at the API server if it keeps happening",
        ),
    ],
)
def test_api_errors_become_one_sentence(code: int, body: str, expected: str) -> None:
    reason = {500: "Internal Server Error"}.get(code, "x")
    action = 'create TrainingJob "gpt"'
    assert api_error(code, body, reason, action=action, target=TARGET) == expected


def test_a_log_the_kubelet_cannot_serve_blames_the_node() -> None:
    body = status_body(
        500,
        "InternalError",
        'Get "https://10.0.0.5:10250/containerLogs/ns/gpt-worker-0/trainer": dial tcp '
        "10.0.0.5:10250: i/o timeout",
    )
    action = 'read the log of pod "gpt-worker-0"'
    assert api_error(500, body, "x", action=action, target=TARGET, resource="pods") == (
        f"could not {action}: the node's kubelet did not answer (Get \"https://10.0.0.5:10250/"
        'containerLogs/ns/gpt-worker-0/trainer": dial tcp 10.0.0.5:10250: i/o timeout); the '
        "node may be down or not reachable from the API server"
    )
    waiting = status_body(400, "BadRequest", 'container "trainer" is waiting to start')
    assert api_error(400, waiting, "x", action=action, target=TARGET, resource="pods") == (
        f'could not {action}: container "trainer" is waiting to start'
    )


def test_a_refused_change_names_the_rule() -> None:
    cel = (
        'Invalid value: "object": replicas.desired (what kubectl scale sets) must lie between '
        "replicas.min and replicas.max"
    )
    body = status_body(
        422,
        "Invalid",
        f'TrainingJob.torchkube.io "gpt" is invalid: spec.replicas: {cel}',
        name="gpt",
        kind="TrainingJob",
        causes=[{"reason": "FieldValueInvalid", "message": cel, "field": "spec.replicas"}],
    )
    assert api_error(422, body, "Unprocessable", action="scale gpt to 9", target=TARGET) == (
        "the cluster refused to scale gpt to 9: spec.replicas: replicas.desired (what kubectl "
        "scale sets) must lie between replicas.min and replicas.max"
    )
    no_causes = {"message": f'TrainingJob.torchkube.io "gpt" is invalid: spec.image: {cel}'}
    assert refusal_details(no_causes).startswith("spec.image: replicas.desired")


def test_connection_errors_and_translate() -> None:
    refused = urllib3.exceptions.MaxRetryError(
        None,  # type: ignore[arg-type]
        "/apis",
        urllib3.exceptions.NewConnectionError(None, "[Errno 111] Connection refused"),  # type: ignore[arg-type]
    )
    assert connection_error(refused, target=TARGET) == (
        "cannot reach the API server at https://127.0.0.1:6443 (context admin@test): connection "
        "refused; check that the cluster is running and that this is the right context "
        "(--context, --kubeconfig or KUBECONFIG)"
    )
    with (
        pytest.raises(ClientError, match=r'^TrainingJob "gpt" not found') as caught,
        translate("read gpt", TARGET),
    ):
        raise ApiException(
            status=404,
            reason="Not Found",
            body=status_body(404, "NotFound", "x", name="gpt", kind="trainingjobs"),
        )
    assert caught.value.__suppress_context__


class FakeStreams:
    """Stands in for Jobs.follow: canned lines per pod, or a failure."""

    def __init__(self, streams: dict[str, list[str] | ClientError]) -> None:
        self.streams = streams

    def follow(self, pod: str, tail: int | None) -> Iterator[str]:
        stream = self.streams[pod]
        if isinstance(stream, ClientError):
            raise stream
        yield from stream


def test_following_several_pods_reports_a_failed_stream_at_the_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    jobs: Any = FakeStreams({"w0": ["a", "b"], "w1": ClientError("pod gone")})
    with pytest.raises(ClientError, match=r"^1 of 2 log streams failed"):
        follow_logs(jobs, ["w0", "w1"], None, prefix=True)
    out, err = capsys.readouterr()
    assert out == "[w0] a\n[w0] b\n"
    assert sorted(err.splitlines()) == ["# w0: log stream ended", "# w1: pod gone"]
    single: Any = FakeStreams({"w1": ClientError("pod gone")})
    with pytest.raises(ClientError, match=r"^pod gone$"):
        follow_logs(single, ["w1"], None, prefix=False)
    assert capsys.readouterr() == ("", "")


# --- the job file -------------------------------------------------------------------------

VALID = """\
apiVersion: torchkube.io/v1alpha1
kind: TrainingJob
metadata: {name: gpt}
spec:
  replicas: {min: 1, max: 2}
"""


def test_a_valid_file_is_sent_as_written() -> None:
    (item,) = manifest.load(VALID + "status: {phase: Running}\n", "job.yaml")
    assert item.name == "gpt" and item.namespace is None
    assert item.body["spec"] == {"replicas": {"min": 1, "max": 2}}  # no defaults filled in
    assert "status" not in item.body


def test_every_problem_of_every_document_is_named() -> None:
    bad = VALID.replace("min: 1, max: 2", "min: 3, max: 2") + "  trainr: {}\n"
    text = f"{VALID}---\n{bad}---\n[1, 2]\n---\nkind: TrainingJob\nspec: {{}}\n"
    with pytest.raises(ClientError) as caught:
        manifest.load(text, "jobs.yaml")
    error = caught.value
    assert error.exit_code == 2
    assert error.message == (
        "jobs.yaml is not a valid TrainingJob (5 problems above); nothing was submitted"
    )
    assert error.details == (
        "jobs.yaml[1]: spec.replicas: replicas.min (3) must be less than or equal to "
        "replicas.max (2)",
        "jobs.yaml[1]: spec.trainr: unknown field (check the spelling; fields are camelCase)",
        "jobs.yaml[2]: expected a TrainingJob (a mapping), got list",
        "jobs.yaml[3]: metadata.name: required (it names the job, its pods and claim)",
        "jobs.yaml[3]: apiVersion and kind are required (torchkube.io/v1alpha1, TrainingJob)",
    )


def test_yaml_syntax_errors_say_where() -> None:
    where = r"^job.yaml is not valid YAML \(line 2, column 5: expected "
    with pytest.raises(ClientError, match=where):
        manifest.load("metadata: {name: x\nspec: [\n", "job.yaml")
    with pytest.raises(ClientError, match="holds no TrainingJob"):
        manifest.load("# nothing\n", "job.yaml")


# --- commands that need no cluster --------------------------------------------------------


def test_offline_check_and_invalid_file(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(VALID)
    result = CliRunner().invoke(submit, ["--offline", str(good)])
    assert result.exit_code == 0 and result.stdout == (
        "trainingjob.torchkube.io/gpt valid (checked offline, nothing sent)\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(VALID.replace("max: 2", "max: 0"))
    result = CliRunner().invoke(submit, [str(bad), "--offline"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{bad}: spec.replicas.max: Input should be greater than or equal to 1",
        f"Error: {bad} is not a valid TrainingJob (1 problem above); nothing was submitted",
    ]


def test_kubeconfig_problems_are_one_sentence(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    result = CliRunner().invoke(status, ["--kubeconfig", str(missing)])
    assert result.exit_code == 1 and result.stderr == (
        f"Error: kubeconfig {missing} does not exist; pass --kubeconfig PATH or set KUBECONFIG "
        "(hack/dev-cluster up prints the path of a local test cluster's)\n"
    )
    config = tmp_path / "config"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    result = CliRunner().invoke(logs, ["gpt", "--kubeconfig", str(config), "--context", "prod"])
    assert result.stderr == f'Error: context "prod" is not in kubeconfig {config}; it has: ctx\n'
    garbage = tmp_path / "garbage"
    garbage.write_text("clusters: [\n")
    result = CliRunner().invoke(status, ["--kubeconfig", str(garbage)])
    assert result.exit_code == 1 and result.stderr.startswith(
        f"Error: cannot read kubeconfig {garbage}: "
    )
    assert len(result.stderr.splitlines()) == 1
    # No current-context: say which exist; --context still works (port 1 refuses at once).
    data = yaml.safe_load(config.read_text())
    del data["current-context"]
    config.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(status, ["--kubeconfig", str(config)])
    assert result.stderr == (
        f"Error: kubeconfig {config} has no current context; pass --context (it has: ctx)\n"
    )
    result = CliRunner().invoke(status, ["--kubeconfig", str(config), "--context", "ctx"])
    assert result.stderr.startswith(
        "Error: cannot reach the API server at https://127.0.0.1:1 (context ctx): connection "
        "refused; "
    )
    result = CliRunner().invoke(status, ["gpt", "-A"])
    assert result.exit_code == 2 and "drop -A or the name" in result.stderr


def test_importing_the_commands_loads_neither_kubernetes_nor_pydantic() -> None:
    code = (
        "import sys, torchkube.cli.cluster; "
        "print(sorted(m for m in ('kubernetes', 'pydantic', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_describe_lists_workers_in_rank_order_with_each_ones_domain() -> None:
    """Ranks follow slots (torchkube/elastic/ranks.py), so the Pods table — in slot order —
    is the workers' rank order; with a topology each row names its node's domain."""
    topology = {"level": "example.com/rack", "domains": ["rack-1", "rack-2"], "domainCount": 2}
    pods = [pod("gpt-worker-1-b", 1, node="n2"), pod("gpt-worker-0-a", 0, node="n1")]
    pods.append(pod("gpt-worker-2-c", 2, phase="Pending", node=None))
    domains = {"n1": "rack-1", "n2": "rack-2"}
    body = job(**running_status(topology=topology))
    lines = render.describe(body, pods, [], NOW, node_domains=domains).splitlines()
    table = lines[lines.index("Pods:") + 1 :]
    assert table[0].split() == ["NAME", "ROLE", "SLOT", "STATUS", "READY", "NODE", "DOMAIN", "AGE"]
    assert [row.split()[:7] for row in table[1:4]] == [
        ["gpt-worker-0-a", "worker", "0", "Running", "0/1", "n1", "rack-1"],
        ["gpt-worker-1-b", "worker", "1", "Running", "0/1", "n2", "rack-2"],
        ["gpt-worker-2-c", "worker", "2", "Pending", "0/1", "-", "-"],
    ]
    plain = render.describe(job(**running_status()), pods, [], NOW).splitlines()
    assert "DOMAIN" not in plain[plain.index("Pods:") + 1]


def test_the_store_and_lighthouse_come_before_the_workers_in_slot_order() -> None:
    lighthouse = pod("gpt-lighthouse-x", None)
    lighthouse["metadata"]["labels"]["torchkube.io/role"] = "lighthouse"
    pods = [pod("gpt-worker-1-b", 1), lighthouse, pod("gpt-worker-0-a", 0), pod("gpt-rdzv", None)]
    lines = render.describe(job(**running_status()), pods, [], NOW).splitlines()
    table = lines[lines.index("Pods:") + 2 : lines.index("Pods:") + 6]
    assert [row.split()[0] for row in table] == [
        "gpt-rdzv",
        "gpt-lighthouse-x",
        "gpt-worker-0-a",
        "gpt-worker-1-b",
    ]
