"""The contract between the operator (and ``torchkube run``) and what runs in a worker pod.

Every name that crosses the pod boundary lives here, typed, and both sides import it: the
environment the operator sets and the trainer reads, the exit codes the launcher and the
trainer end with and the failure policy keys on, the files on the checkpoint volume, the
termination-message marker, and the progress report. No torch here: the operator image
imports it too. The values a job's workers get (their environment, their launcher's command
line) are computed from the spec in :mod:`torchkube.api.worker_launch`.
"""

import re
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class Env(StrEnum):
    """Environment variables of a worker container (set by the operator's pod builder and by
    ``torchkube run``; read by the launcher and the trainer). The user's ``spec.env`` comes
    after them and may override any."""

    JOB_NAME = "TORCHKUBE_JOB_NAME"
    JOB_NAMESPACE = "TORCHKUBE_JOB_NAMESPACE"
    REPLICA_INDEX = "TORCHKUBE_REPLICA_INDEX"
    """The worker's slot (0 .. replicas-1), stable across replacements."""
    TRAINER_CONFIG = "TORCHKUBE_TRAINER_CONFIG"
    """``spec.trainer`` as JSON (camelCase)."""
    CHECKPOINT_DIR = "TORCHKUBE_CHECKPOINT_DIR"
    CHECKPOINT_INTERVAL_STEPS = "TORCHKUBE_CHECKPOINT_INTERVAL_STEPS"
    CHECKPOINT_INTERVAL_SECONDS = "TORCHKUBE_CHECKPOINT_INTERVAL_SECONDS"
    CHECKPOINT_KEEP = "TORCHKUBE_CHECKPOINT_KEEP"
    CHECKPOINT_MODE = "TORCHKUBE_CHECKPOINT_MODE"
    """``spec.checkpoint``, the one home of every checkpoint setting, travels as these."""
    METRICS_PORT = "TORCHKUBE_METRICS_PORT"
    """Where local rank 0 serves ``/metrics`` and ``/progress``; 0: nowhere."""
    TERMINATION_LOG = "TORCHKUBE_TERMINATION_LOG"
    """Where the termination message goes (default :data:`TERMINATION_LOG`)."""
    PERMANENT_ERROR_FILE = "TORCHKUBE_PERMANENT_ERROR_FILE"
    """Set by the launcher: a worker that writes a line here stops the pod with
    :attr:`ExitCode.CONFIG_ERROR` instead of being restarted by torchrun."""
    PEAK_FLOPS = "TORCHKUBE_PEAK_FLOPS"
    """The user's: the device's peak FLOP/s for MFU, where the built-in table has none."""
    POD_IP = "POD_IP"
    """The worker's pod IP (the downward API): torchrun's ``--local-addr``, and where a live
    recovery group is reached by the others."""
    POD_NAME = "POD_NAME"
    NODE_NAME = "NODE_NAME"
    """The worker's pod and node (the downward API; ``torchkube run`` names its workers), so
    the trainer can say where its slowest rank runs."""
    HANG_TIMEOUT_SECONDS = "TORCHKUBE_HANG_TIMEOUT_SECONDS"
    """``failurePolicy.hangTimeoutSeconds`` for the launcher's hang watchdog: a number of
    seconds, ``0`` (off), or empty (derived from the step time, :mod:`torchkube.api.hang`)."""
    WARM_WORKERS = "TORCHKUBE_WARM_WORKERS"
    """``0``: the launcher starts workers as torchrun does, fresh interpreters, instead of
    forking them from a server that imported torch once (``torchkube.elastic.warm``)."""
    WARM_FILE = "TORCHKUBE_WARM_FILE"
    """Set by the operator in a worker pod: the launcher creates this file once a worker can
    start warm (its server imported torch and the trainer; at once with warm workers off).
    The container's startup probe waits for it, so the container is ``started`` only then and
    ``status.spares`` counts a spare only when taking a place would cost it no import."""
    RENDEZVOUS_ENDPOINT = "TORCHKUBE_RENDEZVOUS_ENDPOINT"
    """Set by the launcher for its workers: the rendezvous store (``host:port``), where every
    launcher posts the in-place restarts of its workers and every trainer reads them for its
    progress report (:class:`InPlaceRestart`, ``torchkube.elastic.restarts``)."""
    RESTART_BOARD = "TORCHKUBE_RESTART_BOARD"
    """The job's id, under which every launcher posts its workers' in-place restarts and every
    trainer reads them: one board per job, also where each pod is a rendezvous of its own
    (recovery live)."""
    RECOVERY = "TORCHKUBE_RECOVERY"
    """``failurePolicy.recovery``: ``restart`` (default) or ``live``, where each pod is one
    torchft replica group and its all-reduce across pods goes through torchft's Manager."""
    REPLICA_GROUPS = "TORCHKUBE_REPLICA_GROUPS"
    """Live recovery: how many replica groups train (``replicas.target``). A group that
    starts while that many train — a hot spare, or a replacement the spare already stood in
    for — stands by until one is lost (``torchkube.trainer.standby``)."""
    LIGHTHOUSE = "TORCHKUBE_LIGHTHOUSE"
    """Live recovery: the torchft Lighthouse that forms each step's quorum of replica groups
    (``http://host:port``)."""
    CHAOS_HOLD_AT_STEPS = "TORCHKUBE_CHAOS_HOLD_AT_STEPS"
    """Set by ``torchkube run --chaos-at-step`` on the worker it is going to SIGKILL, never by
    the operator: the steps (:func:`chaos_hold_steps_value`) after which each of the worker's
    training processes stops itself (SIGSTOP) until the kill comes. The others wait for it in
    their next collective, so the kill lands at the step asked for however late the runner's
    poll sees it on a busy machine."""
    CHAOS_COMPUTE_SECONDS = "TORCHKUBE_CHAOS_COMPUTE_SECONDS"
    """Set by ``torchkube run``'s benchmarks, never by the operator: a training step lasts at
    least this many seconds per full micro-batch of the sequences it computes (14 sequences
    of micro-batches of 4: 3.5 times this), its processes waiting out the rest after them (a
    step standing for an accelerator's on a CPU)."""
    CHAOS_ARM_DIR = "TORCHKUBE_CHAOS_ARM_DIR"
    """Set by ``torchkube run`` when its chaos kills workers in a phase
    (:class:`ChaosPhase`), never by the operator: the folder where the runner arms a phase
    (``arm-<phase>``) and where the one process that claims the arming says it holds
    (``held-<phase>``, its pid) before it stops itself, so that the kill lands inside that
    phase whatever the load."""
    HEARTBEAT_DIR = "TORCHKUBE_HEARTBEAT_DIR"
    """Set by the launcher: each worker process writes its heartbeat (its last finished step)
    and, when the launcher asks, the Python stacks of all its threads here
    (:mod:`torchkube.elastic.heartbeat`). Unset: no heartbeat, no hang detection."""


