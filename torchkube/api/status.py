"""The TrainingJob ``status``: what the operator observed, written via the status subresource."""

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError
from pydantic.config import JsonDict

from torchkube.api.base import ApiModel
from torchkube.api.reasons import FailureReason
from torchkube.api.types import Condition

Phase = Literal["Queued", "Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})
MAX_FAILURE_HISTORY = 20
MAX_TOPOLOGY_DOMAINS = 32
"""status.topology.domains lists at most this many (a job spread over more is the exception,
and its domainCount says how many)."""
MAX_SLOT_RANGES = 256
"""status.topology.slots writes at most this many characters per domain (ranges of slots in
order are short; a scattered list is cut with an ellipsis)."""
UNLABELLED_DOMAIN = "<none>"
"""The domain of a worker whose node lacks the topology label: never a label value, which
cannot contain ``<``."""

DATE_TIME: JsonDict = {"format": "date-time"}


class FailureRecord(ApiModel):
    """One worker (or rendezvous store) failure, so ``kubectl describe`` answers 'what went
    wrong'."""

    reason: FailureReason = Field(description="Failure class the failure policy acted on.")
    message: str = Field(default="", max_length=4096, description="What happened, in a sentence.")
    pod: str | None = Field(default=None, max_length=253, description="The failed pod.")
    node: str | None = Field(default=None, max_length=253, description="The node it ran on.")
    exit_code: int | None = Field(default=None, description="Container exit code, if any.")
    retryable: bool = Field(default=True, description="Whether the policy retried it.")
    time: str = Field(description="When the operator saw it.", json_schema_extra=DATE_TIME)
    incident: int | None = Field(
        default=None,
        ge=0,
        description="The incident (the value of status.restarts it opened or joined): workers "
        "that fail together share one.",
    )
    counted: bool | None = Field(
        default=None, description="Whether it spends the failurePolicy.maxRestarts budget."
    )
    restart_count: int | None = Field(
        default=None, ge=0, description="For a container restarted in place: which restart."
    )
    step: int | None = Field(
        default=None,
        ge=0,
        description="The training step last reported when it was seen (a rendezvous store "
        "that crashes again at the same step counts under failurePolicy.maxRestarts).",
    )
    replica_group_loss: bool | None = Field(
        default=None,
        description="failurePolicy.recovery live: the loss of this pod's replica group alone, "
        "while the others trained on; no restart, no incident, and nothing spent of "
        "maxRestarts unless the group failed again without committing a step since its last "
        "failure (counted).",
    )
    replica_index: int | None = Field(
        default=None,
        ge=0,
        description="The failed worker's slot (its replica group under recovery live).",
    )


class CheckpointRecord(ApiModel):
    """The newest complete checkpoint the trainer reported."""

    step: int = Field(ge=0, description="Optimizer step of the checkpoint.")
    time: str | None = Field(
        default=None, description="When it was written.", json_schema_extra=DATE_TIME
    )


class PaceWindow(ApiModel):
    """Where the window now measuring the step pace began: a report's step and time."""

    step: int = Field(ge=0, description="The step reported at the window's start.")
    time: str = Field(description="When it was reported.", json_schema_extra=DATE_TIME)


class ProgressRecord(ApiModel):
    """Training progress as last reported by rank 0, and the time left at its recent pace."""

    step: int = Field(default=0, ge=0, description="Optimizer steps done.")
    total_steps: int | None = Field(default=None, ge=0, description="Steps the run will take.")
    loss: float | None = Field(default=None, description="Latest training loss.")
    tokens_per_second: float | None = Field(default=None, ge=0, description="Throughput.")
    updated: str | None = Field(
        default=None, description="When rank 0 reported it.", json_schema_extra=DATE_TIME
    )
    resumes: int | None = Field(
        default=None,
        ge=0,
        description="Times the trainer resumed from a checkpoint, as it reported: a change "
        "starts a new round, which no pace window spans.",
    )
    step_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Wall-clock seconds per step at the recent pace: time over steps in "
        "windows of at least 20 s of reports, weighted towards the last five minutes; "
        "start-up, restarts and suspensions left out, checkpoint saves and evaluations "
        "within a window counted. Kept across a restart at the same world size, unset "
        "when the world size changes, until measured again.",
    )
    pace_window: PaceWindow | None = Field(
        default=None,
        description="The operator's bookkeeping: where the window now measuring the pace "
        "began; unset while the job does not train.",
    )
    estimated_remaining_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Time left until totalSteps at stepSeconds, as of the last report (the "
        "Kubeflow Trainer field of that name): 0 once the job succeeded or every step is "
        "done; unset while not known (no pace or total yet) and whenever the job is not "
        "Running (pending, queued, suspended, restarting, failed).",
    )
    remaining: str | None = Field(
        default=None,
        description="estimatedRemainingSeconds as kubectl prints durations (3h5m), for "
        "kubectl get.",
    )


