"""``torchkube submit|status|describe|logs|delete|suspend|resume|scale``: jobs on a cluster.

Each command talks to the current kubeconfig context (``--kubeconfig``, ``--context`` and
``-n/--namespace`` change that, as for kubectl). Importing this module costs only click: the
``kubernetes`` client and the API models load inside the command that needs them, so
``torchkube --help`` and the local commands stay fast.

Every failure a user can cause or fix -- a bad spec, a wrong context, a refused change -- ends
as one sentence on stderr and a non-zero exit (2 for input that is wrong before any cluster is
asked, 1 otherwise), never as a traceback.
"""

from __future__ import annotations

import functools
import json
import queue
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from torchkube.cli.errors import ClientError

if TYPE_CHECKING:
    from torchkube.cli.jobs import Jobs

F = TypeVar("F", bound=Callable[..., Any])


class CommandFailed(click.ClickException):
    """A ClientError on its way out through click: ``Error: <sentence>`` and its exit code."""

    def __init__(self, error: ClientError) -> None:
        super().__init__(error.message)
        self.exit_code = error.exit_code  # type: ignore[misc]
        self.details = error.details

    def show(self, file: Any = None) -> None:
        for line in self.details:
            click.echo(line, err=True)
        super().show(file)


def reports_errors(command: F) -> F:
    """Let a command raise ClientError anywhere; the user sees its sentence, not a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except ClientError as error:
            raise CommandFailed(error) from None

    return wrapper  # type: ignore[return-value]


def cluster_options(command: F) -> F:
    """``--kubeconfig``, ``--context`` and ``-n/--namespace``, as kubectl spells them."""
    command = click.option(
        "-n",
        "--namespace",
        metavar="NS",
        help="Namespace of the job (default: the context's namespace, else 'default').",
    )(command)
    command = click.option(
        "--context", metavar="NAME", help="kubeconfig context to use (default: the current one)."
    )(command)
    return click.option(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).",
    )(command)


def _jobs(kubeconfig: str | None, context: str | None, namespace: str | None) -> Jobs:
    from torchkube.cli.jobs import Jobs, connect

    return Jobs(connect(kubeconfig, context, namespace))


def _now() -> datetime:
    return datetime.now(UTC)


def _note(message: str) -> None:
    """Side remarks go to stderr, so the command's output can be piped as it is."""
    click.echo(message, err=True)


def _without_managed_fields(job: dict[str, Any]) -> dict[str, Any]:
    """As kubectl prints objects: managedFields are bookkeeping nobody reads here."""
    meta = {k: v for k, v in job.get("metadata", {}).items() if k != "managedFields"}
    return {**job, "metadata": meta}


def _dump(obj: Any, output: str) -> str:
    if output == "json":
        return json.dumps(obj, indent=2) + "\n"
    import yaml

    return str(yaml.safe_dump(obj, sort_keys=False))


# --- submit --------------------------------------------------------------------------------


@click.command(short_help="Create the TrainingJob(s) in a YAML file.")
@click.argument("job_file", metavar="JOB.yaml", type=click.File("r"))
@click.option(
    "--dry-run",
    is_flag=True,
    help="Have the cluster check and default the job (CRD rules, admission) without storing it.",
)
@click.option(
    "--offline",
    is_flag=True,
    help="Only check the file here; contact no cluster, create nothing (e.g. in CI).",
)
@cluster_options
@reports_errors
def submit(
    job_file: Any,
    dry_run: bool,
    offline: bool,
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
) -> None:
    """Create the TrainingJob(s) in JOB.yaml ('-' reads stdin).

    The spec is checked locally first, with every problem named by its field; nothing is sent
    unless all documents are valid. A job that already exists is left alone: submit never
    changes a running job (delete it first).
    """
    from torchkube.cli import manifest
    from torchkube.cli.render import done

    manifests = manifest.load(job_file.read(), job_file.name)
    for item in manifests:
        if namespace and item.namespace and item.namespace != namespace:
            raise ClientError(
                f'{item.source}: metadata.namespace is "{item.namespace}" but -n says '
                f'"{namespace}"; drop one of them',
                exit_code=manifest.INVALID,
            )
    if offline:
        for item in manifests:
            click.echo(done(item.name, "valid", "checked offline, nothing sent"))
        return
    by_namespace: dict[str | None, Jobs] = {}
    for item in manifests:
        ns = item.namespace or namespace
        if ns not in by_namespace:
            by_namespace[ns] = _jobs(kubeconfig, context, ns)
        created = by_namespace[ns].create(item.body, dry_run=dry_run)
        click.echo(
            done(created["metadata"]["name"], "created", "server dry run" if dry_run else "")
        )


# --- status --------------------------------------------------------------------------------


