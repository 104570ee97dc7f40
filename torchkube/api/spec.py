"""The TrainingJob ``spec``: what the user asks for.

Every cross-field rule is written twice on purpose: as a pydantic validator (so
``torchkube run`` and the operator reject bad input with the same words) and as a CEL rule in
``x-kubernetes-validations`` (so ``kubectl apply`` rejects it before anything is stored). The
tests in ``tests/unit/test_api_validation.py`` feed the same bad specs to both.
"""

from typing import Any, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from torchkube.api.base import ApiModel
from torchkube.api.contract import PERMANENT_EXIT_CODES
from torchkube.api.data import TRAIN_FILE, VAL_FILE, DataSpec
from torchkube.api.trainer import TrainerSpec
from torchkube.api.types import (
    DNS_SUBDOMAIN,
    LABEL_KEY,
    EnvVar,
    FreeForm,
    NprocPerNode,
    Quantity,
)

BUILTIN_TRAINER_COMMAND = ["-m", "torchkube.trainer"]
DATA_OR_PATH = (
    "set spec.data (the job prepares its data) or trainer.dataPath (data already on a volume), "
    "not both"
)
DATA_EVAL = "trainer.evalIntervalSteps > 0 needs a validation split: set data.valFraction above 0"
LIVE_SUPPORTS = (
    "failurePolicy.recovery live supports strategy ddp or fsdp (inside each pod, any number of "
    "processes) and no tensor parallelism so far, and a rendezvous.port below 65535 (its "
    "Lighthouse takes the next port): use recovery restart for the others"
)
HSDP_RANGE = (
    "trainer.hsdpShardSize must divide the data-parallel size at every size in the elastic range"
)
MANAGED_BY_TORCHKUBE = "torchkube.io/trainingjob-controller"
"""``spec.managedBy`` of a job torchkube's operator runs where it is (the default)."""
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"
"""``spec.managedBy`` of a job Kueue's MultiKueue dispatches to a worker cluster: on this
(the manager) cluster torchkube only makes its Workload; Kueue copies the job to the worker
chosen, without this field, and copies the worker's status back."""
MANAGED_BY_FIXED = (
    "spec.managedBy is immutable: who runs the job is chosen once; delete the TrainingJob "
    "and create it again to change it"
)

DEFAULT_IMAGE = "ghcr.io/torchkube/torchkube-trainer:0.1.0"
"""The trainer image .github/workflows/release.yml publishes for this version (docs/images.md)."""


def cel(*rules: tuple[str, str]) -> ConfigDict:
    """Model config that attaches CEL rules (rule, message) to the model's OpenAPI schema."""
    return ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]
        }
    )


IMMUTABLE_FIELDS = "x-torchkube-immutable-fields"
"""Schema extra of an object whose every field is immutable (:func:`immutable_fields`); the
CRD generator (``torchkube.api.crd``) turns it into rules and leaves it out."""


def immutable_message(description: str) -> str:
    return (
        f"{description} is immutable; delete the TrainingJob and create a new one (the "
        "checkpoint volume can be reused through checkpoint.claimName)"
    )


def immutable(description: str) -> dict[str, Any]:
    """Schema extras for a field that cannot change once the job exists.

    A running rendezvous cannot mix workers of two images or two trainer configs, so such a
    change is refused at the apiserver with a message that says what to do instead.
    """
    return {
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": immutable_message(description)}
        ]
    }


def immutable_fields(description: str) -> dict[str, Any]:
    """Schema extras for a wide object none of whose fields can change once the job exists:
    the same refusal as :func:`immutable`, written as a rule per field and one on which
    fields are set. The API server evaluates every rule on every write of the job, status
    writes included, and ``self == oldSelf`` on a whole object compares it field by field,
    each field looked up through the schema (its cost grows with the square of the fields:
    ``bench.operator_cost``'s API server rows)."""
    return {IMMUTABLE_FIELDS: immutable_message(description)}


