"""CI's regression guard for the operator's speed (see bench/guard.py): jobs of 8 and 64
workers on the session's cluster, apply → every worker pod created (the operator's part alone,
which a slow machine's control plane does not hide) and apply → every worker Running, against
the last recorded ``bench/results/operator_scale*.json``. Fails only on a gross regression;
prints the figures either way."""

import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
from kube_jobs import Job

from bench import guard
from bench.kube import PodWatch
from bench.operator_scale import all_created, all_running
from testbed.kwok import NodePool
from torchkube.api import labels as lbl

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRIALS = {8: 3, 64: 1}


MILESTONES = ("all created", "all Running")


def apply_to(
    api: Any, namespace: str, make_job: Callable[..., Job], pool: NodePool, workers: int, name: str
) -> dict[str, float]:
    """Seconds from the apply to each of :data:`MILESTONES`."""
    selector = f"{lbl.JOB_NAME}={name},{lbl.ROLE}={lbl.ROLE_WORKER}"
    with PodWatch(api, namespace, selector) as watch:
        started = time.monotonic()
        job = make_job(name, pool, replicas={"min": workers, "max": workers}, resources={"gpus": 1})
        created = all_created(watch, workers, 60 + workers, f"job {name}") - started
        running = all_running(watch, workers, 60 + workers, f"job {name}") - started
    job.delete()
    return dict(zip(MILESTONES, (created, running), strict=True))


def test_apply_to_running_has_not_regressed_grossly(
    api_client: Any,
    namespace: str,
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
) -> None:
    pool = isolated_pool(nodes=8)
    apply_to(api_client, namespace, make_job, pool, 8, "warmup")
    checks = []
    for workers, trials in TRIALS.items():
        times = [
            apply_to(api_client, namespace, make_job, pool, workers, f"g{workers}-{i}")
            for i in range(trials)
        ]
        for milestone in MILESTONES:
            figure = f"{workers} workers, idle: apply → {milestone}, torchkube"
            recorded = guard.baseline("operator_scale", figure)
            measured = statistics.median(t[milestone] for t in times)
            checks.append(guard.Check(figure, measured, recorded))
    print("\n" + guard.report(checks))
    assert guard.passed(checks), guard.report(checks)
