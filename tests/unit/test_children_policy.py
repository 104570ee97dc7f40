"""Children and ownership: the job acts only on what it controls, by owner UID
(torchkube/operator/children.py: its step called directly, one row per case, and whole
scenarios through the planner; and the planner's filter on pods)."""

from typing import Any

import pytest
from planner import (
    child,
    condition,
    context,
    created_slots,
    make_job,
    own_children,
    pod,
    run,
    running_status,
    store,
)
from planner import (
    kubelet_stopped as stopped,
)

from torchkube.api import labels as lbl
from torchkube.operator.children import ensure
from torchkube.operator.decision import CONTINUE


def test_recreated_job_ignores_its_namesakes_terminating_pods_and_waits_for_its_children() -> None:
    """kubectl delete tj demo && kubectl apply -f demo.yaml: the old job's pods, Service and
    claim are still being deleted. The new job (uid u1) must not adopt the pods or count them,
    and must wait for its own Service and claim."""
    old = [stopped(i, owner="old-uid") for i in range(4)]
    leftovers = [
        child("Service", "demo", owner="old-uid", deletionTimestamp="2026-11-23T12:00:00Z"),
        child(
            "PersistentVolumeClaim",
            "demo-checkpoints",
            owner="old-uid",
            deletionTimestamp="2026-11-23T12:00:00Z",
        ),
    ]
    result = run(make_job(), old, children=leftovers)
    assert result.status.restarts == 0 and result.status.last_failure is None
    assert result.delete_pods == [], "another job's pods are not ours to delete"
    assert result.create_children == [] and result.create_pods == []
    created = condition(result, "Created")
    assert created["status"] == "False" and created["reason"] == "NameConflict"
    assert "being deleted" in created["message"]
    assert "NameConflict" in [e.reason for e in result.events]


def test_a_foreign_service_is_reported_not_adopted() -> None:
    children = [child("Service", "demo", owner="someone"), own_children()[1]]
    result = run(make_job(), [], children=children)
    assert condition(result, "Created")["reason"] == "NameConflict"
    assert "belongs to another object" in condition(result, "Created")["message"]


def test_a_claim_left_without_owner_is_used() -> None:
    children = [own_children()[0], child("PersistentVolumeClaim", "demo-checkpoints", owner=None)]
    result = run(make_job(), [], children=children)
    assert condition(result, "Created")["status"] == "True"
    assert result.create_children == [] and created_slots(result) == [0, 1, 2, 3]


def test_children_are_ensured_on_every_reconcile() -> None:
    """Someone deleted the Service of a running job: it comes back."""
    result = run(
        make_job(running_status()),
        [pod(i) for i in range(4)] + [store()],
        children=[own_children()[1]],
    )
    assert [c["kind"] for c in result.create_children] == ["Service"]


def test_a_service_with_an_old_selector_is_repaired() -> None:
    stale = child("Service", "demo")
    stale["spec"]["selector"] = {lbl.JOB_NAME: "demo"}
    result = run(
        make_job(running_status()),
        [pod(i) for i in range(4)] + [store()],
        children=[stale, own_children()[1]],
    )
    assert result.patch_children == [
        (
            "Service",
            "demo",
            {
                "spec": {
                    "selector": {
                        lbl.JOB_NAME: "demo",
                        lbl.ROLE: lbl.ROLE_RENDEZVOUS,
                        lbl.JOB_UID: "u1",
                    }
                }
            },
        )
    ]


def test_a_users_pod_with_the_job_label_is_left_alone() -> None:
    users = pod(0, owner=None)
    suspended = run(
        make_job(running_status(), runPolicy={"suspend": True}), [users, pod(1), store()]
    )
    assert users["metadata"]["name"] not in {name for name, _ in suspended.delete_pods}
    running = run(make_job(running_status()), [users, pod(1), pod(2), pod(3), store()])
    assert created_slots(running) == [0], "a foreign pod fills no slot"


# ------------------------------------------------------------------ the step, row by row

SERVICE, CLAIM = own_children()
GOING = "2026-11-23T12:00:00Z"
"""A deletionTimestamp: the object is being deleted."""


@pytest.mark.parametrize(
    ("children", "ready", "created", "patched", "reason"),
    [
        pytest.param([], True, ["Service", "PersistentVolumeClaim"], [], "Created", id="none-yet"),
        pytest.param([SERVICE, CLAIM], True, [], [], "Created", id="both-in-place"),
        pytest.param([CLAIM], True, ["Service"], [], "Created", id="a-deleted-service-comes-back"),
        pytest.param(
            [{**SERVICE, "spec": {"selector": {lbl.JOB_NAME: "demo"}}}, CLAIM],
            True,
            [],
            ["Service"],
            "Created",
            id="an-old-selector-repaired",
        ),
        pytest.param(
            [SERVICE, child("PersistentVolumeClaim", "demo-checkpoints", owner=None)],
            True,
            [],
            [],
            "Created",
            id="an-unowned-claim-used",
        ),
        pytest.param(
            [child("Service", "demo", owner="someone"), CLAIM],
            False,
            [],
            [],
            "NameConflict",
            id="a-foreign-service-not-adopted",
        ),
        pytest.param(
            [child("Service", "demo", owner="old-uid", deletionTimestamp=GOING), CLAIM],
            False,
            [],
            [],
            "NameConflict",
            id="an-earlier-jobs-service-being-deleted-waited-for",
        ),
    ],
)
def test_ensure(
    children: list[dict[str, Any]],
    ready: bool,
    created: list[str],
    patched: list[str],
    reason: str,
) -> None:
    """children.ensure: what it creates and repairs, ``ctx.children_ready`` for the steps
    that create pods (never a STOP: a job whose children wait still reports on its pods),
    and the ``Created`` condition's reason."""
    ctx = context(make_job(), [], children=children)

    assert ensure(ctx) is CONTINUE
    assert ctx.children_ready is ready
    assert [c["kind"] for c in ctx.plan.create_children] == created
    assert [kind for kind, _, _ in ctx.plan.patch_children] == patched
    found = ctx.condition("Created")
    assert found is not None and found.reason == reason
    assert (ctx.plan.requeue_after == 5) is not ready, "a conflict is looked at again"