class SlowestRank(ApiModel):
    """The rank that computes slowest, as the trainer last reported it, and how long it has
    been a straggler (over ``failurePolicy.stragglerSlowdown``) without a break."""

    rank: int = Field(ge=0, description="Global rank of the slowest training process.")
    pod: str | None = Field(default=None, max_length=253, description="The pod it runs in.")
    node: str | None = Field(default=None, max_length=253, description="The node it runs on.")
    slowdown: float = Field(
        ge=0, description="Its compute time per step over the other ranks' median."
    )
    compute_seconds: float = Field(default=0, ge=0, description="Its compute time per step.")
    median_seconds: float = Field(
        default=0, ge=0, description="The other ranks' median compute time per step."
    )
    straggling_since: str | None = Field(
        default=None,
        description="Since when it has been slower than failurePolicy.stragglerSlowdown × the "
        "median without a break; unset while it is not.",
        json_schema_extra=DATE_TIME,
    )


class QueueStatus(ApiModel):
    """Where a job labelled ``kueue.x-k8s.io/queue-name`` stands with Kueue."""

    name: str = Field(max_length=253, description="The LocalQueue it waits in.")
    workload: str = Field(default="", max_length=253, description="Its Kueue Workload.")
    cluster_queue: str | None = Field(
        default=None, max_length=253, description="The ClusterQueue that admitted it."
    )
    admitted_workers: int | None = Field(
        default=None, ge=0, description="Workers Kueue admitted (unset while it waits)."
    )
    position_in_local_queue: int | None = Field(
        default=None,
        ge=0,
        description="Pending workloads ahead of it in its LocalQueue (0: next), as Kueue's "
        "visibility API reports it; unset when admitted or where that API is not served.",
    )
    position_in_cluster_queue: int | None = Field(
        default=None,
        ge=0,
        description="Pending workloads ahead of it in its ClusterQueue (0: next), likewise.",
    )


DataPhase = Literal["Preparing", "Prepared", "Failed"]


class DataStatus(ApiModel):
    """The prepare step of ``spec.data``: where it stands and what it wrote."""

    phase: DataPhase = Field(description="Preparing, Prepared or Failed.")
    source: str = Field(default="", max_length=2048, description="The source, in a few words.")
    pod: str | None = Field(default=None, max_length=253, description="The prepare pod.")
    attempts: int = Field(default=0, ge=0, description="Prepare pods started so far.")
    tokenizer: str | None = Field(
        default=None, max_length=64, description="The tokenizer used: gpt2 or bytes."
    )
    tokenizer_note: str | None = Field(
        default=None,
        max_length=1024,
        description="Why the tokenizer differs from the one asked for (auto without GPT-2's "
        "vocabulary uses bytes).",
    )
    documents: int | None = Field(default=None, ge=0, description="Documents read.")
    train_tokens: int | None = Field(default=None, ge=0, description="Tokens in train.bin.")
    val_tokens: int | None = Field(default=None, ge=0, description="Tokens in val.bin.")
    vocab_size: int | None = Field(default=None, ge=0, description="The tokenizer's vocabulary.")
    message: str = Field(default="", max_length=4096, description="What happened, in a sentence.")


class TopologyStatus(ApiModel):
    """The topology domains the job's workers occupy, for ``spec.scheduling.topology``."""

    level: str = Field(
        max_length=63,
        description="The node label that names the domains (spec.scheduling.topology.level).",
    )
    domains: list[str] = Field(
        default_factory=list,
        max_length=MAX_TOPOLOGY_DOMAINS,
        description="The level's values on the nodes of the job's workers (Pending on a node "
        f"or Running), sorted, each once; {UNLABELLED_DOMAIN} for a worker on a node without "
        f"the label. At most {MAX_TOPOLOGY_DOMAINS}, the first in that order; empty while no "
        "worker is on a node. Kept as last seen once the job ended.",
    )
    domain_count: int = Field(
        default=0,
        ge=0,
        description="How many domains the workers occupy: more than one is a job spread over "
        "domains (the TopologySpread condition says where and what would pack it again).",
    )
    slots: dict[str, str] = Field(
        default_factory=dict,
        description="The workers in each listed domain, by slot (0-3,8): the order of the "
        "data-parallel ranks, so a domain with consecutive slots holds neighbouring ranks "
        "(global rank = slot x nprocPerNode + local rank). Each worker's node: torchkube "
        f"describe. At most {MAX_SLOT_RANGES} characters a domain, cut with an ellipsis.",
    )