@click.command(short_help="Show jobs: phase, workers, progress, goodput.")
@click.argument("name", required=False)
@click.option("-A", "--all-namespaces", is_flag=True, help="Jobs of every namespace.")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "wide", "json", "yaml"]),
    default="table",
    show_default=True,
    help="wide adds tokens/s and world size; json and yaml print the objects.",
)
@cluster_options
@reports_errors
def status(
    name: str | None,
    all_namespaces: bool,
    output: str,
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
) -> None:
    """Show jobs: phase, workers, restarts, progress, loss, newest checkpoint, goodput.

    One job with NAME, else every job in the namespace (-A: in all namespaces). STEP is
    step/total (percent done); CHECKPOINT is the newest complete checkpoint's step and age;
    GOODPUT is '-' until the operator reports it.
    """
    from torchkube.cli.render import status_table

    if name and all_namespaces:
        raise ClientError("a job name belongs to one namespace; drop -A or the name", exit_code=2)
    jobs = _jobs(kubeconfig, context, namespace)
    found = [jobs.get(name)] if name else jobs.all(all_namespaces)
    if output in ("json", "yaml"):
        objects = [_without_managed_fields(j) for j in found]
        obj: Any = objects[0] if name else {"apiVersion": "v1", "kind": "List", "items": objects}
        click.echo(_dump(obj, output), nl=False)
        return
    if not found:
        where = "any namespace" if all_namespaces else f'namespace "{jobs.namespace}"'
        _note(f"No TrainingJobs in {where}.")
        return
    click.echo(
        status_table(
            found,
            _now(),
            all_namespaces=all_namespaces,
            wide=output == "wide",
            dispatched=jobs.dispatched(found),
        )
    )


# --- describe ------------------------------------------------------------------------------


@click.command(short_help="Explain a job: conditions, failures, events.")
@click.argument("name")
@cluster_options
@reports_errors
def describe(name: str, kubeconfig: str | None, context: str | None, namespace: str | None) -> None:
    """Explain one job: spec summary, conditions, recent failures, its pods and its events.

    The pods are listed by slot, which is the workers' rank order; with a
    scheduling.topology, each one's domain (when nodes may be read)."""
    from torchkube.cli.render import describe as render

    jobs = _jobs(kubeconfig, context, namespace)
    job = jobs.get(name)
    cluster = jobs.dispatched([job]).get(job["metadata"].get("uid", ""))
    topology = ((job.get("spec") or {}).get("scheduling") or {}).get("topology")
    domains = jobs.node_domains(topology["level"]) if topology else None
    pods, events = jobs.pods(name), jobs.events(job)
    click.echo(render(job, pods, events, _now(), dispatched_to=cluster, node_domains=domains))


# --- logs ----------------------------------------------------------------------------------


@click.command(short_help="Print rank 0's log (or a worker's, or all).")
@click.argument("name")
@click.option("--all", "all_workers", is_flag=True, help="Every worker, each line prefixed.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines as they come.")
@click.option("--tail", type=click.IntRange(min=0), metavar="N", help="Only the last N lines.")
@click.option(
    "--worker",
    type=click.IntRange(min=0),
    metavar="INDEX",
    help="The worker in slot INDEX (its newest pod) instead of rank 0.",
)
@cluster_options
@reports_errors
def logs(
    name: str,
    all_workers: bool,
    follow: bool,
    tail: int | None,
    worker: int | None,
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
) -> None:
    """Print the trainer log of the worker that holds rank 0 (or --worker / --all).

    Rank 0 can move to another pod after a failure or a resize: torchrun assigns ranks anew
    in every rendezvous round. By default the running worker whose log shows the newest
    rank-0 line of torchkube's trainer is chosen; when no log shows one (a custom command, or
    training has not started), worker slot 0's newest pod. The chosen pod is named on stderr.
    With -f the output ends when that pod's container does; run it again to follow the
    replacement.
    """
    from torchkube.cli import pods as p

    if all_workers and worker is not None:
        raise ClientError("--all and --worker choose differently; use one of them", exit_code=2)
    jobs = _jobs(kubeconfig, context, namespace)
    job = jobs.get(name)
    candidates = p.log_candidates(jobs.pods(name))
    if not candidates:
        phase = (job.get("status") or {}).get("phase", "Pending")
        raise ClientError(
            f'TrainingJob "{name}" has no worker pod with a log yet (phase {phase}); '
            f"torchkube describe {name} shows why"
        )
    if all_workers:
        chosen = p.newest_per_slot(candidates)
    elif worker is not None:
        pod = p.in_slot(candidates, worker)
        if pod is None:
            slots = ", ".join(str(p.slot(c)) for c in p.newest_per_slot(candidates))
            raise ClientError(
                f'TrainingJob "{name}" has no worker in slot {worker} (slots: {slots})'
            )
        chosen = [pod]
        _note(f"# {p.name(pod)} (worker slot {worker})")
    else:
        newest = p.newest_per_slot(candidates)
        probes = (
            jobs.probe_logs([p.name(c) for c in newest], p.PROBE_TAIL_LINES)
            if len(newest) > 1
            else {}
        )
        pod, how = p.pick_rank0(newest, probes)
        if len(newest) == 1:
            how = "the only worker"
        chosen = [pod]
        _note(f"# {p.name(pod)} (worker slot {p.slot(pod)}: {how})")
    names = [p.name(c) for c in chosen]
    try:
        if follow:
            follow_logs(jobs, names, tail, prefix=all_workers)
        else:
            for pod_name in names:
                text = jobs.log(pod_name, tail=tail)
                if all_workers:
                    from torchkube.cli.render import prefixed

                    for line in text.splitlines():
                        click.echo(prefixed(pod_name, line))
                else:
                    click.echo(text, nl=False)
    except KeyboardInterrupt:
        sys.exit(130)


