"""Children policy: the job's headless Service (with recovery live, its Lighthouse's too) and
checkpoint claim exist, are the job's own, and are recreated when someone deletes them.

Ownership is decided by the controller ``ownerReference``'s UID, never by name or label: after
``kubectl delete tj x && kubectl apply -f x.yaml`` the old job's Service and claim may still be
there, being deleted, and must not be taken for the new job's.
"""

from datetime import timedelta
from typing import Any

from torchkube.operator import builders
from torchkube.operator import conditions as cond
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, Context, Step


def _find(children: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    return next(
        (c for c in children if c.get("kind") == kind and c["metadata"].get("name") == name),
        None,
    )


def _problem(ctx: Context, found: dict[str, Any], kind: str, name: str) -> str | None:
    """Why an existing object of our name cannot serve this job, or None if it can."""
    if p.deleting(found):
        return (
            f"{kind} {name} is being deleted (left by an earlier job of this name); "
            "waiting for it to go before creating this job's own"
        )
    owner = p.controller_uid(found)
    if owner == ctx.job.uid:
        return None
    if owner is None and kind == "PersistentVolumeClaim":
        return None  # a claim kept from an earlier run or made by hand: use it, never own it
    return (
        f"{kind} {name} exists and belongs to another object (controller uid {owner}); "
        "delete it, or rename the job"
    )


def ensure(ctx: Context) -> Step:
    """Plan the creation (or repair) of the job's children; ``ctx.children_ready`` when they
    are in place, so pods may be created. Never settles the pass: a job whose children wait
    still reports on its pods."""
    wanted = builders.services(ctx.job)
    if ctx.spec.checkpoint.creates_claim:
        wanted.append(builders.checkpoint_claim(ctx.job))
    problems: list[str] = []
    for body in wanted:
        kind, name = body["kind"], body["metadata"]["name"]
        found = _find(ctx.observed.children, kind, name)
        if found is None:
            ctx.plan.create_children.append(body)
            continue
        problem = _problem(ctx, found, kind, name)
        if problem:
            problems.append(problem)
        elif kind == "Service" and found["spec"].get("selector") != body["spec"]["selector"]:
            ctx.plan.patch_children.append(
                (kind, name, {"spec": {"selector": body["spec"]["selector"]}})
            )
    if problems:
        text = "; ".join(problems)
        if ctx.condition(cond.CREATED) is None or ctx.is_true(cond.CREATED):
            ctx.event("Warning", "NameConflict", text)
        ctx.set(cond.CREATED, False, "NameConflict", text)
        ctx.plan.requeue(5)
        ctx.children_ready = False
        return CONTINUE
    if not ctx.is_true(cond.CREATED):
        ctx.set(cond.CREATED, True, "Created", "service and checkpoint volume in place")
        ctx.event("Normal", "Created", f"created service {ctx.job.name} and checkpoint volume")
    ctx.children_ready = True
    return CONTINUE


def claim_problem(
    ctx: Context, children: list[dict[str, Any]], workers_running: bool
) -> tuple[str, str] | None:
    """(reason, message) when the claim the operator created stays unbound while no worker
    runs: no PersistentVolume matches it and no StorageClass provisions it."""
    if workers_running or not ctx.spec.checkpoint.creates_claim:
        return None
    name = builders.claim_name(ctx.job)
    claim = _find(children, "PersistentVolumeClaim", name)
    if claim is None or claim["status"].get("phase") != "Pending":
        return None
    age = ctx.seconds_since(claim["metadata"].get("creationTimestamp")) or 0.0
    timeout = timedelta(seconds=ctx.spec.scheduling.pending_timeout_seconds).total_seconds()
    if age < timeout:
        ctx.plan.requeue(timeout - age)
        return None
    return (
        "ClaimPending",
        f"checkpoint claim {name} is not bound after {int(age)}s: no PersistentVolume matches "
        "it and no StorageClass provisions it (kubectl describe pvc "
        f"{name}; set checkpoint.storageClassName or checkpoint.claimName)",
    )