class ChaosPhase(StrEnum):
    """Where a ``torchkube run`` chaos kill may be aimed inside a worker (live recovery)."""

    STARTING = "starting"
    """A group started (torch imported, its model built), not yet in a quorum."""
    SERVING_STATE = "serving-state"
    """A live group handing its state to a joining group (the joiner waits for it)."""
    RECEIVING_STATE = "receiving-state"
    """A joining group that has received a peer's state and not yet taken it."""
    REDUCING = "reducing"
    """A training group with its step's gradients computed, not yet in the cross-group
    reduction: its peers' reduction fails, mid-step."""
    COMMITTING_CHECKPOINT = "committing-checkpoint"
    """The writer group's rank 0 with a checkpoint written and marked, not yet renamed into
    place."""

    @property
    def held_in_training(self) -> bool:
        """Whether the process held here belongs to a training group: killing it takes one
        from the quorum, so aimed at the only one, it starts the job over from a checkpoint."""
        return self not in (ChaosPhase.STARTING, ChaosPhase.RECEIVING_STATE)


def chaos_hold_steps_value(steps: list[int]) -> str:
    """:attr:`Env.CHAOS_HOLD_AT_STEPS` for ``steps``: comma-separated."""
    return ",".join(str(step) for step in steps)


def chaos_hold_steps(value: str) -> frozenset[int]:
    """The steps of an :attr:`Env.CHAOS_HOLD_AT_STEPS` value (empty or unset: none)."""
    return frozenset(int(part) for part in value.split(",") if part.strip())


