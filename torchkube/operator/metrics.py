"""The operator's Prometheus metrics (names documented in docs/metrics.md).

Labels stay low-cardinality: namespace, phase, reason, verb, resource — never a pod or step.
"""

from prometheus_client import Counter, Gauge, Histogram

JOBS = Gauge("torchkube_jobs", "TrainingJobs by namespace and phase.", ["namespace", "phase"])
RESTARTS = Counter(
    "torchkube_job_restarts_total",
    "Worker failures the operator replaced, by failure reason.",
    ["namespace", "reason"],
)
POD_REPLACEMENTS = Counter(
    "torchkube_pod_replacements_total",
    "Worker pods created to replace a failed, lost or evicted one.",
    ["namespace"],
)
NODE_LOSS = Counter(
    "torchkube_node_loss_detections_total",
    "Workers declared lost because their node stopped being Ready beyond the grace.",
    ["namespace"],
)
JOB_FAILURES = Counter(
    "torchkube_job_failures_total", "Jobs that ended Failed, by reason.", ["namespace", "reason"]
)
STARTUP = Histogram(
    "torchkube_job_startup_seconds",
    "From job creation to all desired workers Running.",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
RECOVERY = Histogram(
    "torchkube_recovery_seconds",
    "From a worker failure to all desired workers Running again.",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)
RECONCILE = Histogram(
    "torchkube_reconcile_duration_seconds",
    "Time to reconcile one job, API calls included.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter(
    "torchkube_reconcile_errors_total", "Reconciles that raised; the job is retried.", []
)
API_REQUESTS = Counter(
    "torchkube_api_requests_total",
    "Requests the operator sent to the Kubernetes API.",
    ["verb", "resource"],
)
