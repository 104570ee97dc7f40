"""Which Kueue LocalQueue a job waits in, and what its label means where nothing admits
through Kueue: read alike by the operator (its Workloads, its queueing step) and by
``torchkube run``, which runs a labelled job at once and says so.
"""

from torchkube.api import TrainingJob

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""Kueue's label naming the LocalQueue a job is submitted to."""


def queue_name(job: TrainingJob) -> str | None:
    """The LocalQueue the job waits in, or None for a job Kueue does not admit. A job once
    under Kueue stays there (in its last queue) when its label is removed: dropping the
    label must not start it past the quota. Moving it is changing the label."""
    labelled = job.metadata.get("labels", {}).get(QUEUE_LABEL)
    if labelled:
        return str(labelled)
    return job.status.queue.name if job.status and job.status.queue else None


def label_ignored(queue: str, because: str) -> str:
    """What a queue-name label means where nothing admits through Kueue: said alike by an
    operator with the integration off and by ``torchkube run``, which both run the job now."""
    return (
        f"the label {QUEUE_LABEL}={queue} is ignored: {because}, so the job runs "
        f"without waiting for Kueue"
    )
