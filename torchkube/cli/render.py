"""What the cluster commands print: pure functions from the API's objects to text.

Pods and events are taken as the API returns them (camelCase keys, RFC 3339 times); a job's
status is read through its model (``TrainingJobStatus.lenient``), so the CLI and the operator
agree on what every field means. Everything takes ``now``, so a unit test can pin the exact
output. A field the operator has not written yet (no status, no progress, no goodput) shows as
``-``: a job that just started is not an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api.spec import MANAGED_BY_MULTIKUEUE
from torchkube.api.status import (
    UNLABELLED_DOMAIN,
    FailureRecord,
    ProgressRecord,
    TrainingJobStatus,
)
from torchkube.api.times import human_duration, parse_time
from torchkube.api.types import Condition
from torchkube.cli import pods as p

NONE = "-"
GROUP_RESOURCE = "trainingjob.torchkube.io"


# --- small cells -------------------------------------------------------------------------


def age(timestamp: Any, now: datetime) -> str:
    """Time since ``timestamp``, kubectl style; ``-`` without one."""
    when = parse_time(timestamp)
    return human_duration((now - when).total_seconds()) if when else NONE


def step_cell(progress: ProgressRecord | None) -> str:
    """``1200/20000 (6%)``; just the step when the total is unknown."""
    if progress is None:
        return NONE
    if not progress.total_steps:
        return str(progress.step)
    return (
        f"{progress.step}/{progress.total_steps} ({100 * progress.step // progress.total_steps}%)"
    )


def loss_cell(progress: ProgressRecord | None) -> str:
    return f"{progress.loss:.4f}" if progress and progress.loss is not None else NONE


def throughput_cell(progress: ProgressRecord | None) -> str:
    rate = progress.tokens_per_second if progress else None
    return f"{rate:,.0f}" if rate is not None else NONE


def remaining_cell(status: TrainingJobStatus, why: bool = False) -> str:
    """``3h8m``: the operator's estimate of the time left at the recent step pace; with
    ``why``, the pace it assumes, or why there is no estimate."""
    progress = status.progress
    left = progress.estimated_remaining_seconds if progress else None
    if left is not None:
        pace = progress.step_seconds if progress and left else None
        text = human_duration(left)
        return f"{text} at {pace:.3g} s/step (the recent pace)" if why and pace else text
    if why and progress is not None and status.phase == "Running":
        if not progress.total_steps:
            return f"{NONE} (no total steps)"
        if progress.step_seconds is None:
            return f"{NONE} (measuring the pace)"
    return NONE


def checkpoint_cell(status: TrainingJobStatus, now: datetime) -> str:
    """``step 200 (3m ago)``: how much work a failure right now would cost."""
    checkpoint = status.latest_checkpoint
    if checkpoint is None:
        return NONE
    when = checkpoint.time
    return f"{checkpoint.step} ({age(when, now)} ago)" if when else str(checkpoint.step)


def goodput_cell(status: TrainingJobStatus) -> str:
    """The share of wall time spent on training that was kept, if the operator reports it."""
    return f"{status.goodput:.1%}" if status.goodput is not None else NONE


def phase_cell(status: TrainingJobStatus) -> str:
    """The phase, and for a job waiting for Kueue the LocalQueue it waits in."""
    queue = status.queue
    if status.phase == "Queued" and queue is not None:
        if queue.position_in_local_queue is None:
            return f"Queued ({queue.name})"
        return f"Queued ({queue.name}, {_ahead(queue.position_in_local_queue)})"
    return status.phase


def _ahead(position: int) -> str:
    return "next" if position == 0 else f"{position} ahead"


def dispatch_line(cluster: str | None) -> str:
    """Where MultiKueue sent a job, for ``describe`` on the manager cluster."""
    if cluster is None:
        return (
            "not dispatched yet: MultiKueue sends it to a worker cluster that admits it "
            "(see Conditions)"
        )
    return (
        f"worker cluster {cluster}, dispatched by MultiKueue: the status is the worker's; its "
        "pods, logs and events are there (use that cluster's kubeconfig)"
    )


def queue_line(status: TrainingJobStatus) -> str:
    """Where the job stands with Kueue, for ``describe``."""
    queue = status.queue
    if queue is None:
        return NONE
    if queue.admitted_workers is None:
        where = f"waiting in LocalQueue {queue.name}"
        if queue.position_in_local_queue is not None:
            where += f", {_ahead(queue.position_in_local_queue)}"
            if queue.position_in_cluster_queue is not None:
                where += f" ({_ahead(queue.position_in_cluster_queue)} in its ClusterQueue)"
        return f"{where} (Workload {queue.workload})"
    return (
        f"admitted from LocalQueue {queue.name} by ClusterQueue {queue.cluster_queue} at "
        f"{queue.admitted_workers} workers (Workload {queue.workload})"
    )


def topology_line(status: TrainingJobStatus) -> str:
    """The domains the workers occupy, for ``describe``: ``example.com/rack rack-3``, and for a
    job spread over several, how many and that it is (the TopologySpread condition says
    what would pack it again)."""
    topology = status.topology
    if topology is None:
        return NONE
    if not topology.domains:
        return f"{topology.level}: no worker on a node"
    named = ", ".join(topology.domains)
    if topology.domain_count > len(topology.domains):
        named += f" and {topology.domain_count - len(topology.domains)} more"
    if topology.domain_count == 1:
        return f"{topology.level} {named}"
    return f"{topology.level}: spread over {topology.domain_count} domains: {named}"


def status_of(job: dict[str, Any]) -> TrainingJobStatus:
    return TrainingJobStatus.lenient(job.get("status"))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Left-aligned columns three spaces apart, as ``kubectl get`` prints them."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in [headers, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append(indent + "   ".join(cells).rstrip())
    return "\n".join(lines)


# --- torchkube status --------------------------------------------------------------------

STATUS_HEADERS = [
    "NAME",
    "PHASE",
    "WORKERS",
    "RESTARTS",
    "STEP",
    "REMAINING",
    "LOSS",
    "CHECKPOINT",
]


def status_table(
    jobs: Sequence[dict[str, Any]],
    now: datetime,
    *,
    all_namespaces: bool = False,
    wide: bool = False,
    dispatched: Mapping[str, str] | None = None,
) -> str:
    """The ``torchkube status`` table: one row per job; a job MultiKueue dispatched shows
    the worker cluster it runs on (``dispatched``: job uid → cluster) beside its phase."""
    headers = list(STATUS_HEADERS)
    if wide:
        headers += ["TOKENS/S", "WORLD"]
    headers += ["GOODPUT", "AGE"]
    if all_namespaces:
        headers.insert(0, "NAMESPACE")
    rows = []
    for job in jobs:
        meta, status = job.get("metadata", {}), status_of(job)
        written = job.get("status") is not None
        progress = status.progress
        phase = phase_cell(status) if written else NONE
        cluster = (dispatched or {}).get(str(meta.get("uid", "")))
        row = [
            str(meta.get("name", "")),
            f"{phase} (on {cluster})" if cluster else phase,
            status.workers if written else NONE,
            str(status.restarts),
            step_cell(progress),
            remaining_cell(status),
            loss_cell(progress),
            checkpoint_cell(status, now),
        ]
        if wide:
            row += [throughput_cell(progress), str(status.world_size) if written else NONE]
        row += [goodput_cell(status), age(meta.get("creationTimestamp"), now)]
        if all_namespaces:
            row.insert(0, str(meta.get("namespace", "")))
        rows.append(row)
    return table(headers, rows)


# --- torchkube describe ------------------------------------------------------------------


def _fields(pairs: Sequence[tuple[str, str]], indent: str = "") -> list[str]:
    width = max(len(key) for key, _ in pairs) + 2
    return [f"{indent}{(key + ':').ljust(width)}{value}" for key, value in pairs]


def spec_summary(job: dict[str, Any]) -> list[tuple[str, str]]:
    """The spec in a few lines: what runs, on how much, and how it survives failures."""
    spec = job.get("spec") or {}
    name = str(job.get("metadata", {}).get("name", ""))
    resources = spec.get("resources") or {}
    replicas = spec.get("replicas") or {}
    checkpoint = spec.get("checkpoint") or {}
    failure = spec.get("failurePolicy") or {}
    run = spec.get("runPolicy") or {}
    trainer = spec.get("trainer") or {}

    command = " ".join(["torchrun …", *spec.get("command", []), *spec.get("args", [])])
    gpus = int(resources.get("gpus", 0) or 0)
    compute = (
        f"{gpus} × {resources.get('gpuResourceName', 'nvidia.com/gpu')} per worker"
        if gpus
        else "no GPUs"
    )
    extra = ", ".join(f"{k} {v}" for k, v in (resources.get("requests") or {}).items())
    compute += f", {extra}" if extra else ""
    compute += f"; nprocPerNode {spec.get('nprocPerNode', 'auto')}"

    desired = replicas.get("desired")
    sizes = f"min {replicas.get('min', 1)}, max {replicas.get('max', 1)}, desired " + (
        str(desired) if desired is not None else "unset (max)"
    )

    claim = (
        checkpoint.get("claimName")
        or f"{name}-checkpoints (created, {checkpoint.get('size') or '10Gi'})"
    )
    cadence = []
    if checkpoint.get("intervalSteps"):
        cadence.append(f"every {checkpoint['intervalSteps']} steps")
    if checkpoint.get("intervalSeconds"):
        cadence.append(f"every {checkpoint['intervalSeconds']} s")
    ckpt = f"{claim} at {checkpoint.get('mountPath', '/checkpoints')}"
    ckpt += f", {' or '.join(cadence)}" if cadence else ""
    ckpt += f", keep {checkpoint.get('keep', 3)}"

    codes = ", ".join(str(c) for c in failure.get("permanentExitCodes", [2, 3, 126, 127]))
    policy = (
        f"maxRestarts {failure.get('maxRestarts', 10)}, permanent exit codes [{codes}], "
        f"OOMKilled → {failure.get('onOomKilled', 'Retry')}, node lost after "
        f"{failure.get('nodeLostGraceSeconds', 30)} s"
    )

    lifecycle = [f"suspend {str(bool(run.get('suspend', False))).lower()}"]
    lifecycle.append(f"cleanPodPolicy {run.get('cleanPodPolicy', 'Running')}")
    if run.get("activeDeadlineSeconds"):
        lifecycle.append(f"activeDeadlineSeconds {run['activeDeadlineSeconds']}")
    if run.get("ttlSecondsAfterFinished") is not None:
        lifecycle.append(f"ttlSecondsAfterFinished {run['ttlSecondsAfterFinished']}")

    pairs = [
        ("Image", str(spec.get("image", NONE))),
        ("Command", command),
        ("Resources", compute),
        ("Replicas", sizes),
        ("Checkpoint", ckpt),
        ("Failure policy", policy),
        ("Run policy", ", ".join(lifecycle)),
    ]
    if trainer:
        pairs.append(("Trainer", _trainer_summary(trainer)))
    return pairs


def _trainer_summary(trainer: dict[str, Any]) -> str:
    parts = [
        f"{label} {trainer[key]}"
        for key, label in [
            ("model", "model"),
            ("strategy", "strategy"),
            ("precision", "precision"),
            ("steps", "steps"),
            ("globalBatchSize", "global batch"),
            ("seqLen", "seq len"),
        ]
        if trainer.get(key) is not None
    ]
    return ", ".join(parts) or NONE


def pod_state(pod: dict[str, Any]) -> str:
    """What kubectl's STATUS column says: Terminating, a container's reason, else the phase."""
    if p.deleting(pod):
        return "Terminating"
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated and terminated.get("reason"):
            code = terminated.get("exitCode")
            return f"{terminated['reason']} (exit {code})" if code else terminated["reason"]
        if waiting and waiting.get("reason"):
            return str(waiting["reason"])
    return str(status.get("reason") or status.get("phase") or "Unknown")


def pod_ready(pod: dict[str, Any]) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or []) or len(statuses)
    return f"{sum(1 for c in statuses if c.get('ready'))}/{total}"


def pods_table(
    pods: Sequence[dict[str, Any]], now: datetime, domains: Mapping[str, str] | None = None
) -> str:
    """The job's pods: the store and the Lighthouse, then the workers by slot — their rank
    order (torchkube/elastic/ranks.py). With ``domains`` (node → its domain at the job's
    topology level), a DOMAIN column."""
    servers = {lbl.ROLE_RENDEZVOUS: 0, lbl.ROLE_LIGHTHOUSE: 1}
    ordered = sorted(
        pods, key=lambda q: (servers.get(p.role(q) or "", 2), p.slot(q) or 0, p.created(q))
    )
    rows = []
    for pod in ordered:
        node = (pod.get("spec") or {}).get("nodeName")
        row = [
            p.name(pod),
            p.role(pod) or NONE,
            str(p.slot(pod)) if p.slot(pod) is not None else NONE,
            pod_state(pod),
            pod_ready(pod),
            str(node or NONE),
        ]
        if domains is not None:
            row.append(domains.get(node, UNLABELLED_DOMAIN) if node else NONE)
        rows.append([*row, age(pod.get("metadata", {}).get("creationTimestamp"), now)])
    headers = ["NAME", "ROLE", "SLOT", "STATUS", "READY", "NODE"]
    headers += ["DOMAIN"] if domains is not None else []
    return table([*headers, "AGE"], rows, indent="  ")


def _event_time(event: dict[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or event.get("metadata", {}).get("creationTimestamp")
        or ""
    )


def _event_sort_key(event: dict[str, Any]) -> datetime:
    return parse_time(_event_time(event)) or datetime.min.replace(tzinfo=UTC)


def events_table(events: Sequence[dict[str, Any]], now: datetime) -> str:
    """Events oldest first, with kubectl's ``(x3 over 2m)`` for repeated ones."""
    rows = []
    for event in sorted(events, key=_event_sort_key):
        when = age(_event_time(event), now)
        count = int(event.get("count") or 1)
        if count > 1 and event.get("firstTimestamp"):
            when = f"{when} (x{count} over {age(event['firstTimestamp'], now)})"
        source = event.get("source") or {}
        rows.append(
            [
                str(event.get("type", "")),
                str(event.get("reason", "")),
                when,
                str(source.get("component") or event.get("reportingComponent") or NONE),
                str(event.get("message", "")).strip(),
            ]
        )
    return table(["TYPE", "REASON", "AGE", "FROM", "MESSAGE"], rows, indent="  ")


