"""Sorting the job's pods (torchkube/operator/sorting.py): its step called directly, one row
per case, on what it leaves in ``ctx.pods`` and the plan. Whole scenarios of the failures it
finds are in the failure, node-loss and store tests, through the planner."""

from datetime import timedelta
from typing import Any

import pytest
from planner import NOW, READY, context, make_job, pod, running_status, store

from torchkube.api import labels as lbl
from torchkube.api.contract import STANDBY_RELEASED, TRAINING_FINISHED
from torchkube.operator import sorting
from torchkube.operator.decision import CONTINUE, Context
from torchkube.operator.pods import NodeHealth

FINISHED = {"phase": "Succeeded", "exit_code": 0, "message": TRAINING_FINISHED}


def summary(ctx: Context, names: dict[str, str]) -> dict[str, Any]:
    """What the step left, by the rows' labels of the pods (empty parts left out)."""
    sorted_pods = ctx.pods
    found: dict[str, Any] = {
        "live": [names[pod["metadata"]["name"]] for pod in sorted_pods.workers],
        "stores": [names[pod["metadata"]["name"]] for pod in sorted_pods.live_stores],
        "succeeded": [names[pod["metadata"]["name"]] for pod in sorted_pods.succeeded],
        "failed": [names[pod["metadata"]["name"]] for pod in sorted_pods.failed],
        "deleting": [names[pod["metadata"]["name"]] for pod in sorted_pods.deleting],
        "released": [names[pod["metadata"]["name"]] for pod in sorted_pods.released],
        "new": [(names[f.pod or ""], f.reason) for f in sorted_pods.new_failures],
        "deleted": [(names[name], force) for name, force in ctx.plan.delete_pods],
        "requeue": ctx.plan.requeue_after,
    }
    return {part: value for part, value in found.items() if value}


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param(
            {"w0": {}, "w1": {}, "s": {}},
            {"live": ["w0", "w1"], "stores": ["s"]},
            id="running-workers-and-their-store",
        ),
        pytest.param(
            {"w0": {}, "w1": {"phase": "Failed", "exit_code": 1}},
            {"live": ["w0"], "failed": ["w1"], "new": [("w1", "ExitCode")]},
            id="a-failed-worker-is-a-new-failure",
        ),
        pytest.param(
            {
                "w0": {},
                "w1": {"phase": "Failed", "exit_code": 1, "labels": {lbl.FAILURE_RECORDED: "true"}},
            },
            {"live": ["w0"], "failed": ["w1"]},
            id="a-failure-recorded-on-the-pod-is-not-new",
        ),
        pytest.param(
            {"w0": FINISHED, "w1": {}},
            {"live": ["w1"], "succeeded": ["w0"]},
            id="a-worker-that-finished-training",
        ),
        pytest.param(
            {
                "w0": FINISHED,
                "w1": {"phase": "Succeeded", "exit_code": 0, "message": STANDBY_RELEASED},
            },
            {"succeeded": ["w0"], "released": ["w1"]},
            id="a-spare-released-at-the-end",
        ),
        pytest.param(
            {"w0": {}, "w1": {"node": "gone"}},
            {
                "live": ["w0"],
                "failed": ["w1"],
                "new": [("w1", "NodeLost")],
                "deleted": [("w1", True)],
            },
            id="lost-with-its-deleted-node-force-deleted",
        ),
        pytest.param(
            {"w0": {}, "w1": {"node": "n3"}},
            {"live": ["w0", "w1"], "requeue": 25.0},
            id="on-a-notready-node-within-its-grace-looked-at-again",
        ),
        pytest.param(
            {"w0": {}, "w1": {"deleting": True, "labels": {lbl.RELEASED: "scale-down"}}},
            {"live": ["w0"], "deleting": ["w1"]},
            id="let-go-by-the-operator-no-failure",
        ),
        pytest.param(
            {"w0": {}, "w1": {"deleting": True}},
            {"live": ["w0"], "deleting": ["w1"], "new": [("w1", "Deleted")]},
            id="deleted-by-someone-else-a-failure",
        ),
        pytest.param(
            {"w0": {}, "s": {"phase": "Failed", "exit_code": 1}},
            {"live": ["w0"], "new": [("s", "RendezvousStoreLost")], "deleted": [("s", False)]},
            id="a-failed-store-deleted-and-a-failure",
        ),
    ],
)
def test_sort(pods: dict[str, dict[str, Any]], expected: dict[str, Any]) -> None:
    """sorting.sort on the job's own pods: ``w<slot>`` a worker, ``s`` the store; node n3 is
    NotReady since 5 s (its grace is 30 s), node ``gone`` is not in the cluster."""
    bodies = {
        label: store(**kw) if label == "s" else pod(int(label[1:]), **kw)
        for label, kw in pods.items()
    }
    names = {body["metadata"]["name"]: label for label, body in bodies.items()}
    nodes = {"n1": READY, "n2": READY, "n3": NodeHealth(False, NOW - timedelta(seconds=5))}
    ctx = context(make_job(running_status()), list(bodies.values()), nodes)

    assert sorting.sort(ctx) is CONTINUE
    assert summary(ctx, names) == expected
