"""``torchkube run JOB.yaml``: the TrainingJob on this machine, optionally with chaos."""

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import yaml

if TYPE_CHECKING:
    from torchkube.api import TrainingJob


@click.command("run")
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Checkpoints and logs (stands in for the PVC). Default: ./torchkube-runs/<job name>.",
)
@click.option("--fresh", is_flag=True, help="Delete earlier checkpoints first instead of resuming.")
@click.option("--workers", type=int, help="Local workers (pods). Default: the job's replicas.")
@click.option(
    "--nproc", default="1", show_default=True, help="Processes per worker (torchrun's value)."
)
@click.option(
    "--chaos-at-step",
    "chaos_steps",
    type=int,
    multiple=True,
    help="SIGKILL a worker (its whole tree, as a node loss) at this step (repeatable): it holds "
    "still once the step is done until the kill comes, so the kill lands there whatever the "
    "load.",
)
@click.option("--chaos-every", type=float, help="SIGKILL a worker every this many seconds.")
@click.option("--chaos-worker", type=int, help="Which worker chaos kills (default: rotate).")
@click.option(
    "--chaos-store-at-step",
    "chaos_store_steps",
    type=int,
    multiple=True,
    help="SIGKILL the rendezvous store when training reaches this step (repeatable); it is "
    "restarted in place, as its pod's container would be.",
)
@click.option(
    "--chaos-lighthouse-at-step",
    "chaos_lighthouse_steps",
    type=int,
    multiple=True,
    help="recovery live: SIGKILL the torchft Lighthouse when training reaches this step "
    "(repeatable); it is started again after --chaos-replace-after seconds, as its pod would be "
    "replaced.",
)
@click.option(
    "--chaos-stop-at-step",
    "chaos_stop_steps",
    type=int,
    multiple=True,
    help="SIGSTOP a worker's training process when training reaches this step (repeatable): "
    "a hang, which the launcher's watchdog finds after failurePolicy.hangTimeoutSeconds.",
)
@click.option(
    "--chaos-crash-at-step",
    "chaos_crash_steps",
    type=int,
    multiple=True,
    help="SIGKILL a worker's training process when training reaches this step (repeatable): "
    "a crash its launcher restarts in place.",
)
@click.option(
    "--chaos-late-worker",
    "chaos_late_seconds",
    type=float,
    help="Start the last worker this many seconds after the others: a pod that starts after "
    "rendezvous.joinTimeoutSeconds (a slow image pull, a node being provisioned).",
)
@click.option(
    "--chaos-replace-after",
    "chaos_replace_seconds",
    type=float,
    help="Start a worker killed by --chaos-at-step or --chaos-every, or the Lighthouse, again "
    "this many seconds after the kill, not at once: a lost pod's replacement being scheduled "
    "and pulling its image.",
)
@click.option(
    "--chaos-no-restart",
    is_flag=True,
    help="Leave killed workers dead, as a node that never comes back (an elastic job, "
    "replicas.min < max, carries on without them).",
)
def run_command(
    job_file: Path,
    workdir: Path | None,
    fresh: bool,
    workers: int | None,
    nproc: str,
    chaos_steps: tuple[int, ...],
    chaos_every: float | None,
    chaos_worker: int | None,
    chaos_store_steps: tuple[int, ...],
    chaos_lighthouse_steps: tuple[int, ...],
    chaos_stop_steps: tuple[int, ...],
    chaos_crash_steps: tuple[int, ...],
    chaos_late_seconds: float | None,
    chaos_replace_seconds: float | None,
    chaos_no_restart: bool,
) -> None:
    """Run JOB_FILE here: torchrun agents on loopback stand in for pods, a folder for the PVC.

    The same YAML runs unchanged on a cluster with `torchkube submit`. Training resumes from
    the newest checkpoint in the work dir unless --fresh is given.
    """
    from pydantic import ValidationError

    from torchkube.api import TrainingJob
    from torchkube.api.errors import describe
    from torchkube.local.runner import Chaos, LocalRun

    try:
        manifest = yaml.safe_load(job_file.read_text())
        job = TrainingJob.model_validate(manifest)
    except ValidationError as error:
        raise click.ClickException(
            f"{job_file} is not a valid TrainingJob:\n{describe(error)}"
        ) from None
    except yaml.YAMLError as error:
        raise click.ClickException(f"{job_file} is not valid YAML: {error}") from None
    if chaos_lighthouse_steps and job.spec.failure_policy.recovery != "live":
        raise click.ClickException(
            "--chaos-lighthouse-at-step needs failurePolicy.recovery: live (only a live job has "
            f"a torchft Lighthouse); {job_file} has recovery {job.spec.failure_policy.recovery}"
        )
    workdir = workdir or Path("torchkube-runs") / job.name
    if fresh and workdir.exists():
        shutil.rmtree(workdir)
    chaos = Chaos(
        sorted(chaos_steps),
        chaos_every,
        chaos_worker,
        restart=not chaos_no_restart,
        store_at_steps=sorted(chaos_store_steps),
        lighthouse_at_steps=sorted(chaos_lighthouse_steps),
        stop_at_steps=sorted(chaos_stop_steps),
        crash_at_steps=sorted(chaos_crash_steps),
        late_seconds=chaos_late_seconds,
        replace_after_seconds=chaos_replace_seconds,
    )
    run = LocalRun(job, workdir, workers=workers, chaos=chaos, nproc=nproc)
    queue_note = _queue_note(job)
    if queue_note:
        click.echo(queue_note)
    _prepare_data(job, run.checkpoint_dir)
    click.echo(
        f"running {job.name}: {run.count} workers × {nproc} process(es), checkpoints and logs "
        f"in {workdir}/"
    )
    if job.spec.metrics.enabled:  # for a Prometheus of your own (docs/metrics.md)
        click.echo(
            "metrics: " + " ".join(f"http://127.0.0.1:{p}/metrics" for p in run.metrics_ports)
        )
    summary = run.run()
    click.echo("\n" + summary.render())
    sys.exit(0 if summary.succeeded else 1)


