"""Preparation policy: ``spec.data`` is on the checkpoint volume before any worker starts.

The operator runs ``torchkube prepare-data`` in a pod of its own (``<job>-prepare-<attempt>``,
built by :func:`~torchkube.operator.builders.prepare_pod`) once the claim exists, and holds the
workers back until it succeeds. Its termination message is the step's report
(:class:`~torchkube.api.contract.PrepareReport`), copied into ``status.data``; the
``DataReady`` condition says where it stands. The step itself is idempotent (a marker file on
the volume), so a retry, an operator restart or a job re-created on the same claim costs
seconds, not a second download.

A failure with a permanent exit code (a missing path, an HTTP 404, GPT-2 asked for without its
vocabulary) fails the job at once with the step's own message; any other failure is retried
in a new pod, up to :data:`MAX_ATTEMPTS` pods in all. Pod names count the attempts, so an
operator restart never starts a second pod for the same attempt.
"""

from typing import Any

from pydantic import ValidationError

from torchkube.api import labels as lbl
from torchkube.api.contract import PERMANENT_EXIT_CODES, PrepareReport
from torchkube.api.status import DataStatus
from torchkube.operator import builders
from torchkube.operator import conditions as cond
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, STOP, Context, Step

MAX_ATTEMPTS = 3
"""Prepare pods started before a job whose data cannot be prepared fails (a network that
stays down); permanent errors fail it at the first."""
REASON_FAILED = "DataPreparationFailed"


def prepare(ctx: Context) -> Step:
    """CONTINUE when the workers may start: no ``spec.data``, or it is prepared. Otherwise
    plan the prepare pod (when ``ctx.children_ready``: the claim is there), report progress,
    or fail the job, and STOP: nothing else is planned this pass."""
    data = ctx.spec.data
    if data is None or (ctx.status.data is not None and ctx.status.data.phase == "Prepared"):
        return CONTINUE
    pods = sorted(
        (pod for pod in ctx.owned if p.role(pod) == lbl.ROLE_PREPARE),
        key=lambda pod: _attempt(pod),
    )
    source = data.source.describe()
    succeeded = [pod for pod in pods if p.state(pod) == "succeeded"]
    if succeeded:
        return CONTINUE if _prepared(ctx, succeeded[-1], source) else STOP
    failed = [pod for pod in pods if p.state(pod) == "failed"]
    live = [pod for pod in pods if p.state(pod) in ("pending", "running", "deleting")]
    attempts = max((_attempt(pod) for pod in pods), default=0)
    if live:
        _preparing(ctx, source, p.name(live[-1]), attempts)
        return STOP
    if failed:
        last = failed[-1]
        code, message = _failure(last)
        if code in PERMANENT_EXIT_CODES or attempts >= MAX_ATTEMPTS:
            why = "permanent" if code in PERMANENT_EXIT_CODES else f"{attempts} attempts"
            _fail(ctx, source, p.name(last), attempts, f"{message} ({why}; exit code {code})")
            return STOP
    if ctx.children_ready:
        pod = builders.prepare_pod(ctx.job, attempts + 1)
        ctx.plan.create_pods.append(pod)
        _preparing(ctx, source, p.name(pod), attempts + 1)
    return STOP


def _attempt(pod: dict[str, Any]) -> int:
    suffix = p.name(pod).rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else 0


def _failure(pod: dict[str, Any]) -> tuple[int | None, str]:
    """The failed step's exit code and its own words (its termination message)."""
    ended = p.terminated(pod)
    code = ended.get("exitCode")
    message = p.termination_message(pod).strip() or str(
        ended.get("reason") or pod.get("status", {}).get("reason") or "the prepare pod failed"
    )
    return (int(code) if code is not None else None), message


def _preparing(ctx: Context, source: str, pod: str, attempts: int) -> None:
    message = f"preparing {source} in pod {pod} (attempt {attempts} of {MAX_ATTEMPTS})"
    if not ctx.status.data or ctx.status.data.pod != pod:
        ctx.event("Normal", "PreparingData", message)
    ctx.status.data = DataStatus(
        phase="Preparing", source=source, pod=pod, attempts=attempts, message=message
    )
    ctx.set(cond.DATA_READY, False, "Preparing", message)


def _prepared(ctx: Context, pod: dict[str, Any], source: str) -> bool:
    try:
        report = PrepareReport.model_validate_json(p.termination_message(pod))
    except ValidationError:
        _fail(
            ctx,
            source,
            p.name(pod),
            _attempt(pod),
            "the prepare pod exited 0 without a report in its termination message: is "
            "spec.image a torchkube trainer image?",
        )
        return False
    note = f" ({report.tokenizer_note})" if report.tokenizer_note else ""
    message = (
        f"{report.train_tokens:,} training and {report.val_tokens:,} validation tokens from "
        f"{report.documents:,} documents of {report.source}, tokenizer {report.tokenizer}{note}"
        + (", found on the volume" if report.reused else "")
    )
    ctx.status.data = DataStatus(
        phase="Prepared",
        source=report.source,
        pod=p.name(pod),
        attempts=_attempt(pod),
        tokenizer=report.tokenizer,
        tokenizer_note=report.tokenizer_note,
        documents=report.documents,
        train_tokens=report.train_tokens,
        val_tokens=report.val_tokens,
        vocab_size=report.vocab_size,
        message=message,
    )
    ctx.set(cond.DATA_READY, True, "Prepared", message)
    ctx.event("Normal", "DataPrepared", message)
    return True


def _fail(ctx: Context, source: str, pod: str, attempts: int, message: str) -> None:
    text = f"could not prepare {source}: {message}"
    ctx.status.data = DataStatus(
        phase="Failed", source=source, pod=pod, attempts=attempts, message=text
    )
    ctx.set(cond.DATA_READY, False, REASON_FAILED, text)
    ctx.finish("Failed", REASON_FAILED, text)