def follow_logs(jobs: Jobs, names: list[str], tail: int | None, prefix: bool) -> None:
    """Stream one or several pods' logs; each in its own thread, printed by this one."""
    from torchkube.cli.render import prefixed

    lines: queue.Queue[tuple[str, str | None, ClientError | None]] = queue.Queue()

    def pump(pod: str) -> None:
        try:
            for line in jobs.follow(pod, tail):
                lines.put((pod, line, None))
            lines.put((pod, None, None))
        except ClientError as error:
            lines.put((pod, None, error))

    for pod in names:
        threading.Thread(target=pump, args=(pod,), daemon=True, name=f"logs-{pod}").start()
    failed: list[ClientError] = []
    streaming = len(names)
    while streaming:
        pod, line, error = lines.get()
        if line is not None:
            click.echo(prefixed(pod, line) if prefix else line)
            continue
        streaming -= 1
        if error is None:
            _note(f"# {pod}: log stream ended")
        else:
            failed.append(error)
            if prefix:  # the other pods keep streaming: say it now, fail at the end
                _note(f"# {pod}: {error.message}")
    if failed and not prefix:
        raise failed[0]
    if failed:
        raise ClientError(f"{len(failed)} of {len(names)} log streams failed (see above)")


# --- delete, suspend, resume, scale --------------------------------------------------------


@click.command(short_help="Delete a job and everything it owns.")
@click.argument("name")
@cluster_options
@reports_errors
def delete(name: str, kubeconfig: str | None, context: str | None, namespace: str | None) -> None:
    """Delete a job; its pods, Service and created claim go with it (owner references)."""
    from torchkube.cli.render import GROUP_RESOURCE

    _jobs(kubeconfig, context, namespace).delete(name)
    click.echo(f'{GROUP_RESOURCE} "{name}" deleted')


def _set_suspend(
    name: str, suspend: bool, kubeconfig: str | None, context: str | None, ns: str | None
) -> None:
    from torchkube.api.status import TERMINAL_PHASES
    from torchkube.cli.render import done

    jobs = _jobs(kubeconfig, context, ns)
    job = jobs.get(name)
    phase = (job.get("status") or {}).get("phase")
    verb = "suspended" if suspend else "resumed"
    if phase in TERMINAL_PHASES:
        raise ClientError(
            f'TrainingJob "{name}" already finished ({phase}); nothing to {verb[:-1]}'
        )
    current = bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend", False))
    if current == suspend:
        click.echo(f"{done(name, 'already ' + ('suspended' if suspend else 'running'))}")
        return
    jobs.set_suspend(name, suspend)
    click.echo(done(name, verb))


@click.command(short_help="Stop a job's pods, keep its checkpoints.")
@click.argument("name")
@cluster_options
@reports_errors
def suspend(name: str, kubeconfig: str | None, context: str | None, namespace: str | None) -> None:
    """Stop a job's pods and keep its checkpoints (spec.runPolicy.suspend=true)."""
    _set_suspend(name, True, kubeconfig, context, namespace)


@click.command(short_help="Resume a suspended job from its checkpoint.")
@click.argument("name")
@cluster_options
@reports_errors
def resume(name: str, kubeconfig: str | None, context: str | None, namespace: str | None) -> None:
    """Start a suspended job again; training continues from its newest checkpoint."""
    _set_suspend(name, False, kubeconfig, context, namespace)


@click.command(short_help="Set how many worker pods a job runs.")
@click.argument("name")
@click.option("--replicas", type=int, required=True, metavar="N", help="Worker pods wanted.")
@cluster_options
@reports_errors
def scale(
    name: str,
    replicas: int,
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
) -> None:
    """Set how many worker pods a job runs, within its replicas.min and replicas.max.

    Goes through the scale subresource (as kubectl scale does), so the cluster enforces the
    bounds; survivors re-rendezvous and training goes on from the newest checkpoint.
    """
    from torchkube.cli.render import done

    jobs = _jobs(kubeconfig, context, namespace)
    try:
        jobs.scale(name, replicas)
    except ClientError as error:
        if "refused" not in error.message:
            raise
        bounds = ((jobs.get(name).get("spec") or {}).get("replicas")) or {}
        raise ClientError(
            f"{error.message} (this job: min {bounds.get('min', 1)}, max {bounds.get('max', 1)})"
        ) from None
    click.echo(done(name, f"scaled to {replicas}"))


COMMANDS = [submit, status, describe, logs, delete, suspend, resume, scale]
"""The cluster commands, in the order a job's life uses them."""