def _queue_note(job: "TrainingJob") -> str | None:
    """A job labelled for a Kueue queue runs here at once, as under an operator with
    kueue.enabled=false: said, so that nobody takes the local run for a test of the queue."""
    from torchkube.policy.queue import label_ignored, queue_name

    queue = queue_name(job)
    if queue is None:
        return None
    because = "torchkube run has no Kueue to admit it"
    return (
        f"note: {label_ignored(queue, because)}; on a cluster with Kueue, "
        "torchkube submit queues it (docs/queueing.md)"
    )


def _prepare_data(job: "TrainingJob", checkpoint_dir: Path) -> None:
    """``spec.data``, prepared here as the job's prepare pod would on a cluster (once: the
    marker on the folder makes a second run skip it)."""
    from torchkube.trainer.prepare import prepare_source
    from torchkube.trainer.sources import SourceError
    from torchkube.trainer.tokenizers import TokenizerUnavailable

    data = job.spec.data
    if data is None:
        return
    if data.source.claim is not None:
        raise click.ClickException(
            f"data.source.claim ({data.source.claim.name}) is a claim of a cluster; to run "
            "this job here, point data.source.path at a local file or folder of text"
        )
    folder = Path(data.folder(str(checkpoint_dir)))
    try:
        report = prepare_source(data.source, folder, data.tokenizer, data.val_fraction)
    except (SourceError, TokenizerUnavailable, ValueError, OSError) as error:
        raise click.ClickException(f"could not prepare {data.source.describe()}: {error}") from None
    note = f" ({report.tokenizer_note})" if report.tokenizer_note else ""
    click.echo(
        f"data: {report.train_tokens:,} training tokens from {report.source} in {folder}/, "
        f"tokenizer {report.tokenizer}{note}"
    )
