"""A job Kueue's MultiKueue dispatches (``spec.managedBy: kueue.x-k8s.io/multikueue``), as the
manager cluster's operator follows it.

MultiKueue runs such a job on a worker cluster: once the job's Workload here holds quota, it
copies the Workload to the worker clusters, and to the first that admits it a copy of the job
(without ``managedBy``, labelled with the Workload's name), then copies that copy's whole
status back here, and finishes the Workload here when the worker's finishes. So on the manager
torchkube makes the Workload and nothing else — no pod, no store, no claim: the job's pods run
on the worker, under the worker's operator.

The status has one writer at a time: this operator while the job waits to be dispatched (it
says why, in Kueue's words), Kueue's copy from the worker once the Workload names its worker
cluster (``status.clusterName``), or has finished. A dispatched job evicted here (preempted,
deactivated) is this operator's again: with no pod here to stop, it gives the quota back at
once, as for any evicted job, and MultiKueue then removes the copy from the worker. A worker
cluster lost for longer than MultiKueue's ``workerLostTimeout`` puts the Workload back in line
without a cluster: the job says so again here until it is dispatched anew.
"""

from torchkube.operator import conditions as cond
from torchkube.operator import queueing, workloads
from torchkube.operator.decision import CONTINUE, Context
from torchkube.policy.queue import QUEUE_LABEL, queue_name

WAITING = "WaitingForDispatch"
NO_QUEUE = "NoQueue"
NO_KUEUE = "QueueingDisabled"
NOT_ELASTIC = "ElasticNotDispatched"
REDISPATCH = "WaitingForRedispatch"


def follow(ctx: Context) -> None:
    """Make the Workload and say why the job waits, until MultiKueue dispatches it; then
    leave the status to Kueue's copy from the worker."""
    observed = ctx.observed.queue
    state = observed.workload if observed else None
    if state is not None and (state.cluster or state.is_true("Finished")):
        evicted_here = state.is_true("Evicted") and state.reserved
        if not evicted_here:
            ctx.plan.keep_status = True
            return
    queue = queue_name(ctx.job)
    if queue is None:
        _wait(
            ctx,
            NO_QUEUE,
            f"spec.managedBy is {ctx.spec.managed_by}, but MultiKueue dispatches only a job "
            f"in a queue: label it {QUEUE_LABEL}=<a LocalQueue whose ClusterQueue has a "
            "MultiKueue admission check> (kubectl label), and it is queued at once",
        )
        return
    if workloads.elastic(ctx.job):
        _wait(
            ctx,
            NOT_ELASTIC,
            f"annotated {workloads.ELASTIC_ANNOTATION}=true, but MultiKueue does not dispatch "
            "Kueue's workload slices: remove the annotation (the job then runs at the size "
            "its worker cluster admits), or create the job again without spec.managedBy to "
            "run it resizable in this cluster",
        )
        return
    if observed is not None and observed.kueue == "disabled":
        _wait(
            ctx,
            NO_KUEUE,
            f"spec.managedBy is {ctx.spec.managed_by}, but this operator runs with "
            "kueue.enabled=false (TORCHKUBE_KUEUE_ENABLED) and makes no Workload for "
            "MultiKueue to dispatch: install the chart with kueue.enabled=true",
        )
        return
    progress, checkpoint = ctx.status.progress, ctx.status.latest_checkpoint
    if queueing.hold(ctx) is CONTINUE:  # ctx.owned is empty: its pods run on the worker
        assert state is not None  # admitted: hold saw its Workload
        _wait(
            ctx,
            WAITING,
            f"admitted in LocalQueue {queue}; MultiKueue is sending it to a worker cluster"
            + (f" ({state.checks_message()})" if state.checks_message() else ""),
        )
    if progress is not None and state is not None:
        _ran_before(ctx, progress.step, checkpoint.step if checkpoint else None)


def _ran_before(ctx: Context, step: int, checkpoint: int | None) -> None:
    """A job back in line after it ran on a worker cluster (the worker was lost past
    MultiKueue's ``workerLostTimeout``, or evicted it): where it got to, and what the next
    dispatch resumes from, instead of a silent start over."""
    queued = ctx.condition(cond.QUEUED)
    why = queued.message if queued else ""
    saved = f"its newest checkpoint of step {checkpoint}" if checkpoint else "no checkpoint"
    _wait(
        ctx,
        REDISPATCH,
        f"{why}; it ran on a worker cluster before (step {step} there, {saved}): dispatched "
        "again, it resumes from that checkpoint only if the next worker cluster reaches the "
        "same store (checkpoint.claimName on storage the clusters share), else it starts "
        "over at step 0 there",
    )


def _wait(ctx: Context, reason: str, message: str) -> None:
    """Queued, with the reason; an event when the reason is new."""
    queued = ctx.condition(cond.QUEUED)
    if queued is None or queued.status != "True" or queued.reason != reason:
        ctx.event("Warning" if reason != WAITING else "Normal", reason, message)
    ctx.status.phase = "Queued"
    ctx.set(cond.QUEUED, True, reason, message)
    ctx.clear(cond.RUNNING, reason, message)