class ExitCode(IntEnum):
    """What a worker container's exit code means to the failure policy."""

    OK = 0
    """With :data:`TRAINING_FINISHED` in the termination message: training is done."""
    FAILURE = 1
    """Anything unexpected: worth a restart."""
    USAGE = 2
    CONFIG_ERROR = 3
    """The spec or its inputs must change: retrying cannot help."""
    FENCED = 4
    """A newer rendezvous round owns the checkpoint folder; this process was stale."""
    RENDEZVOUS_LOST = 75
    """The rendezvous store stayed unreachable for a whole join timeout (EX_TEMPFAIL)."""
    JOIN_TIMEOUT = 76
    """The store answered, but fewer than ``--nnodes`` min agents came within the join
    timeout (slow image pulls, a node still being provisioned, quota): not this pod's fault.
    The agent leaves the rendezvous open for the others and the operator refills its slot,
    free (:data:`JOIN_TIMED_OUT`)."""
    HUNG = 124
    """A worker finished no step for ``failurePolicy.hangTimeoutSeconds``; the launcher dumped
    its stacks and stopped it (124, as ``timeout(1)`` ends)."""
    NOT_EXECUTABLE = 126
    NOT_FOUND = 127
    SIGTERM = 143
    """Stopped by SIGTERM (a deletion) after the emergency checkpoint: 128 + 15."""


PERMANENT_EXIT_CODES = (
    ExitCode.USAGE,
    ExitCode.CONFIG_ERROR,
    ExitCode.NOT_EXECUTABLE,
    ExitCode.NOT_FOUND,
)
"""The default ``failurePolicy.permanentExitCodes``: a restart would fail the same way."""

TERMINATION_LOG = Path("/dev/termination-log")
"""Kubernetes' default ``terminationMessagePath``."""

TRAINING_FINISHED = "torchkube: training finished"
"""What the trainer writes to its termination message when every step is done. The operator
takes a worker that exited 0 as the end of training only with this line (for the built-in
trainer): torchrun agents can also exit 0 when their rendezvous closes early."""

_FINISHED_AT = re.compile(re.escape(TRAINING_FINISHED) + r" at step (\d+)")


def training_finished_message(step: int) -> str:
    """The trainer's termination message once every step is done: the operator's success
    condition names this step, which a progress poll seconds earlier may not have seen."""
    return f"{TRAINING_FINISHED} at step {step}"


def finished_step(message: str) -> int | None:
    """The step of :func:`training_finished_message` in a termination message; None for any
    other message (an older trainer's bare line included)."""
    found = _FINISHED_AT.search(message)
    return int(found.group(1)) if found else None


COMMITTED_STEP = "torchkube: committed step"
"""The last line of a worker's termination message once its workers committed a step: the
first step they committed since the pod's last failure (its start, or the last in-place
restart of its workers). The worker's heartbeat writes it at that step, not at the end, so it
is there whatever ends the pod (a SIGKILL, the OOM killer), and the launcher keeps it below its
own report; an in-place restart takes it into its :class:`InPlaceRestart` record. A failed
pod's message without it says that the pod committed no step since its last failure: under
``failurePolicy.recovery: live`` a replica group lost again so spends ``maxRestarts``
(``torchkube.elastic.termination``, ``policy/accounting.py``)."""

