"""Refusal policy: the apiserver refused to create a pod of the job, or one of its children
(quota, Pod Security admission, a webhook, an invalid pod spec), or refused the operator a
request the job needs (RBAC); or the job itself does not validate.

A refusal the same pod spec can get past later (quota freed, a webhook fixed) is retried with
a doubling delay (``Refusal.retry_after``) and said in ``PodsBlocked``; one it never can (an
invalid pod, a Pod Security level that forbids it) fails the job at once with what to fix.
A request the operator's RBAC does not allow (a Workload list without Kueue's rights) is
retried by the controller and said in ``OperatorForbidden`` while it lasts.

The last two may keep the planner from running at all (the request refused is one the plan
needs, the job is one the model refuses), so for them :func:`invalid` and :func:`forbidden`
also build the status patch and event the controller writes without a plan.
"""

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from torchkube.api.types import Condition
from torchkube.operator import conditions as cond
from torchkube.operator.decision import CONTINUE, STOP, Context, Event, Step

FORBIDDEN_HELP = (
    "grant it to the operator's ServiceAccount (the chart's rbac.create grants what the "
    "operator needs; kueue.enabled adds Kueue's Workloads); the operator retries, and the "
    "job goes on by itself once it is allowed"
)


def report_operator_trouble(ctx: Context) -> None:
    """What keeps the operator from acting on the job, said on it while it lasts: a request
    the apiserver refused (403, ``Observed.forbidden``), and cleared once it no longer does;
    an ``Invalid`` spec cleared once it validates (the planner runs only on one that does)."""
    ctx.clear(cond.INVALID, "Valid", "the spec validates")
    refused = ctx.observed.forbidden
    if refused is None:
        ctx.clear(cond.OPERATOR_FORBIDDEN, "Allowed", "the operator's requests are allowed")
        return
    ctx.set(cond.OPERATOR_FORBIDDEN, True, "Forbidden", forbidden_message(refused))


def forbidden_message(refused: str) -> str:
    """The condition's and the event's words for a refused request."""
    return (
        f"the apiserver refused the operator a request this job needs ({refused}): {FORBIDDEN_HELP}"
    )


def invalid(body: dict[str, Any], why: str, now: datetime) -> tuple[dict[str, Any], Event]:
    """For a job the model refuses (the CRD's schema let it through, or someone wrote its
    status by hand): the status patch that says so in ``Invalid``, and its Warning event."""
    message = f"the operator cannot act on this job: {why}"
    patch = _condition_patch(body, cond.INVALID, "ValidationFailed", message, now)
    return patch, Event("Warning", "ValidationFailed", why)


def forbidden(body: dict[str, Any], refused: str, now: datetime) -> tuple[dict[str, Any], Event]:
    """For a reconcile the apiserver refused a request (403): the status patch that says so
    in ``OperatorForbidden`` at once (the plan that would say it may be what is refused), and
    its Warning event. The planner keeps the condition while the refusals go on
    (:func:`report_operator_trouble`)."""
    message = forbidden_message(refused)
    patch = _condition_patch(body, cond.OPERATOR_FORBIDDEN, "Forbidden", message, now)
    return patch, Event("Warning", "OperatorForbidden", message)


def _condition_patch(
    body: dict[str, Any], kind: str, reason: str, message: str, now: datetime
) -> dict[str, Any]:
    """The status merge patch that sets condition ``kind`` True on top of the conditions the
    stored status holds (those that validate: the status may be what is invalid), the rest of
    the status left as it is."""
    stored = (body.get("status") or {}).get("conditions") or []
    kept = [Condition.model_validate(c) for c in stored if isinstance(c, dict) and _valid(c)]
    generation = body.get("metadata", {}).get("generation")
    conditions = cond.set_condition(kept, kind, True, reason, message[:4096], now, generation)
    return {"conditions": [c.to_wire() for c in conditions]}


def _valid(condition: dict[str, Any]) -> bool:
    try:
        Condition.model_validate(condition)
    except ValidationError:
        return False
    return True


def fail_permanent(ctx: Context) -> Step:
    """A refusal no retry can get past fails the job: STOP."""
    refused = ctx.observed.refused
    if refused is None or not refused.permanent:
        return CONTINUE
    ctx.finish(
        "Failed",
        "PodCreateRefused",
        f"the apiserver refused the worker pod ({refused.code} {refused.reason}): "
        f"{refused.message}. This pod spec can never be created here; fix "
        "scheduling.podTemplate or the namespace's policy and create the job again",
    )
    return STOP


def back_off(ctx: Context) -> Step:
    """``ctx.may_create``: pods may be created this pass, their children being in place
    (``ctx.children_ready``) and no refused create being backed off."""
    ctx.may_create = ctx.children_ready and creates_allowed(ctx)
    return CONTINUE


def creates_allowed(ctx: Context) -> bool:
    """False while the apiserver's last refusal of a pod create is being backed off."""
    refused = ctx.observed.refused
    if refused is None:
        return True
    wait = (refused.at - ctx.now).total_seconds() + refused.retry_after
    if wait > 0:
        ctx.plan.requeue(wait)
        return False
    return True


def problem(ctx: Context) -> tuple[str, str] | None:
    """(reason, message) for ``PodsBlocked`` while the apiserver refuses a create."""
    refused = ctx.observed.refused
    if refused is None:
        return None
    return (
        "PodCreateRefused" if refused.what == "a pod" else "CreateRefused",
        f"the apiserver refused to create {refused.what} ({refused.code} {refused.reason}): "
        f"{refused.message}; retrying every {int(refused.retry_after)}s",
    )
