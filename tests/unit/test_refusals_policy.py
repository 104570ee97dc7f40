"""Refusal policy: a create the apiserver refused is retried with a doubling delay and said in
PodsBlocked, or fails the job when the pod spec can never pass
(torchkube/operator/refusals.py)."""

from datetime import timedelta
from typing import Any

import pytest
from planner import (
    NOW,
    condition,
    context,
    created_slots,
    make_job,
    pod,
    run,
    running_status,
    store,
)

from torchkube.api.times import format_time
from torchkube.operator import refusals
from torchkube.operator.decision import CONTINUE, Event, Refusal


def test_a_refused_child_is_reported_by_name_and_never_fails_the_job() -> None:
    what = "PersistentVolumeClaim demo-checkpoints"
    refused = Refusal(422, "Unprocessable Entity", "spec: invalid", NOW, what=what)
    result = run(make_job(), [], refused=refused)
    assert result.status.phase == "Pending"
    assert "Failed" not in [c.type for c in result.status.conditions]
    blocked = condition(result, "PodsBlocked")
    assert blocked["reason"] == "CreateRefused" and f"create {what} (422" in blocked["message"]


def test_create_refused_for_quota_backs_off_and_says_so() -> None:
    refused = Refusal(403, "Forbidden", "exceeded quota: gpus, requested: nvidia.com/gpu=8", NOW, 3)
    result = run(make_job(), [], refused=refused)
    assert result.create_pods == []
    assert result.requeue_after is not None and 3.9 <= result.requeue_after <= 4.0
    blocked = condition(result, "PodsBlocked")
    assert blocked["reason"] == "PodCreateRefused" and "exceeded quota" in blocked["message"]
    later = run(make_job(result.status), [], refused=refused, now=NOW + timedelta(seconds=5))
    assert created_slots(later) == [0, 1, 2, 3], "tried again once the backoff passed"


def test_create_refused_by_pod_security_fails_fast() -> None:
    message = 'pods "x" is forbidden: violates PodSecurity "restricted:latest": privileged'
    result = run(make_job(), [], refused=Refusal(403, "Forbidden", message, NOW))
    failed = condition(result, "Failed")
    assert failed["reason"] == "PodCreateRefused" and "violates PodSecurity" in failed["message"]


def test_invalid_pod_spec_fails_fast() -> None:
    refused = Refusal(422, "Unprocessable Entity", "spec.containers[0].image: Required", NOW)
    assert condition(run(make_job(), [], refused=refused), "Failed")["reason"] == "PodCreateRefused"


@pytest.mark.parametrize(("attempts", "delay"), [(1, 1), (2, 2), (4, 8), (9, 256), (20, 300)])
def test_a_refused_create_is_retried_with_a_doubling_delay_up_to_five_minutes(
    attempts: int, delay: float
) -> None:
    assert Refusal(403, "Forbidden", "exceeded quota", NOW, attempts).retry_after == delay


def test_only_a_pod_spec_that_can_never_pass_is_permanent() -> None:
    assert Refusal(422, "Unprocessable Entity", "invalid", NOW).permanent
    assert not Refusal(403, "Forbidden", "exceeded quota", NOW).permanent
    assert not Refusal(422, "Unprocessable Entity", "invalid", NOW, what="Service demo").permanent


REFUSED = (
    'workloads.kueue.x-k8s.io is forbidden: User "system:serviceaccount:tk:tk" cannot list '
    'resource "workloads" in API group "kueue.x-k8s.io" in the namespace "team-a"'
)


def test_a_request_refused_by_rbac_is_said_on_the_job_while_it_lasts() -> None:
    """The controller was refused a request this job needs (403): the condition holds the
    apiserver's words and what grants it, kept while refusals go on, cleared once they stop."""
    pods = [pod(0), pod(1), store()]
    refused = run(make_job(running_status()), pods, forbidden=REFUSED)
    said = condition(refused, "OperatorForbidden")
    assert said["status"] == "True" and said["reason"] == "Forbidden", said
    assert REFUSED in said["message"] and "ServiceAccount" in said["message"], said
    allowed = run(make_job(refused.status), pods)
    assert condition(allowed, "OperatorForbidden")["status"] == "False"
    assert condition(allowed, "OperatorForbidden")["reason"] == "Allowed"
    never = run(make_job(running_status()), pods)
    assert "OperatorForbidden" not in [c.type for c in never.status.conditions]


