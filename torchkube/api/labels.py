"""Label and annotation keys on the objects torchkube creates, and selectors built from them.

Every object a job owns carries the job name; worker pods also carry their slot (the
replica index they fill). ``kubectl get pods -l torchkube.io/job-name=NAME`` lists a job.
"""

PREFIX = "torchkube.io"
JOB_NAME = f"{PREFIX}/job-name"
JOB_UID = f"{PREFIX}/job-uid"
"""The job's UID on every pod: the Service selects by it, so a deleted job's pods that are
still terminating never answer for a new job of the same name."""
ROLE = f"{PREFIX}/role"
REPLICA_INDEX = f"{PREFIX}/replica-index"
FAILURE_RECORDED = f"{PREFIX}/failure-recorded"
"""Set on a failed pod once its failure is counted: an operator restart never counts it twice.
On the rendezvous store, which restarts in place, its value is the restart counted last."""
RELEASED = f"{PREFIX}/released"
"""Set, with the reason, on a live pod the operator deletes on purpose (scale-down, suspend,
duplicate, clean-up) before the delete: the kubelet then moves it to a terminal phase, and
without the label that phase would look like a failure to an operator that restarted."""
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "torchkube-operator"

ROLE_WORKER = "worker"
ROLE_RENDEZVOUS = "rendezvous"
ROLE_PREPARE = "prepare"
"""The pod that prepares spec.data onto the checkpoint volume before any worker starts."""
ROLE_LIGHTHOUSE = "lighthouse"
"""recovery live: torchft's Lighthouse, in a pod of its own (it outlives the store's)."""

TRAINER_CONTAINER = "trainer"
RENDEZVOUS_HOSTNAME = "rendezvous"


def job_labels(job_name: str) -> dict[str, str]:
    return {JOB_NAME: job_name, MANAGED_BY: MANAGER}


def pod_labels(job_name: str, job_uid: str, role: str) -> dict[str, str]:
    labels = {**job_labels(job_name), ROLE: role}
    if job_uid:
        labels[JOB_UID] = job_uid
    return labels


def worker_labels(job_name: str, index: int, job_uid: str = "") -> dict[str, str]:
    return {**pod_labels(job_name, job_uid, ROLE_WORKER), REPLICA_INDEX: str(index)}


def worker_selector(job_name: str) -> str:
    """The label selector of a job's workers, as the scale subresource reports it."""
    return f"{JOB_NAME}={job_name},{ROLE}={ROLE_WORKER}"