_COMMITTED_LINE = re.compile(r"^" + re.escape(COMMITTED_STEP) + r" (\d+)[ \t]*(?:\n|$)", re.M)


def committed_step_line(step: int) -> str:
    """The :data:`COMMITTED_STEP` line for ``step``."""
    return f"{COMMITTED_STEP} {step}"


def committed_step(message: str) -> int | None:
    """The step of a :data:`COMMITTED_STEP` line in a termination message (None: none)."""
    found = _COMMITTED_LINE.search(message)
    return int(found.group(1)) if found else None


def without_committed_step(message: str) -> str:
    """A termination message less its :data:`COMMITTED_STEP` line: the pod's own words."""
    return _COMMITTED_LINE.sub("", message)


STANDBY_RELEASED = "torchkube: standby released"
"""What a hot spare's launcher writes to its termination message when it exits 0 without
ever training: the job's rendezvous closed (training ended) while it stood by. Neither the
end of training nor a failure."""

JOIN_TIMED_OUT = "torchkube: join timeout:"
"""The start of the termination message of an agent that ended with
:attr:`ExitCode.JOIN_TIMEOUT`: how long it waited and how many agents came."""

HANG_REPORT = "torchkube: hang:"
"""The start of a hung worker's termination message: which ranks stopped stepping, for how
long, and the innermost frames of their main threads."""

PROGRESS_FILE = "progress.json"
"""Rank 0's :class:`ProgressReport`, in the checkpoint folder (also served as ``/progress``)."""


class RankTiming(BaseModel):
    """The slowest rank of the last log window, as rank 0 reports it: its compute time per
    step (the step less the time it waited in collectives for the other ranks) against the
    median of the other ranks'. In a synchronous job every rank's step takes as long as the
    slowest one's; only the compute part tells them apart."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    rank: int = Field(ge=0, description="Global rank of the slowest process.")
    pod: str | None = Field(default=None, description="Its pod (``POD_NAME``).")
    node: str | None = Field(default=None, description="Its node (``NODE_NAME``).")
    compute_seconds: float = Field(ge=0, description="Its compute time per step.")
    median_seconds: float = Field(ge=0, description="The other ranks' median compute time.")
    slowdown: float = Field(ge=0, description="compute_seconds / median_seconds.")


class InPlaceRestart(BaseModel):
    """One restart of a pod's workers by its launcher (torchrun's ``--max-restarts``): a
    worker failed and the pod did not. Every launcher posts its own; the trainer's progress
    report carries the job's, and the operator counts each like a pod failure."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    pod: str = Field(description="The pod whose workers restarted (``POD_NAME``).")
    node: str | None = Field(default=None, description="Its node (``NODE_NAME``).")
    restart: int = Field(ge=1, description="Which restart of this pod's workers: 1, 2, ...")
    exit_code: int | None = Field(default=None, description="The first failed worker's code.")
    message: str = Field(default="", description="Its error, the last line or so.")
    time: str = Field(description="When the launcher restarted the workers (RFC 3339).")
    committed_step: int | None = Field(
        default=None,
        ge=0,
        description="The first step the restarted workers had committed since the pod's last "
        "failure (:data:`COMMITTED_STEP`); None: they committed none.",
    )


LIVE_MIN_REPLICA_GROUPS = 1
"""Live recovery: a quorum of this many replica groups (pods) trains, so the survivors of a
loss train on, and the first group to start trains before the others join it. The trainer
gives it to torchft's Manager; the operator calls such a job Running while that many run."""