def test_a_job_the_model_refused_once_is_no_longer_invalid_when_it_validates() -> None:
    status = running_status()
    status["conditions"].append(
        {
            "type": "Invalid",
            "status": "True",
            "reason": "ValidationFailed",
            "message": "the operator cannot act on this job: spec.replicas ...",
            "lastTransitionTime": status["startTime"],
        }
    )
    fixed = run(make_job(status), [pod(0), pod(1), store()])
    assert condition(fixed, "Invalid")["status"] == "False", fixed.status.conditions


def _stored(*conditions: dict[str, Any]) -> dict[str, Any]:
    """A job as the cache holds it, which the planner cannot run for."""
    status = {"phase": "Running", "restarts": 2, "conditions": list(conditions)}
    return {"metadata": {"name": "demo", "generation": 3}, "status": status}


def test_an_invalid_job_gets_its_condition_on_top_of_the_stored_ones_and_one_warning() -> None:
    """Without a plan: only ``conditions`` is patched, the others kept (a malformed one,
    which may be why the job is invalid, dropped rather than sent back)."""
    running = {"type": "Running", "status": "True", "reason": "Running", "message": "ok"}
    running["lastTransitionTime"] = format_time(NOW)
    body = _stored(running, {"type": "Running?", "status": "Maybe"})
    patch, event = refusals.invalid(body, "spec.replicas: min > max", NOW)
    assert set(patch) == {"conditions"}, "the rest of the status is left as it is"
    kept, invalid = patch["conditions"]
    assert kept == running
    assert (invalid["type"], invalid["status"], invalid["reason"]) == (
        "Invalid",
        "True",
        "ValidationFailed",
    )
    assert invalid["message"] == "the operator cannot act on this job: spec.replicas: min > max"
    assert invalid["observedGeneration"] == 3
    assert event == Event("Warning", "ValidationFailed", "spec.replicas: min > max")


def test_a_refused_reconcile_says_so_at_once_in_the_planners_words() -> None:
    """The condition the controller writes at once is the one the planner then keeps."""
    patch, event = refusals.forbidden(_stored(), REFUSED, NOW)
    [said] = patch["conditions"]
    planned = condition(run(make_job(running_status()), [], forbidden=REFUSED), "OperatorForbidden")
    assert {k: said[k] for k in ("type", "status", "reason", "message")} == {
        k: planned[k] for k in ("type", "status", "reason", "message")
    }
    assert event == Event("Warning", "OperatorForbidden", said["message"])
    long = refusals.forbidden(_stored(), "x" * 9000, NOW)[0]["conditions"][0]["message"]
    assert len(long) == 4096, "cut to the schema's length"


QUOTA = "exceeded quota: gpus"


@pytest.mark.parametrize(
    ("children_ready", "refused_ago", "may_create", "requeue"),
    [
        pytest.param(True, None, True, None, id="nothing-refused"),
        pytest.param(False, None, False, None, id="children-not-ready"),
        pytest.param(True, 1.0, False, 3.0, id="refused-and-backing-off"),
        pytest.param(True, 5.0, True, None, id="refused-and-backed-off-long-enough"),
        pytest.param(False, 1.0, False, None, id="children-not-ready-backoff-not-looked-at"),
    ],
)
def test_back_off(
    children_ready: bool, refused_ago: float | None, may_create: bool, requeue: float | None
) -> None:
    """refusals.back_off: ``ctx.may_create`` for scaling, from ``ctx.children_ready`` and the
    last refused create (its third attempt: 4 s apart), and a requeue for the backoff's end."""
    refused = None
    if refused_ago is not None:
        refused = Refusal(403, "Forbidden", QUOTA, NOW - timedelta(seconds=refused_ago), 3)
    ctx = context(make_job(running_status()), [], refused=refused)
    ctx.children_ready = children_ready

    assert refusals.back_off(ctx) is CONTINUE
    assert ctx.may_create is may_create
    assert ctx.plan.requeue_after == requeue