class TrainingJobStatus(ApiModel):
    """Observed state of a TrainingJob."""

    phase: Phase = Field(default="Pending", description="Where the job is in its life cycle.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Latest observations, one per type (Created, DataReady, Queued, "
        "Running, Restarting, Suspended, Succeeded, Failed, PodsUnschedulable, PodsBlocked, "
        "StoreReady, LighthouseReady, WaitingForWorkers, StragglerKept, NodesUnreachable, "
        "TopologySpread, Invalid, OperatorForbidden).",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The spec generation the status reflects."
    )
    replicas: int = Field(default=0, ge=0, description="Worker pods that exist and are not done.")
    ready_replicas: int = Field(default=0, ge=0, description="Worker pods that are Ready.")
    desired_replicas: int = Field(default=0, ge=0, description="Worker pods the operator wants.")
    workers: str = Field(default="0/0", description="Ready/desired workers, for kubectl get.")
    world_size: int = Field(default=0, ge=0, description="Training processes in the last round.")
    selector: str = Field(
        default="", description="Label selector of the workers, for the scale subresource."
    )
    restarts: int = Field(
        default=0,
        ge=0,
        description="Failure incidents so far: each restarted training from a checkpoint. "
        "Workers that fail together (a lost store, a network blip) are one incident.",
    )
    restarts_count_towards_max: int = Field(
        default=0,
        ge=0,
        description="Incidents that count against failurePolicy.maxRestarts (infrastructure "
        "failures only count when countInfrastructureFailures is set), and under recovery "
        "live the replica groups lost again without committing a step since their last "
        "failure.",
    )
    replica_group_losses: int = Field(
        default=0,
        ge=0,
        description="failurePolicy.recovery live: replica groups lost while the others "
        "trained on (each a pod's loss that restarted nothing); not in restarts. A group "
        "lost again before committing a step counts in restartsCountTowardsMax too.",
    )
    last_failure: FailureRecord | None = Field(
        default=None, description="The most recent worker failure."
    )
    failures: list[FailureRecord] = Field(
        default_factory=list,
        max_length=MAX_FAILURE_HISTORY,
        description=f"The last {MAX_FAILURE_HISTORY} worker failures, oldest first.",
    )
    latest_checkpoint: CheckpointRecord | None = Field(
        default=None, description="The newest complete checkpoint."
    )
    progress: ProgressRecord | None = Field(default=None, description="Training progress.")
    data: DataStatus | None = Field(
        default=None, description="The preparation of spec.data, when the job has one."
    )
    queue: QueueStatus | None = Field(
        default=None, description="Its admission by Kueue, when it has a queue-name label."
    )
    goodput: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Share of the job's wall time (suspended time left out) spent on training "
        "progress it kept, rather than lost to scheduling, start-up, failure recovery, re-done "
        "steps, checkpoint stalls or hangs (docs/metrics.md).",
    )
    slowest_rank: SlowestRank | None = Field(
        default=None,
        description="The slowest rank of the last progress report (compute time per step "
        "against the other ranks' median): where a straggler is, and for how long.",
    )
    topology: TopologyStatus | None = Field(
        default=None,
        description="The topology domains the workers occupy, when spec.scheduling.topology "
        "is set.",
    )
    spares: int = Field(
        default=0,
        ge=0,
        description="Hot spares standing by warm: Running worker pods beyond the desired count "
        "whose container is started, its launcher done importing torch (replicas.spares).",
    )
    start_time: str | None = Field(
        default=None,
        description="When the job first ran: replicas.min workers and its rendezvous store.",
        json_schema_extra=DATE_TIME,
    )
    last_start_time: str | None = Field(
        default=None,
        description="When the job first ran (replicas.min workers and its rendezvous store) "
        "since it was created or last resumed: runPolicy.activeDeadlineSeconds counts from "
        "here. Unset while suspended (a suspension stops and resets that clock, as it does a "
        "Kubernetes Job's).",
        json_schema_extra=DATE_TIME,
    )
    suspended_seconds: float = Field(
        default=0,
        ge=0,
        description="Time spent suspended before the current suspension, left out of "
        "startDeadlineSeconds.",
    )
    completion_time: str | None = Field(
        default=None, description="When the job finished.", json_schema_extra=DATE_TIME
    )

    @classmethod
    def lenient(cls, raw: Mapping[str, Any] | None) -> "TrainingJobStatus":
        """The status as stored, read without failing: what this version cannot read (an
        older or newer operator wrote it) is left out, field by field. Older operators wrote
        goodput as ``{ratio: ...}``."""
        data = dict(raw or {})
        if isinstance(data.get("goodput"), dict):
            data["goodput"] = data["goodput"].get("ratio")
        while True:
            try:
                return cls.model_validate(data)
            except ValidationError as error:
                bad = {str(e["loc"][0]) for e in error.errors() if e["loc"]} & set(data)
                if not bad:
                    return cls()
                for key in bad:
                    del data[key]
