"""``hack/dev-cluster up|down``: the test suite's control plane, started by hand for demos.

It is the very same :class:`~testbed.cluster.Cluster` the tests use, so what works in a
demo works in CI. ``up`` runs in the foreground (Ctrl-C stops it) or, with ``--detach``, in a
background process that ``down`` stops later. State lives in ``--state-dir`` (default
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
from typing import Any

import click

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
    ) + _real_nodes_usage(state)


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
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)


def _serve(
    state_dir: Path, nodes: int, gpus_per_node: int, domains: int, real_nodes: int = 0
) -> None:
    """Start the cluster, publish its state, and hold it until SIGINT/SIGTERM."""
    from testbed.cluster import Cluster, ClusterConfig
    from testbed.errors import ClusterError
    from testbed.kwok import default_pools

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    config = ClusterConfig(
        pools=default_pools(nodes=nodes, gpus_per_node=gpus_per_node, domains=domains),
        workdir=state_dir / "cluster",
        real_nodes=real_nodes,
    )
    cluster = Cluster(config, report=lambda message: click.echo(message, err=True))
    try:
        cluster.start()
    except ClusterError as exc:
        raise click.ClickException(f"dev cluster could not start -- {exc}") from exc
    state = {"pid": os.getpid(), **cluster.describe()}
    (state_dir / STATE_FILE).write_text(json.dumps(state, indent=2))
    click.echo(_usage(state))
    failed = False
    try:
        while True:
            time.sleep(1)
            cluster.check()
    except KeyboardInterrupt:
        click.echo("stopping dev cluster ...", err=True)
    except ClusterError as exc:
        failed = True
        click.echo(f"dev cluster component died -- {exc}", err=True)
    finally:
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
@click.option("--detach", is_flag=True, help="Run in the background; stop with `down`.")
@_state_dir_option
def up(
    nodes: int, gpus_per_node: int, domains: int, real_nodes: int, detach: bool, state_dir: Path
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
        _serve(state_dir, nodes, gpus_per_node, domains, real_nodes)
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
@_state_dir_option
def serve(nodes: int, gpus_per_node: int, domains: int, real_nodes: int, state_dir: Path) -> None:
    """Run the cluster in this process (what ``up --detach`` starts in the background)."""
    _serve(state_dir, nodes, gpus_per_node, domains, real_nodes)


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
    for child_pid in [*state.get("pids", {}).values(), *state.get("domains", {}).values()]:
        if child_pid and _pid_alive(child_pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child_pid, signal.SIGKILL)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    click.echo("dev cluster stopped")


if __name__ == "__main__":
    dev_cluster()
