"""``torchkube operator``: run the operator process (kopf) with torchkube's settings."""

import asyncio
import logging
import os
import sys
from typing import NoReturn

import click

from torchkube.operator.config import OperatorSettings


async def run(settings: OperatorSettings, stop_flag: asyncio.Event | None = None) -> None:
    """Run until cancelled or ``stop_flag`` is set. Importing handlers registers them, but
    for the Workload watch, which only the Kueue integration registers."""
    import kopf

    from torchkube.operator import handlers

    if settings.kueue_enabled:
        handlers.watch_workloads(kopf.get_default_registry())

    liveness = f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None
    await kopf.operator(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        # Every replica watches; only the Lease holder acts (torchkube/operator/leader.py).
        standalone=True,
        liveness_endpoint=liveness,
        memo=kopf.Memo(config=settings),
        stop_flag=stop_flag,
    )


@click.command("operator")
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Watch only this namespace (repeatable). Default: TORCHKUBE_NAMESPACES or all.",
)
@click.option(
    "--leader-election/--no-leader-election",
    default=None,
    help="Take part in Lease-based leader election (for several replicas).",
)
@click.option("--metrics-port", type=int, default=None, help="Prometheus port (0 = off).")
@click.option("--health-port", type=int, default=None, help="Liveness port (0 = off).")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def operator_command(
    namespaces: tuple[str, ...],
    leader_election: bool | None,
    metrics_port: int | None,
    health_port: int | None,
    verbose: bool,
) -> None:
    """Run the TrainingJob operator against the current kubeconfig or in-cluster account."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        # kopf logs every handler call at INFO: thousands of lines per minute at scale.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    overrides = {
        "namespaces": list(namespaces) or None,
        "leader_election": leader_election,
        "metrics_port": metrics_port,
        "health_port": health_port,
    }
    settings = OperatorSettings.from_env().model_copy(
        update={k: v for k, v in overrides.items() if v is not None}
    )
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run(settings))
    except BaseException:
        logging.getLogger(__name__).exception("the operator stopped on an error")
        _exit_now(1)
    _exit_now(0)


def _exit_now(code: int) -> NoReturn:
    """End the process once the operator has stopped, without joining the threads still
    blocked in a request: a write batch the stop gave up on, a progress read, a Lease renew.
    None can be interrupted and none matters any more — the Lease is released and the next
    leader plans from the cluster, as after a crash — but ``asyncio.run`` and the
    interpreter's exit would wait for each, up to its request timeout (30 s)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
