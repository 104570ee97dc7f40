"""Refusal policy: the apiserver refused to create a pod of the job, or one of its children
(quota, Pod Security admission, a webhook, an invalid pod spec).

A refusal the same pod spec can get past later (quota freed, a webhook fixed) is retried with
a doubling delay (``Refusal.retry_after``) and said in ``PodsBlocked``; one it never can (an
invalid pod, a Pod Security level that forbids it) fails the job at once with what to fix.
"""

from torchkube.operator.decision import CONTINUE, STOP, Context, Step


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
