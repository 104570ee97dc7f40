"""Issue #20's operator side against the real control plane and KWOK nodes: a hung worker is
recorded as Hang and replaced, a persistent straggler's pod is replaced (the trainers' reports
come from the stand-in ``progress_reports``), and spares are kept beyond the target."""

import time
from collections.abc import Callable
from typing import Any

import pytest
from kube_jobs import Job

from testbed import faults
from testbed.kwok import NodePool
from torchkube.api import labels as lbl
from torchkube.api.contract import ExitCode
from torchkube.api.times import now

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_hung_worker_is_a_hang_incident_and_is_replaced(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=3)
    job = make_job("hang", pool, replicas={"min": 2, "max": 2})
    victim = job.wait_running(2)[1].metadata.name
    report = (
        "torchkube: hang: rank 1 (pid 42, stopped by a signal) finished no step for 61s "
        '(hang timeout 60s); rank 1\'s main thread at File "train.py", line 270 in train_step'
    )
    faults.fail_pod(api_client, victim, job.namespace, exit_code=int(ExitCode.HUNG), message=report)
    status = job.wait(lambda: job.status().get("restarts") == 1 and job.status(), 30, "a Hang")
    last = status["lastFailure"]
    assert (last["reason"], last["pod"], last["exitCode"]) == ("Hang", victim, 124)
    assert "rank 1" in last["message"] and "train_step" in last["message"]
    assert status["restartsCountTowardsMax"] == 1
    job.wait(lambda: job.replacements(1, victim), 30, "a replacement for the hung worker")
    events = job.wait_event("Hang", 30)
    assert (
        victim in events[0].message and "restarting from the latest checkpoint" in events[0].message
    )


def test_a_persistent_straggler_is_replaced_on_another_node(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    api_client: Any,
    progress_reports: Any,
) -> None:
    pool = isolated_pool(nodes=4)
    policy = {"replaceStragglers": True, "stragglerSeconds": 10}
    job = make_job("straggle", pool, replicas={"min": 2, "max": 2}, failurePolicy=policy)
    workers = job.wait_running(2)
    slow = workers[1]
    timing = {
        "rank": 1,
        "pod": slow.metadata.name,
        "node": slow.spec.node_name,
        "computeSeconds": 0.6,
        "medianSeconds": 0.2,
        "slowdown": 3.0,
    }
    started = time.monotonic()

    def keep_reporting() -> bool:  # fresh reports, as a trainer writes them
        for pod in job.running_workers():
            progress_reports.reports[(job.namespace, pod.metadata.name)] = {
                "step": 100,
                "updated": now(),
                "slowestRank": timing,
            }
        return not any(p.metadata.name == slow.metadata.name for p in job.live_workers())

    job.wait(keep_reporting, 60, "the straggler's pod to be deleted")
    replaced_after = time.monotonic() - started
    print(f"straggler replaced {replaced_after:.1f}s after it was first reported (window 10 s)")
    assert replaced_after >= 10
    status = job.wait(
        lambda: job.status().get("lastFailure", {}).get("reason") == "Straggler" and job.status(),
        30,
        "a Straggler failure",
    )
    assert status["lastFailure"]["node"] == slow.spec.node_name
    assert status.get("restartsCountTowardsMax", 0) == 0
    assert status["slowestRank"]["pod"] == slow.metadata.name
    [replacement] = job.wait(
        lambda: job.replacements(1, slow.metadata.name), 30, "a replacement for the straggler"
    )
    preferred = (
        replacement.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    )
    assert preferred[0].preference.match_expressions[0].values == [slow.spec.node_name]


def test_spares_are_kept_beyond_the_target_and_counted(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=4)
    job = make_job("spares", pool, replicas={"min": 2, "max": 2, "spares": 1})
    job.wait_running(3)
    status = job.wait(lambda: job.status().get("spares") == 1 and job.status(), 30, "spares 1")
    assert status["desiredReplicas"] == 2 and status["replicas"] == 3
    victim = job.running_workers()[0]
    faults.fail_pod(api_client, victim.metadata.name, job.namespace, exit_code=137)
    job.wait(
        lambda: job.replacements(
            int(victim.metadata.labels[lbl.REPLICA_INDEX]), victim.metadata.name
        ),
        30,
        "a new spare behind the lost worker",
    )
    job.wait_running(3)
    assert job.wait(lambda: job.status().get("spares") == 1, 30, "spares 1 again")