LIVE_COLLECTIVE_SECONDS = 30
"""Live recovery: how long an all-reduce, a commit vote or a state transfer may take before a
group gives up on the step — a SIGKILLed peer breaks gloo's connections at once, a lost node
or a hung peer only after this. The Lighthouse waits twice this for a group that heartbeats
but has not asked for the next quorum (``torchkube.elastic.lighthouse``): such a group may be
held in a collective with a peer that is gone, and a quorum formed without it — of groups
that are all behind, say a replacement and a joiner whose copy broke off — would start the
job over from its checkpoint beside the group that is ahead."""


class LiveStepTime(BaseModel):
    """Where a replica group's steps went, summed over its committed steps after the first
    (the first pays for start-up: the first quorum waits for the other groups to start).

    torchft's own per-step cost is the quorum and the commit vote: a restart-mode step has
    neither. The gradients' all-reduce is counted apart, as DDP does one too (overlapped with
    the backward pass). Measured inside the loop, the cost is read off one run, not inferred
    from the live loop against the restart loop, which differ in more than torchft."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    steps: int = Field(default=0, ge=0, description="Committed steps summed over.")
    step_seconds: float = Field(
        default=0.0, ge=0, description="Their whole time, quorum to optimizer update."
    )
    quorum_seconds: float = Field(
        default=0.0,
        ge=0,
        description="In torchft's quorum at each step's start: a round trip to the Lighthouse, "
        "which answers once every group alive has asked (so waiting for a slower group too).",
    )
    allreduce_seconds: float = Field(
        default=0.0, ge=0, description="Averaging the gradients through torchft's Manager."
    )
    commit_seconds: float = Field(default=0.0, ge=0, description="In the commit vote.")

    @property
    def torchft_seconds(self) -> float:
        """torchft's own part: the quorum and the commit vote."""
        return self.quorum_seconds + self.commit_seconds

    @property
    def torchft_share(self) -> float | None:
        """torchft's own part of the steps' time (None: no step timed yet)."""
        return self.torchft_seconds / self.step_seconds if self.step_seconds > 0 else None

    def plus(self, step: float, quorum: float, allreduce: float, commit: float) -> "LiveStepTime":
        """These sums with one more committed step (rounded to the microsecond, as written)."""
        return LiveStepTime(
            steps=self.steps + 1,
            step_seconds=round(self.step_seconds + step, 6),
            quorum_seconds=round(self.quorum_seconds + quorum, 6),
            allreduce_seconds=round(self.allreduce_seconds + allreduce, 6),
            commit_seconds=round(self.commit_seconds + commit, 6),
        )