class ResourcesSpec(ApiModel):
    """Compute for each worker pod."""

    gpus: int = Field(default=0, ge=0, le=64, description="GPUs per worker pod.")
    gpu_resource_name: str = Field(
        default="nvidia.com/gpu",
        max_length=253,
        description="Extended resource name the GPUs are requested under.",
    )
    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description="Extra resource requests per worker pod, e.g. cpu: 8, memory: 64Gi.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description="Resource limits per worker pod. GPUs are always added as limits.",
    )


class ReplicasSpec(ApiModel):
    """How many worker pods (torchrun agents, one per pod) the job runs."""

    model_config = cel(
        ("self.min <= self.max", "replicas.min must be less than or equal to replicas.max"),
        (
            "!has(self.desired) || (self.desired >= self.min && self.desired <= self.max)",
            "replicas.desired (what kubectl scale sets) must lie between replicas.min and "
            "replicas.max",
        ),
        (
            "!has(self.spares) || self.spares == 0 || !has(self.desired) || "
            "self.desired == self.max",
            "replicas.spares stand by beyond replicas.max, so a job with spares runs at "
            "replicas.max: set spares to 0 before scaling below max",
        ),
    )

    min: int = Field(
        default=1, ge=1, le=10000, description="Fewest workers training may continue with."
    )
    max: int = Field(
        default=1, ge=1, le=10000, description="Most workers; min == max means a fixed size."
    )
    desired: int | None = Field(
        default=None,
        ge=1,
        le=10000,
        description="Workers wanted now; moved by the scale subresource. Unset means max.",
    )
    spares: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Hot spares: worker pods started beyond max (image pulled, Python and "
        "torch imported, joined to the rendezvous as standbys) that take a lost worker's "
        "place at the next round without waiting for scheduling or start-up (with "
        "failurePolicy.recovery live: its model built, it joins the next quorum and copies "
        "the live state). Each holds a worker's resources (its GPUs) idle while it waits.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min > self.max:
            raise ValueError(
                f"replicas.min ({self.min}) must be less than or equal to replicas.max ({self.max})"
            )
        if self.desired is not None and not self.min <= self.desired <= self.max:
            raise ValueError(
                f"replicas.desired ({self.desired}) must lie between replicas.min ({self.min}) "
                f"and replicas.max ({self.max})"
            )
        if self.spares and self.desired is not None and self.desired != self.max:
            raise ValueError(
                f"replicas.spares ({self.spares}) stand by beyond replicas.max, so a job with "
                f"spares runs at replicas.max ({self.max}), not replicas.desired "
                f"({self.desired}): set spares to 0 before scaling below max"
            )
        return self

    @property
    def target(self) -> int:
        """The worker count the operator steers towards."""
        return self.max if self.desired is None else self.desired

    @property
    def pods(self) -> int:
        """Worker pods the operator keeps: the target and the spares standing by beyond it
        (the rendezvous takes at most ``max`` of them into a round)."""
        return self.target + self.spares


class StoreSpec(ApiModel):
    """The rendezvous store's own pod: a few hundred MB of memory and no GPU, so it can live
    on a CPU node away from the GPU workers (losing it costs one re-rendezvous; a crash of
    it with no progress since its last loss counts under failurePolicy.maxRestarts)."""

    image: str | None = Field(
        default=None,
        max_length=1024,
        description="Image of the store pod: it runs python -m torchkube.elastic.store, so "
        "it needs torch and torchkube (a CPU-only build of the trainer image is a fraction of "
        "the CUDA one; a plain torch image crash-loops). Unset: the job's image.",
    )
    resources: FreeForm = Field(
        default_factory=lambda: {"requests": {"cpu": "100m", "memory": "256Mi"}},
        description="core/v1 ResourceRequirements of the store container.",
    )
    node_selector: dict[str, str] | None = Field(
        default=None,
        max_length=64,
        description="Node labels the store needs. Unset: any node (the store never takes the "
        "workers' scheduling.nodeSelector or affinity, which may ask for GPU nodes).",
    )
    affinity: FreeForm | None = Field(
        default=None, description="core/v1 Affinity of the store pod. Unset: none."
    )
    tolerations: list[FreeForm] | None = Field(
        default=None,
        max_length=64,
        description="Tolerations of the store pod. Unset: the workers' scheduling.tolerations.",
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        description="PriorityClass of the store pod. Unset: the workers' one.",
    )


class RendezvousSpec(ApiModel):
    """torchrun's c10d rendezvous. Defaults are tuned for recovery in seconds, not minutes."""

    port: int = Field(default=29400, ge=1024, le=65535, description="Rendezvous store port.")
    join_timeout_seconds: int = Field(
        default=600,
        ge=1,
        le=86400,
        description="How long a rendezvous round may take before the agents give up.",
    )
    last_call_timeout_seconds: int = Field(
        default=5,
        ge=0,
        le=3600,
        description="After min workers joined a job's first round, or a growing one, how long "
        "to wait for more before starting. A round re-formed because a worker is gone starts "
        "as soon as every other worker of the last round is back in it or gone too.",
    )
    close_timeout_seconds: int = Field(
        default=10, ge=1, le=3600, description="Time to close a rendezvous round on shutdown."
    )
    keep_alive_interval_seconds: int = Field(
        default=2,
        ge=1,
        le=600,
        description="torch's keep-alive period: an agent is dropped after three missed "
        "keep-alives at the latest; a dead one sooner, once its beats in the store stop "
        "(0.5 s up to 102 workers, longer for larger jobs).",
    )
    store: StoreSpec = Field(
        default_factory=StoreSpec,
        description="Image, resources and placement of the rendezvous store pod; with "
        "failurePolicy.recovery live the Lighthouse's pod takes its resources and placement "
        "too (its image is the job's).",
    )


CheckpointMode = Literal["async", "sync"]
"""How a checkpoint is saved: see ``CheckpointSpec.mode``."""


class CheckpointSpec(ApiModel):
    """The shared volume checkpoints go to, and how often the trainer writes them.

    Give either an existing claim (``claimName``) or the size of one for the operator to
    create; with neither, the operator creates a 10Gi ReadWriteMany claim.
    """

    model_config = cel(
        (
            "!(has(self.claimName) && has(self.size))",
            "set either checkpoint.claimName (use an existing claim) or checkpoint.size "
            "(create one), not both",
        ),
        (
            "self.intervalSteps > 0 || has(self.intervalSeconds)",
            "checkpoint.intervalSteps is 0 (off), so set checkpoint.intervalSeconds; "
            "otherwise no checkpoint would ever be written",
        ),
    )

    claim_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="An existing PersistentVolumeClaim to mount. It must be ReadWriteMany "
        "when workers can land on different nodes.",
        json_schema_extra=immutable("checkpoint.claimName"),
    )
    size: Quantity | None = Field(
        default=None,
        description="Size of the claim the operator creates (when claimName is not set).",
        json_schema_extra=immutable("checkpoint.size"),
    )
    storage_class_name: str | None = Field(
        default=None,
        max_length=253,
        description="StorageClass of the created claim; unset uses the cluster default.",
    )
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"] = Field(
        default="ReadWriteMany", description="Access mode of the created claim."
    )
    mount_path: str = Field(
        default="/checkpoints",
        min_length=2,
        max_length=1024,
        pattern=r"^/",
        description="Where the volume is mounted in every worker.",
        json_schema_extra=immutable("checkpoint.mountPath"),
    )
    interval_steps: int = Field(
        default=500,
        ge=0,
        description="Checkpoint every this many optimizer steps; 0 turns step-based saves off.",
    )
    interval_seconds: int | None = Field(
        default=None, ge=10, description="Also checkpoint when this much time passed."
    )
    mode: CheckpointMode = Field(
        default="async",
        description="async: training blocks only while the state is copied to host memory; "
        "sync: training waits until the checkpoint is on disk.",
    )
    keep: int = Field(
        default=3,
        ge=2,
        le=1000,
        description="How many valid checkpoints to keep (at least 2: while the newest is being "
        "written, the one before is the only complete one).",
    )
    termination_grace_period_seconds: int = Field(
        default=120,
        ge=5,
        le=3600,
        description="Time a worker gets after SIGTERM (preemption, pod deletion) to write its "
        "emergency checkpoint before it is killed.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.claim_name is not None and self.size is not None:
            raise ValueError(
                "set either checkpoint.claimName (use an existing claim) or checkpoint.size "
                "(create one), not both"
            )
        if self.interval_steps == 0 and self.interval_seconds is None:
            raise ValueError(
                "checkpoint.intervalSteps is 0 (off), so set checkpoint.intervalSeconds; "
                "otherwise no checkpoint would ever be written"
            )
        return self

    @property
    def creates_claim(self) -> bool:
        return self.claim_name is None


class BackoffSpec(ApiModel):
    """Delay before a failed worker is replaced, doubling with each restart."""

    model_config = cel(
        (
            "self.initialSeconds <= self.maxSeconds",
            "failurePolicy.backoff.initialSeconds must not exceed failurePolicy.backoff.maxSeconds",
        ),
    )

    initial_seconds: float = Field(
        default=0, ge=0, le=3600, description="Delay before the first replacement."
    )
    max_seconds: float = Field(
        default=300, ge=0, le=86400, description="Upper bound of the doubling delay."
    )
    reset_after_seconds: float = Field(
        default=600,
        ge=0,
        le=604800,
        description="After this long without a failure the delay starts again from initialSeconds.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.initial_seconds > self.max_seconds:
            raise ValueError(
                f"failurePolicy.backoff.initialSeconds ({self.initial_seconds}) must not exceed "
                f"failurePolicy.backoff.maxSeconds ({self.max_seconds})"
            )
        return self

    def delay(self, restarts: int) -> float:
        """Seconds to wait after the ``restarts + 1``-th failure in a row."""
        if restarts <= 0 or self.initial_seconds == 0:
            return self.initial_seconds
        return float(min(self.max_seconds, self.initial_seconds * 2 ** min(restarts, 30)))


class FailurePolicySpec(ApiModel):
    """Which failures are worth a retry, and how many retries a job gets.

    An exit code is permanent when it is listed in ``permanentExitCodes``, or when
    ``retryableExitCodes`` is non-empty and does not list it; every other failure is retried.
    The defaults treat 2 (usage error), 3 (torchkube's own configuration error), 126 and 127
    (command not executable / not found) as permanent: a restart would fail the same way.
    """

    model_config = cel(
        (
            "self.permanentExitCodes.all(c, !(c in self.retryableExitCodes))",
            "an exit code cannot be both permanent and retryable in failurePolicy",
        ),
    )

    max_restarts: int = Field(
        default=10,
        ge=0,
        le=100000,
        description="Counted failures allowed before the job is marked Failed "
        "(status.restartsCountTowardsMax): restarts of training, and under recovery live "
        "the replica groups lost again without committing a step since their last failure.",
    )
    backoff: BackoffSpec = Field(
        default_factory=BackoffSpec,
        description="Delay between a failure and its replacement.",
    )
    permanent_exit_codes: list[int] = Field(
        default_factory=lambda: [int(code) for code in PERMANENT_EXIT_CODES],
        max_length=256,
        description="Exit codes that fail the job at once, without a restart.",
    )
    retryable_exit_codes: list[int] = Field(
        default_factory=list,
        max_length=256,
        description="If non-empty, only these exit codes are retried.",
    )
    on_oom_killed: Literal["Retry", "Fail"] = Field(
        default="Retry", description="What a worker killed for memory does to the job."
    )
    count_infrastructure_failures: bool = Field(
        default=False,
        description="Whether node loss, preemption and eviction count towards maxRestarts.",
    )
    node_lost_grace_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="How long a node may be NotReady before its workers are replaced "
        "elsewhere (Kubernetes itself waits 300 s).",
    )
    hang_timeout_seconds: int | None = Field(
        default=None,
        ge=0,
        le=86400,
        description="A worker that finishes no training step for this long is hung: its "
        "Python stacks go to its log, its pod ends with reason Hang and training restarts "
        "from the newest checkpoint. Unset: ten times the median step time, at least 60 s "
        "(and below trainer.collectiveTimeoutSeconds); 0 turns hang detection off.",
    )
    replace_stragglers: bool = Field(
        default=False,
        description="Replace the pod of a rank whose compute time per step stays above "
        "stragglerSlowdown × the other ranks' median for stragglerSeconds, and prefer other "
        "nodes for its replacement for an hour. Off: stragglers are only reported "
        "(status.slowestRank).",
    )
    straggler_slowdown: float = Field(
        default=1.5,
        ge=1.1,
        le=100,
        description="How much slower than the other ranks' median a rank must be to count as "
        "a straggler.",
    )
    straggler_seconds: int = Field(
        default=300,
        ge=10,
        le=86400,
        description="How long a rank must stay a straggler before its pod is replaced.",
    )
    recovery: Literal["restart", "live"] = Field(
        default="restart",
        description="What the loss of a worker pod does. restart: every worker stops and "
        "training resumes from the newest checkpoint. live: each pod is one torchft replica "
        "group; the others keep training from the next step at the smaller data-parallel "
        "size (same global batch, more accumulation each) and the replacement copies the "
        "current state from a live peer before it trains (strategy ddp or fsdp inside each "
        "pod, no tensor parallelism; needs torchft in the image).",
        json_schema_extra=immutable("failurePolicy.recovery"),
    )

    @model_validator(mode="after")
    def _disjoint(self) -> Self:
        both = sorted(set(self.permanent_exit_codes) & set(self.retryable_exit_codes))
        if both:
            raise ValueError(
                f"exit codes {both} cannot be both permanent and retryable in failurePolicy"
            )
        return self

    def is_permanent_exit(self, code: int) -> bool:
        if code in self.permanent_exit_codes:
            return True
        return bool(self.retryable_exit_codes) and code not in self.retryable_exit_codes


class RunPolicySpec(ApiModel):
    """Job-level lifecycle: suspension, deadlines and clean-up."""

    suspend: bool = Field(
        default=False,
        description="Suspended jobs have no pods; the checkpoint volume is kept. Resuming "
        "continues from the latest checkpoint. Queues such as Kueue toggle this.",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Fail the job after running this long, counted from when it first ran "
        "(replicas.min workers and its store) since its creation or its last resume "
        "(status.lastStartTime): as with a Kubernetes Job, a suspension stops and resets the "
        "clock.",
    )
    start_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Fail the job if replicas.min workers and the rendezvous store are not "
        "Running this long after its creation (time spent suspended left out): an image that "
        "cannot be pulled, a claim that is never bound or a quota that never frees would "
        "otherwise keep it Pending for ever. Unset: wait, and say why in the PodsBlocked or "
        "PodsUnschedulable condition.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the job this long after it finished. Its pods, Service and the "
        "checkpoint claim the operator created go with it (garbage collection); to keep "
        "checkpoints past the job, mount an existing claim with checkpoint.claimName.",
    )
    clean_pod_policy: Literal["All", "Running", "None"] = Field(
        default="Running",
        description="Which pods to delete when the job finishes: All, only Running ones, or None.",
    )


