"""Label and annotation keys on the objects torchkube creates, and selectors built from them.

Every object a job owns carries the job name; worker pods also carry their slot (the
replica index they fill). ``kubectl get pods -l torchkube.io/job-name=NAME`` lists a job.
"""

PREFIX = "torchkube.io"
JOB_NAME = f"{PREFIX}/job-name"
ROLE = f"{PREFIX}/role"
REPLICA_INDEX = f"{PREFIX}/replica-index"
FAILURE_RECORDED = f"{PREFIX}/failure-recorded"
"""Set on a failed worker once its failure is counted: an operator restart never counts it twice."""
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "torchkube-operator"

ROLE_WORKER = "worker"
ROLE_RENDEZVOUS = "rendezvous"

TRAINER_CONTAINER = "trainer"
RENDEZVOUS_HOSTNAME = "rendezvous"


def job_labels(job_name: str) -> dict[str, str]:
    return {JOB_NAME: job_name, MANAGED_BY: MANAGER}


def worker_labels(job_name: str, index: int) -> dict[str, str]:
    return {**job_labels(job_name), ROLE: ROLE_WORKER, REPLICA_INDEX: str(index)}


def worker_selector(job_name: str) -> str:
    """The label selector of a job's workers, as the scale subresource reports it."""
    return f"{JOB_NAME}={job_name},{ROLE}={ROLE_WORKER}"
