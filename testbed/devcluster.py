"""``hack/dev-cluster up|down``: the test suite's control plane, started by hand for demos.

It is the very same :class:`~testbed.cluster.Cluster` the tests use, so what works in a
demo works in CI; ``--kueue`` adds the tests' Kueue with a queue, ``--multikueue`` the
MultiKueue layout of :mod:`testbed.multikueue` (this cluster the manager of two workers).
``up`` runs in the foreground (Ctrl-C stops it) or, with ``--detach``, in a background
process that ``down`` stops later. State lives in ``--state-dir`` (default
``~/.cache/torchkube/dev-cluster``). Heavy imports happen inside the commands: the ``torchkube``
CLI must start fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from testbed.cluster import Cluster
    from testbed.kueue import Kueue

STATE_FILE = "state.json"


def _default_state_dir() -> Path:
    cache = os.environ.get("TORCHKUBE_CACHE") or str(Path.home() / ".cache" / "torchkube")
    return Path(cache) / "dev-cluster"


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _usage(state: dict[str, Any]) -> str:
    kubeconfig = state["kubeconfig"]
    return (
        (
            f"dev cluster is up: {state['server']}\n"
            f"  kubeconfig: {kubeconfig}\n"
            f"  nodes:      {', '.join(n for nodes in state['pools'].values() for n in nodes)}\n"
            f"  logs:       {state['logs']}\n\n"
            f"Use it (a kubectl of the same version is in {state['bin']}):\n"
            f"  export KUBECONFIG={kubeconfig} PATH={state['bin']}:$PATH\n"
            f"  kubectl get nodes\n"
            f"Pods need the KWOK toleration to land on the fake GPU nodes:\n"
            f"  tolerations: [{{key: kwok.x-k8s.io/node, operator: Equal, value: fake,"
            f" effect: NoSchedule}}]\n"
        )
        + _real_nodes_usage(state)
        + _kueue_usage(state)
        + _multikueue_usage(state)
    )


def _kueue_usage(state: dict[str, Any]) -> str:
    kueue = state.get("kueue")
    if not kueue:
        return ""
    return (
        f"Kueue runs (log: {state['logs']}/kueue.log) with the LocalQueue {kueue['queue']!r} in"
        f" namespace default over the ClusterQueue of the same name (quota: all GPUs).\n"
        f"  Queue a TrainingJob (or a batch/v1 Job, created with spec.suspend: true) by label:\n"
        f"    metadata: {{labels: {{kueue.x-k8s.io/queue-name: {kueue['queue']}}}}}\n"
        f"  kubectl get workloads shows its Workload, admitted or waiting and why.\n"
        f"  TrainingJobs need an operator: torchkube operator (with KUBECONFIG as above).\n"
    )


def _multikueue_usage(state: dict[str, Any]) -> str:
    multikueue = state.get("multikueue")
    if not multikueue:
        return ""
    workers = "".join(
        f"    {name}: KUBECONFIG={worker['kubeconfig']}  (logs: {worker['logs']})\n"
        for name, worker in multikueue["workers"].items()
    )
    return (
        f"MultiKueue: this cluster is the manager of {', '.join(multikueue['workers'])}, each"
        f" with its own Kueue, KWOK nodes and the TrainingJob CRD:\n{workers}"
        f"  A job in namespace default labelled kueue.x-k8s.io/queue-name:"
        f" {multikueue['queue']} and with spec.managedBy: {multikueue['managed_by']}\n"
        f"  runs on a worker (a batch/v1 Job is created with spec.suspend: true). Where to:\n"
        f"    kubectl get workloads -o custom-columns=NAME:.metadata.name,"
        f"WORKER:.status.clusterName\n"
        f"  TrainingJobs there need an operator on each worker:"
        f" KUBECONFIG=<worker kubeconfig> torchkube operator\n"
        f"  Other namespaces need the LocalQueue {multikueue['queue']!r} and the namespace on"
        f" every cluster (testbed.multikueue.MultiKueue.add_namespace).\n"
    )


def _real_nodes_usage(state: dict[str, Any]) -> str:
    real = state.get("real_nodes")
    if not real:
        return ""
    names = ", ".join(node["name"] for node in real["nodes"])
    return (
        f"Real nodes (kubelet + containerd): {names}\n"
        f'  select them with nodeSelector {{torchkube.dev/real-node: "true"}};'
        f" images and timings: docs/real-nodes.md\n"
    )


def _prepare_state_dir(state_dir: Path) -> None:
    """Refuse if a dev cluster is running; clear what a crashed one left behind."""
    state = _read_state(state_dir)
    if state and _pid_alive(state.get("pid")):
        raise click.ClickException(
            f"a dev cluster is already running (pid {state['pid']}, kubeconfig"
            f" {state['kubeconfig']}); stop it with `hack/dev-cluster down`"
        )
    shutil.rmtree(state_dir / "cluster", ignore_errors=True)
    shutil.rmtree(state_dir / "workers", ignore_errors=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)


DEV_QUEUE = "default"
"""The dev cluster's ResourceFlavor, ClusterQueue and LocalQueue (namespace default) with
``--kueue``."""


def _start_kueue(cluster: Cluster, nodes: int, gpus_per_node: int) -> Kueue:
    """Kueue with the TrainingJob CRD and the queue :data:`DEV_QUEUE` over every GPU."""
    from testbed.crds import install_crd
    from testbed.kueue import Kueue
    from testbed.kwok import NodePool
    from testbed.multikueue import cluster_queue, create, local_queue, pool_quota, resource_flavor

    api = cluster.api_client()
    install_crd(api)
    started = Kueue(cluster).start()
    everything = NodePool(name="all", nodes=nodes, gpus_per_node=gpus_per_node)
    create(api, resource_flavor(name=DEV_QUEUE))
    create(api, cluster_queue(pool_quota(everything), name=DEV_QUEUE))
    create(api, local_queue(DEV_QUEUE), "default")
    return started


def _serve(
    state_dir: Path,
    nodes: int,
    gpus_per_node: int,
    domains: int,
    real_nodes: int = 0,
    kueue: bool = False,
    multikueue: bool = False,
) -> None:
    """Start the cluster (with Kueue, with MultiKueue workers), publish its state, and hold
    it until SIGINT/SIGTERM."""
    from testbed.cluster import Cluster, ClusterConfig
    from testbed.errors import ClusterError
    from testbed.kwok import default_pools
    from testbed.multikueue import (
        CONTROLLER,
        QUEUE,
        MultiKueue,
        MultiKueueLayout,
        start_multikueue,
    )

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    def report(message: str) -> None:
        click.echo(message, err=True)

    signal.signal(signal.SIGTERM, terminate)
    config = ClusterConfig(
        pools=default_pools(nodes=nodes, gpus_per_node=gpus_per_node, domains=domains),
        workdir=state_dir / "cluster",
        real_nodes=real_nodes,
    )
    cluster = Cluster(config, report=report)
    bed: MultiKueue | None = None
    state: dict[str, Any] = {}
    try:
        cluster.start()
        if kueue or multikueue:
            manager_kueue = _start_kueue(cluster, nodes, gpus_per_node)
            state["kueue"] = {"queue": DEV_QUEUE}
        if multikueue:
            layout = MultiKueueLayout(workdir=state_dir / "workers")
            bed = start_multikueue(cluster, manager_kueue, layout, report=report)
            bed.add_namespace("default")
            workers = {
                name: {**worker.cluster.describe(), "link": worker.link.pid}
                for name, worker in bed.workers.items()
            }
            state["multikueue"] = {"queue": QUEUE, "managed_by": CONTROLLER, "workers": workers}
    except ClusterError as exc:
        if bed is not None:
            bed.stop(failed=True)
        cluster.stop(failed=True)
        raise click.ClickException(f"dev cluster could not start -- {exc}") from exc
    state = {"pid": os.getpid(), **cluster.describe(), **state}
    (state_dir / STATE_FILE).write_text(json.dumps(state, indent=2))
    click.echo(_usage(state))
    failed = False
    try:
        while True:
            time.sleep(1)
            cluster.check()
            for worker in bed.workers.values() if bed else []:
                worker.cluster.check()
                worker.link.check_alive()
    except KeyboardInterrupt:
        click.echo("stopping dev cluster ...", err=True)
    except ClusterError as exc:
        failed = True
        click.echo(f"dev cluster component died -- {exc}", err=True)
    finally:
        if bed is not None:
            bed.stop(failed=failed)
        cluster.stop(failed=failed)
        (state_dir / STATE_FILE).unlink(missing_ok=True)
    if failed:
        sys.exit(1)


@click.group()
def dev_cluster() -> None:
    """A local Kubernetes control plane with fake GPU nodes (the one the tests use)."""


_state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=_default_state_dir,
    show_default="~/.cache/torchkube/dev-cluster",
    help="Where the cluster's work dir and state file live.",
)


@dev_cluster.command()
@click.option("--nodes", default=4, show_default=True, help="Number of fake (KWOK) nodes.")
@click.option("--gpus-per-node", default=8, show_default=True, help="nvidia.com/gpu per node.")
@click.option("--domains", default=2, show_default=True, help="Failure domains (kwok processes).")
@click.option(
    "--real-nodes",
    default=0,
    show_default=True,
    help="Real kubelet + containerd nodes (root; see docs/real-nodes.md).",
)
@click.option(
    "--kueue",
    is_flag=True,
    help="Start Kueue with a queue 'default' (namespace default) over every GPU.",
)
@click.option(
    "--multikueue",
    is_flag=True,
    help="Also two worker clusters, this one their MultiKueue manager (implies --kueue).",
)
@click.option("--detach", is_flag=True, help="Run in the background; stop with `down`.")
@_state_dir_option
def up(
    nodes: int,
    gpus_per_node: int,
    domains: int,
    real_nodes: int,
    kueue: bool,
    multikueue: bool,
    detach: bool,
    state_dir: Path,
) -> None:
    """Build (if needed) and start the cluster; print the kubeconfig path."""
    from testbed.binaries import BIN_DIR_ENV, find_binaries, repo_root
    from testbed.errors import ClusterError

    _prepare_state_dir(state_dir)
    try:
        binaries = find_binaries()  # builds in the foreground, with progress, when needed
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    if not detach:
        os.environ[BIN_DIR_ENV] = str(binaries.bin_dir)
        _serve(state_dir, nodes, gpus_per_node, domains, real_nodes, kueue, multikueue)
        return
    log_path = state_dir / "dev-cluster.log"
    with log_path.open("wb") as log:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "testbed.devcluster",
                "serve",
                f"--nodes={nodes}",
                f"--gpus-per-node={gpus_per_node}",
                f"--domains={domains}",
                f"--real-nodes={real_nodes}",
                f"--state-dir={state_dir}",
                *(["--kueue"] if kueue else []),
                *(["--multikueue"] if multikueue else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, BIN_DIR_ENV: str(binaries.bin_dir)},
            cwd=repo_root(),
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        state = _read_state(state_dir)
        if state and state.get("pid") == child.pid:
            click.echo(_usage(state) + "\nStop it with: hack/dev-cluster down")
            return
        if child.poll() is not None:
            raise click.ClickException(
                f"dev cluster exited with code {child.returncode}:\n{log_path.read_text()[-4000:]}"
            )
        time.sleep(0.5)
    child.terminate()
    raise click.ClickException(f"dev cluster not up after 300 s; see {log_path}")


@dev_cluster.command(hidden=True)
@click.option("--nodes", default=4)
@click.option("--gpus-per-node", default=8)
@click.option("--domains", default=2)
@click.option("--real-nodes", default=0)
@click.option("--kueue", is_flag=True)
@click.option("--multikueue", is_flag=True)
@_state_dir_option
def serve(
    nodes: int,
    gpus_per_node: int,
    domains: int,
    real_nodes: int,
    kueue: bool,
    multikueue: bool,
    state_dir: Path,
) -> None:
    """Run the cluster in this process (what ``up --detach`` starts in the background)."""
    _serve(state_dir, nodes, gpus_per_node, domains, real_nodes, kueue, multikueue)


@dev_cluster.command()
@_state_dir_option
def down(state_dir: Path) -> None:
    """Stop a dev cluster started with ``up`` (detached, or in another terminal)."""
    state = _read_state(state_dir)
    if not state:
        click.echo(f"no dev cluster running (no {state_dir / STATE_FILE})")
        return
    pid = int(state.get("pid") or 0)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    # Fallback for a server that died without cleaning up: its components' process groups.
    workers = (state.get("multikueue") or {}).get("workers", {}).values()
    children = [
        pid
        for described in (state, *workers)
        for pid in [
            *described.get("pids", {}).values(),
            *described.get("domains", {}).values(),
            described.get("link"),
        ]
    ]
    for child_pid in children:
        if child_pid and _pid_alive(child_pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child_pid, signal.SIGKILL)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    click.echo("dev cluster stopped")


if __name__ == "__main__":
    dev_cluster()