class PodTemplateOverride(ApiModel):
    """Anything else for the worker pods, merged over what the operator builds."""

    labels: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Extra pod labels."
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Extra pod annotations."
    )
    spec: FreeForm | None = Field(
        default=None,
        description="A partial core/v1 PodSpec merged into the worker pod: extra volumes, "
        "sidecar containers, securityContext, ... Lists are appended; a container named "
        "'trainer' is merged into the worker container.",
    )


class TopologySpec(ApiModel):
    """How close together the workers run: all on nodes that share one value of a node label.

    A data-parallel all-reduce and FSDP's all-gathers cross the slowest link between any two
    of the job's nodes, so a job spread over racks or NVLink domains trains slower than the
    same job packed into one."""

    level: str = Field(
        min_length=1,
        max_length=63,
        pattern=LABEL_KEY,
        description="The node label that names the domain, e.g. topology.kubernetes.io/zone or "
        "a rack or block label: every worker runs on nodes with the same value of it (at most "
        "63 characters, as Kueue takes a topology level).",
    )
    mode: Literal["required", "preferred"] = Field(
        default="required",
        description="required: a worker waits (Pending) rather than run outside the job's "
        "domain; preferred: the scheduler packs the workers when it can and places them "
        "elsewhere when it cannot.",
    )