class LiveProgress(BaseModel):
    """Live recovery (``failurePolicy.recovery: live``) as the writing replica group sees it:
    how many groups shared the last step and how the constant global batch is split."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    replica_groups: int = Field(ge=0, description="Replica groups in the last step's quorum.")
    grad_accum_steps: int = Field(
        ge=1, description="Micro-steps each group accumulates so the global batch stays."
    )
    quorum_changes: int = Field(
        default=0, ge=0, description="Times the quorum changed size since this group started."
    )
    discarded_steps: int = Field(
        default=0,
        ge=0,
        description="Commit votes this group lost (a peer failed mid-step); the step counter "
        "stays, and the step's reduction is done again in the next quorum (after "
        "several lost votes, the step is computed again).",
    )
    steps_finished_among_survivors: int = Field(
        default=0,
        ge=0,
        description="Steps committed after a lost vote by reducing the gradients already "
        "computed again among the next quorum's groups, instead of computing the step again.",
    )
    joined_from_peer_step: int | None = Field(
        default=None, description="The step whose live state this group copied from a peer."
    )
    longest_step_seconds: float | None = Field(
        default=None, description="This group's longest step after its first, quorum included."
    )
    step_time: LiveStepTime = Field(
        default_factory=LiveStepTime,
        description="This group's steps after its first: torchft's quorum and commit vote, "
        "and the gradients' all-reduce, against the whole step.",
    )
    training_slots: list[int] = Field(
        default_factory=list,
        description="The slots (replica indexes) of the groups in the last step's quorum: a "
        "running worker pod whose slot is not among them stands by (a hot spare) and does not "
        "train.",
    )
    standing_by: bool = Field(
        default=False,
        description="This pod's group stands by outside the quorum: its report says nothing "
        "of training (the operator asks another pod).",
    )


class ProgressReport(BaseModel):
    """What the trainer's rank 0 reports, and the operator and ``torchkube run`` read.

    Unknown keys are ignored, so an older operator can read a newer trainer's report."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    step: int = Field(default=0, ge=0, description="Optimizer steps done.")
    total_steps: int | None = Field(default=None, description="Steps the run will take.")
    loss: float | None = Field(default=None, description="Mean training loss, last log step.")
    tokens_per_second: float | None = Field(default=None, description="Throughput, all ranks.")
    world_size: int | None = Field(default=None, description="Processes in this round.")
    last_checkpoint_step: int | None = Field(default=None, description="Newest checkpoint.")
    last_checkpoint_time: str | None = Field(default=None, description="When it was written.")
    resumes: int = Field(
        default=0,
        validation_alias=AliasChoices("resumes", "restarts"),
        description="Times training resumed from a checkpoint (older trainers: 'restarts').",
    )
    checkpoint_blocking_seconds: float | None = Field(
        default=None, description="Seconds this process was blocked by checkpoint saves."
    )
    data_wait_seconds: float | None = Field(
        default=None, description="Seconds this process waited for input."
    )
    slowest_rank: RankTiming | None = Field(
        default=None,
        description="The slowest rank of the last log window (None: one rank, or the split "
        "of compute and wait is not measured for the strategy).",
    )
    in_place_restarts: list[InPlaceRestart] = Field(
        default_factory=list,
        description="The job's recent in-place restarts of workers, every pod's (read from "
        "the rendezvous store; empty when it is away).",
    )
    live: LiveProgress | None = Field(
        default=None, description="Live recovery's state (None: recovery restart)."
    )
    finished: bool = Field(default=False, description="Every step is done.")
    error: str | None = Field(default=None, description="Why the trainer cannot run.")
    permanent: bool = Field(default=False, description="The error is one retrying cannot fix.")
    exit_code: int | None = Field(default=None, description="The exit code the error ends with.")
    updated: str | None = Field(default=None, description="When the report was written.")

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def read_progress(folder: Path) -> ProgressReport | None:
    """The report rank 0 keeps in ``folder`` (a job's checkpoint folder); None before the
    first one, or while it cannot be read."""
    try:
        return ProgressReport.model_validate_json((folder / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None


PREPARED_MARKER = "PREPARED.json"
"""In the data folder of ``spec.data``: the :class:`PrepareReport` of the prepare step that
wrote it. A later step for the same source and tokenizer finds it and does nothing."""


class PrepareReport(BaseModel):
    """What ``torchkube prepare-data --report FILE`` writes when it succeeds: the prepare pod's
    termination message (read by the operator into ``status.data``) and the marker file.

    A failed step writes one line of plain text there instead and exits
    :attr:`ExitCode.CONFIG_ERROR` when retrying cannot help (a missing path, an HTTP 404, GPT-2
    asked for without its vocabulary), 1 otherwise."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    source: str = Field(description="The source, in a few words (DataSource.describe).")
    tokenizer: str = Field(
        description="gpt2, bytes, or a Hugging Face tokenizer folder's absolute path."
    )
    tokenizer_note: str | None = Field(default=None, description="Why not the one asked for.")
    documents: int = Field(ge=0, description="Documents read.")
    train_tokens: int = Field(ge=0, description="Tokens in train.bin.")
    val_tokens: int = Field(default=0, ge=0, description="Tokens in val.bin.")
    vocab_size: int = Field(ge=1, description="The tokenizer's vocabulary size.")
    reused: bool = Field(default=False, description="Found on the volume; nothing was redone.")

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