def conditions_table(conditions: Sequence[Condition], now: datetime) -> str:
    rows = [
        [c.type, c.status, c.reason, age(c.last_transition_time, now), c.message]
        for c in conditions
    ]
    return table(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], rows, indent="  ")


def failures_table(failures: Sequence[FailureRecord], now: datetime) -> str:
    rows = [
        [
            age(f.time, now),
            f.reason,
            f.pod or NONE,
            f.node or NONE,
            str(f.exit_code) if f.exit_code is not None else NONE,
            "yes" if f.retryable else "no",
            f.message,
        ]
        for f in failures
    ]
    return table(["AGE", "REASON", "POD", "NODE", "EXIT", "RETRIED", "MESSAGE"], rows, indent="  ")


def describe(
    job: dict[str, Any],
    pods: Sequence[dict[str, Any]],
    events: Sequence[dict[str, Any]],
    now: datetime,
    dispatched_to: str | None = None,
    node_domains: Mapping[str, str] | None = None,
) -> str:
    """``torchkube describe``: identity, state (with the topology domains the workers
    occupy, and for a job MultiKueue dispatches the worker cluster ``dispatched_to``), spec,
    conditions, failures, pods (each one's domain from ``node_domains``: given for a job with a
    topology whose nodes could be read), events."""
    meta, status = job.get("metadata", {}), status_of(job)
    written = job.get("status") is not None
    spec = job.get("spec") or {}
    progress = status.progress
    created = meta.get("creationTimestamp")
    max_restarts = (spec.get("failurePolicy") or {}).get("maxRestarts", 10)
    workers = (
        f"{status.workers if written else NONE} ready (desired "
        f"{status.desired_replicas if written else NONE}), "
        f"world size {status.world_size if written else NONE}"
    )
    used = f"{status.restarts_count_towards_max} of maxRestarts {max_restarts} used"
    if status.replica_group_losses:
        used += (
            f"; {status.replica_group_losses} replica groups lost while the others trained on "
            "(recovery live, not restarts)"
        )
    state = [
        ("Name", str(meta.get("name", ""))),
        ("Namespace", str(meta.get("namespace", ""))),
        ("Created", f"{created} ({age(created, now)} ago)" if created else NONE),
        ("Phase", status.phase if written else NONE),
        ("Workers", workers),
        ("Restarts", f"{status.restarts} ({used})"),
        (
            "Progress",
            f"step {step_cell(progress)}, loss {loss_cell(progress)}, "
            f"{throughput_cell(progress)} tokens/s"
            if progress
            else NONE,
        ),
        ("Time left", remaining_cell(status, why=True)),
        ("Checkpoint", checkpoint_cell(status, now)),
        ("Goodput", goodput_cell(status)),
    ]
    if status.queue is not None:
        state.append(("Queue", queue_line(status)))
    if spec.get("managedBy") == MANAGED_BY_MULTIKUEUE:
        state.append(("Runs on", dispatch_line(dispatched_to)))
    if status.topology is not None:
        state.append(("Topology", topology_line(status)))
    if status.start_time:
        state.append(("Started", status.start_time))
    if status.completion_time:
        state.append(("Completed", status.completion_time))

    out = _fields(state)
    out += ["Spec:", *_fields(spec_summary(job), indent="  ")]
    conditions = status.conditions
    out += ["Conditions:", conditions_table(conditions, now) if conditions else "  <none>"]
    failures = status.failures
    title = f"Failures (last {len(failures)}, oldest first):" if failures else "Failures:"
    out += [title, failures_table(failures, now) if failures else "  <none>"]
    out += ["Pods:", pods_table(pods, now, node_domains) if pods else "  <none>"]
    out += ["Events:", events_table(events, now) if events else "  <none>"]
    return "\n".join(out)


# --- one-liners --------------------------------------------------------------------------


def done(name: str, verb: str, note: str = "") -> str:
    """``trainingjob.torchkube.io/NAME created``, kubectl's confirmation shape."""
    suffix = f" ({note})" if note else ""
    return f"{GROUP_RESOURCE}/{name} {verb}{suffix}"


def prefixed(pod_name: str, line: str) -> str:
    """A log line of ``logs --all``: the pod's name first, so interleaved lines stay apart."""
    return f"[{pod_name}] {line}"