class SchedulingSpec(ApiModel):
    """Where worker pods may run. Changes apply to pods created from then on."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Node labels a worker needs."
    )
    tolerations: list[FreeForm] = Field(
        default_factory=list, max_length=64, description="core/v1 Tolerations for the workers."
    )
    affinity: FreeForm | None = Field(default=None, description="core/v1 Affinity.")
    topology: TopologySpec | None = Field(
        default=None,
        description="Pack the workers into one topology domain (a rack, a block, an NVLink "
        "domain): through Kueue's topology-aware scheduling when Kueue admits the job on a "
        "flavour with a topology, else through the scheduler's pod affinity among the job's "
        "workers, added to affinity. Replacements land in the domain the job's running "
        "workers occupy. Ranks follow the workers' slots, which Kueue assigns in topology "
        "order.",
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, description="PriorityClass of the workers."
    )
    scheduler_name: str | None = Field(
        default=None,
        max_length=253,
        description="Scheduler for the workers (e.g. volcano); unset uses the default.",
    )
    pending_timeout_seconds: int = Field(
        default=60,
        ge=1,
        le=86400,
        description="After this long unschedulable, a worker is reported in the "
        "PodsUnschedulable condition (the job keeps waiting).",
    )
    pod_template: PodTemplateOverride = Field(
        default_factory=PodTemplateOverride,
        description="Labels, annotations and pod spec fields merged into every worker.",
    )


class MetricsSpec(ApiModel):
    """Where each worker serves its Prometheus metrics."""

    port: int = Field(
        default=9400,
        ge=1024,
        le=65535,
        description="Trainer metrics port (0 is not allowed; use enabled: false).",
    )
    enabled: bool = Field(default=True, description="Serve trainer metrics.")


class TrainingJobSpec(ApiModel):
    """What to train, on how many workers, and how to survive failures."""

    model_config = cel(
        (
            "self.rendezvous.port != self.metrics.port",
            "rendezvous.port and metrics.port must differ",
        ),
        (
            "!has(self.data) || !has(self.trainer.dataPath)",
            DATA_OR_PATH,
        ),
        (
            "!has(self.data) || self.data.valFraction > 0.0 || self.trainer.evalIntervalSteps == 0",
            DATA_EVAL,
        ),
        (
            "self.trainer.parallelism.tensor == 1 || (type(self.nprocPerNode) == int ? "
            "self.nprocPerNode % self.trainer.parallelism.tensor == 0 : "
            "self.resources.gpus > 0)",
            "trainer.parallelism.tensor must divide nprocPerNode (processes per pod; with "
            "nprocPerNode auto or gpu, resources.gpus): a tensor group never spans pods",
        ),
        (
            "self.trainer.parallelism.tensor == 1 || self.resources.gpus == 0 || "
            "self.resources.gpus % self.trainer.parallelism.tensor == 0",
            "trainer.parallelism.tensor must divide resources.gpus (the GPUs per pod)",
        ),
        (
            "self.failurePolicy.recovery != 'live' || (self.trainer.strategy in ['ddp', 'fsdp'] && "
            "self.trainer.parallelism.tensor == 1 && self.rendezvous.port < 65535)",
            LIVE_SUPPORTS,
        ),
        ("has(self.managedBy) == has(oldSelf.managedBy)", MANAGED_BY_FIXED),
        (
            "!has(self.trainer.hsdpShardSize) || self.trainer.strategy != 'hsdp' || "
            "(type(self.nprocPerNode) != int && "
            "(self.resources.gpus == 0 || self.nprocPerNode == 'cpu')) || "
            "((type(self.nprocPerNode) == int ? self.nprocPerNode : self.resources.gpus) * "
            "(self.replicas.min == self.replicas.max ? self.replicas.min : 1)) % "
            "(self.trainer.parallelism.tensor * self.trainer.hsdpShardSize) == 0",
            f"{HSDP_RANGE}; it must divide the data-parallel ranks of one pod (processes per "
            "pod over parallelism.tensor) when replicas.min < replicas.max, or of the whole "
            "job at a fixed size",
        ),
    )

    managed_by: (
        Literal["torchkube.io/trainingjob-controller", "kueue.x-k8s.io/multikueue"] | None
    ) = Field(
        default=None,
        description="Who runs the job. Unset or torchkube.io/trainingjob-controller: "
        "torchkube's operator, in this cluster. kueue.x-k8s.io/multikueue: Kueue's "
        "MultiKueue sends it to a worker cluster with quota (the job needs the label "
        "kueue.x-k8s.io/queue-name); this cluster gets its Workload and, from the worker, "
        "its status (docs/queueing.md, MultiKueue). Immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": MANAGED_BY_FIXED}]
        },
    )
    image: str = Field(
        default=DEFAULT_IMAGE,
        min_length=1,
        max_length=1024,
        description="Worker container image (built from torchkube's Dockerfile, or your own "
        "with torchkube installed).",
        json_schema_extra=immutable("image"),
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy of the worker container."
    )
    command: list[str] = Field(
        default_factory=lambda: list(BUILTIN_TRAINER_COMMAND),
        min_length=1,
        max_length=64,
        description="What torchrun launches: a script path, or -m and a module. The default "
        "runs torchkube's built-in trainer.",
        json_schema_extra=immutable("command"),
    )
    args: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Arguments appended to the command.",
        json_schema_extra=immutable("args"),
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=256, description="Extra environment for every worker."
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="GPUs and other resources per worker pod.",
        json_schema_extra=immutable("resources"),
    )
    nproc_per_node: NprocPerNode = Field(
        default="auto",
        description="Processes per worker pod: an integer, or auto (one per GPU, else one), "
        "gpu or cpu as torchrun understands them.",
    )
    replicas: ReplicasSpec = Field(
        default_factory=ReplicasSpec,
        description="Elastic size of the job, in worker pods.",
    )
    rendezvous: RendezvousSpec = Field(
        default_factory=RendezvousSpec,
        description="torchrun c10d rendezvous settings.",
    )
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,
        description="Checkpoint volume and cadence.",
    )
    failure_policy: FailurePolicySpec = Field(
        default_factory=FailurePolicySpec,
        description="Retries, backoff and what counts as permanent.",
    )
    run_policy: RunPolicySpec = Field(
        default_factory=RunPolicySpec,
        description="Suspension, deadlines and clean-up.",
    )
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec,
        description="Node selection, tolerations, priority and pod overrides.",
    )
    metrics: MetricsSpec = Field(
        default_factory=MetricsSpec,
        description="Trainer metrics endpoint.",
    )
    trainer: TrainerSpec = Field(
        default_factory=TrainerSpec,
        description="Settings of the built-in trainer (ignored by a custom command unless "
        "it reads TORCHKUBE_TRAINER_CONFIG).",
        json_schema_extra=immutable_fields("trainer"),
    )
    data: DataSpec | None = Field(
        default=None,
        description="Text the job prepares onto its checkpoint volume before the workers "
        "start (torchkube prepare-data, once per job); the trainer then reads it. Unset: "
        "trainer.dataPath, or the bundled toy corpus.",
        json_schema_extra=immutable("data"),
    )

    @model_validator(mode="after")
    def _ports(self) -> Self:
        if self.rendezvous.port == self.metrics.port:
            raise ValueError(
                f"rendezvous.port and metrics.port must differ (both are {self.metrics.port})"
            )
        if self.data is not None and self.trainer.data_path is not None:
            raise ValueError(DATA_OR_PATH)
        if (
            self.data is not None
            and not self.data.val_fraction
            and self.trainer.eval_interval_steps
        ):
            raise ValueError(DATA_EVAL)
        return self

    def trainer_config(self, mount_path: str | None = None) -> TrainerSpec:
        """``spec.trainer`` as the workers get it: with ``spec.data``, pointed at the files the
        prepare step writes under ``mount_path`` (default: ``checkpoint.mountPath``)."""
        if self.data is None:
            return self.trainer
        folder = self.data.folder(mount_path or self.checkpoint.mount_path)
        val = f"{folder}/{VAL_FILE}" if self.data.val_fraction else None
        return self.trainer.model_copy(
            update={"data_path": f"{folder}/{TRAIN_FILE}", "eval_data_path": val}
        )

    @model_validator(mode="after")
    def _hsdp_groups_fit_every_size(self) -> Self:
        """HSDP splits the data-parallel ranks into groups of ``hsdpShardSize``; a world size
        in the elastic range that it does not divide would fail every start there (exit 3).
        (Two neighbouring sizes both divide only if one pod's share does, hence the CEL
        rule's simpler form.) Unchecked where torchrun alone knows the processes per pod."""
        shard, trainer = self.trainer.hsdp_shard_size, self.trainer
        procs = self.processes_per_pod()
        if shard is None or trainer.strategy != "hsdp" or procs is None:
            return self
        tensor = trainer.parallelism.tensor
        replicas = self.replicas
        failing = [
            pods
            for pods in range(replicas.min, replicas.max + 1)
            if (pods * procs) % (tensor * shard)
        ]
        if failing:
            shown = failing[:6]
            more = f" and {len(failing) - 6} more" if len(failing) > 6 else ""
            per_pod = f"{procs} processes per pod" + (f", tensor {tensor}" if tensor > 1 else "")
            fixed = replicas.min == replicas.max
            divide = replicas.min * procs // tensor if fixed else procs // tensor
            raise ValueError(
                f"{HSDP_RANGE}: hsdpShardSize {shard} with {per_pod} fails at world size "
                f"{', '.join(str(p * procs) for p in shown)}{more} (replicas "
                f"{', '.join(map(str, shown))}): choose a divisor of {divide}, or leave it "
                "unset (one pod's data-parallel ranks)"
            )
        return self

    def processes_per_pod(self) -> int | None:
        """torchrun's processes per pod where the spec fixes them: an integer
        ``nprocPerNode``, or auto/gpu with GPUs per pod; None where torchrun decides."""
        if isinstance(self.nproc_per_node, int):
            return self.nproc_per_node
        if self.nproc_per_node in ("auto", "gpu") and self.resources.gpus:
            return self.resources.gpus
        return None

    @model_validator(mode="after")
    def _live_recovery_is_supported(self) -> Self:
        """Live recovery makes each pod one torchft replica group and the data-parallel
        all-reduce across pods fault tolerant; what that does not cover yet is refused here
        rather than quietly recovered by restart."""
        if self.failure_policy.recovery != "live":
            return self
        trainer = self.trainer
        unsupported = []
        if trainer.strategy not in ("ddp", "fsdp"):
            unsupported.append(f"strategy {trainer.strategy}")
        if trainer.parallelism.tensor != 1:
            unsupported.append(f"parallelism.tensor {trainer.parallelism.tensor}")
        if self.rendezvous.port == 65535:
            unsupported.append("rendezvous.port 65535")
        if unsupported:
            raise ValueError(f"{LIVE_SUPPORTS}; this job has {', '.join(unsupported)}")
        return self

    @model_validator(mode="after")
    def _tensor_groups_fit_a_pod(self) -> Self:
        """Tensor parallelism talks at every layer, so a tensor group stays inside one pod (on
        its NVLink): its size divides the pod's processes and GPUs, and the elastic unit, the
        pod, only ever changes the data dimension."""
        tensor, gpus = self.trainer.parallelism.tensor, self.resources.gpus
        if tensor == 1:
            return self
        if isinstance(self.nproc_per_node, int):
            if self.nproc_per_node % tensor:
                raise ValueError(
                    f"trainer.parallelism.tensor ({tensor}) must divide nprocPerNode "
                    f"({self.nproc_per_node}): a tensor group never spans pods"
                )
        elif gpus == 0:
            raise ValueError(
                f"trainer.parallelism.tensor ({tensor}) must divide nprocPerNode (processes per "
                f"pod; with nprocPerNode {self.nproc_per_node}, resources.gpus): set an integer "
                "nprocPerNode or GPUs per pod"
            )
        if gpus and gpus % tensor:
            raise ValueError(
                f"trainer.parallelism.tensor ({tensor}) must divide resources.gpus ({gpus}), "
                "the GPUs per pod"
            )
        return self
