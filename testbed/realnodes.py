"""Real kubelet nodes beside the KWOK pool: pods run as real containers on this machine.

Each node is a kubelet with a containerd of its own (own root, state, socket; a kubelet removes
containers it did not start, so two kubelets never share one), its own bridge and CNI network
(``bridge`` + ``host-local`` on a per-node /24 + ``portmap``), its own cgroup root, pod-log
folder, ports and kubelet root dir. The node IP is its bridge's gateway address (a kubelet
refuses loopback). One CoreDNS with the ``kubernetes`` plugin, bound to an address on a bridge
of its own, is every node's cluster DNS, so headless Service names resolve inside pods. All
traffic stays on this machine: loopback, and the project's own bridges and network namespaces.

Traps this module encodes (see ``docs/real-nodes.md``): this VM forbids negative
``oom_score_adj`` (``restrict_oom_score_adj = true``); no registry, so the sandbox ("pause")
image is a static binary written into a docker-archive here and imported with ``ctr``; each
kubelet needs its own ``cgroupRoot`` and ``podLogsDir`` or they remove each other's pods.

:meth:`RealNode.kill` is a power loss: the node's containers, shims, containerd and kubelet are
SIGKILLed at once. Images reach nodes with :meth:`RealNodes.load_image` (``hack/load-images.sh``:
``docker save`` once, ``ctr images import`` per node, skipped when the node already has that
image ID); containerd roots are kept under ``${TORCHKUBE_CACHE}/realnodes`` so the next run does
not import again.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from testbed import containerd, host, kubelet, network
from testbed.containerd import LoadedImage
from testbed.errors import ClusterError
from testbed.kubeconfig import render_kubeconfig, write_kubeconfig
from testbed.process import Process
from testbed.wait import WaitTimeout, wait_for
from torchkube.elastic.warm import workers_of
from torchkube.local.logs import tail
from torchkube.local.ports import free_port

if TYPE_CHECKING:
    from testbed.cluster import Cluster
    from testbed.docker import Docker

REAL_NODE_LABEL = kubelet.REAL_NODE_LABEL
__all__ = ["REAL_NODE_LABEL", "LoadedImage", "RealNode", "RealNodes", "log_tail"]

Report = Callable[[str], None]


# ------------------------------------------------------------------------------- one node
def _mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds ``path``."""
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


class RealNode:
    """One kubelet + containerd pair with its own bridge, CNI network and cgroup root."""

    def __init__(self, owner: RealNodes, index: int):
        self.owner = owner
        self.index = index
        self.name = f"{owner.prefix}-node{index}"
        self.subnet = ipaddress.IPv4Network(f"{owner.supernet.network_address + (index << 8)}/24")
        self.gateway = str(self.subnet.network_address + 1)
        self.bridge = f"{owner.id_short}-br{index}"
        self.cni_network = f"{owner.prefix}-net{index}"
        self.dir = owner.workdir / self.name
        # Sockets need short paths (108 bytes); state is per run.
        self.state_dir = Path("/run") / f"{owner.prefix}-n{index}"
        self.socket = self.state_dir / "containerd.sock"
        self.cgroup_root = f"/{owner.prefix}-node{index}"
        self.kubelet_port = free_port()
        self.healthz_port = free_port()
        self.containerd: Process | None = None
        self.kubelet: Process | None = None
        self.root_dir: Path = self.dir / "containerd-root"  # the cached slot, once claimed
        self._root_lock: IO[str] | None = None
        self.started_in_s: float | None = None
        self.unplugged_at_restart: list[str] = []
        """The pods' veth ends the last power-on found still on the bridge and deleted."""
        """Seconds from starting the nodes until this one was Ready."""

    # -------------------------------------------------------------- containerd root (cached)
    def _claim_root(self) -> None:
        """A containerd root kept between runs (so images stay), locked while this node runs."""
        base = self.owner.cache_dir / "containerd"
        base.mkdir(parents=True, exist_ok=True)
        for slot in range(self.index, self.index + 16):
            lock = (base / f"slot{slot}.lock").open("w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.close()
                continue
            self._root_lock = lock
            self.root_dir = base / f"slot{slot}"
            self.root_dir.mkdir(exist_ok=True)
            return
        raise ClusterError(self.name, f"every containerd root slot under {base} is in use")

    def _release_root(self) -> None:
        if self._root_lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._root_lock, fcntl.LOCK_UN)
            self._root_lock.close()
            self._root_lock = None

    # -------------------------------------------------------------- start
    def start(self) -> None:
        started = time.monotonic()
        self._claim_root()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        network.create_bridge(self.bridge, f"{self.gateway}/24")
        host.make_cgroup_root(self.cgroup_root)
        self._write_cni()
        self._start_containerd()
        self.ensure_archive(self.owner.pause_archive, self.owner.pause_ref)
        self._forget_old_containers()
        self._start_kubelet()
        self.started_in_s = time.monotonic() - started

    def _write_cni(self) -> None:
        conf_dir = self.dir / "cni"
        conf_dir.mkdir(exist_ok=True)
        conflist = network.cni_conflist(
            self.cni_network, self.bridge, self.subnet, self.gateway, str(self.state_dir / "ipam")
        )
        (conf_dir / "10-torchkube.conflist").write_text(json.dumps(conflist, indent=2))

    def _start_containerd(self) -> None:
        config = self.dir / "containerd.toml"
        config.write_text(
            containerd.config_toml(
                self.root_dir,
                self.state_dir / "state",
                self.socket,
                self.owner.pause_ref,
                self.dir / "cni",
            )
        )
        self.containerd = Process(
            f"containerd-{self.name}",
            [host.tool("containerd"), "--config", str(config), "--log-level", "info"],
            self.owner.log_dir / f"containerd-{self.name}.log",
            env={**os.environ, "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"},
        ).start()
        proc = self.containerd

        def answers() -> bool:
            proc.check_alive()
            return (
                self.socket.exists()
                and subprocess.run(
                    self.ctr("version"), capture_output=True, check=False, timeout=10
                ).returncode
                == 0
            )

        try:
            wait_for(answers, 60, interval=0.2, what=f"containerd of {self.name}")
        except WaitTimeout as exc:
            raise proc.error(str(exc)) from None

    def ctr(self, *args: str) -> list[str]:
        """``ctr`` against this node's containerd, in the CRI namespace."""
        return containerd.ctr(self.socket, *args)

    def _forget_old_containers(self) -> None:
        """Containers a killed run left in the cached root: gone with their node, remove them."""
        out = host.run(self.ctr("containers", "list", "--quiet"), f"containerd of {self.name}")
        ids = out.split()
        if ids:
            subprocess.run(self.ctr("containers", "delete", *ids), capture_output=True, check=False)

    def image_ids(self) -> dict[str, str]:
        """Image reference -> config digest (the Docker image ID) in this node's containerd."""
        marker = self.root_dir / "torchkube-images.json"
        try:
            recorded: dict[str, str] = json.loads(marker.read_text())
        except (OSError, ValueError):
            return {}
        present = set(host.run(self.ctr("images", "list", "--quiet"), self.name).split())
        return {ref: digest for ref, digest in recorded.items() if ref in present}

    def ensure_archive(self, archive: Path, ref: str, image_id: str = "") -> float:
        """Import a docker-archive unless this node already has ``ref`` at ``image_id``.

        Returns the seconds the import took (0 when skipped).
        """
        image_id = image_id or archive.name
        if self.image_ids().get(ref) == image_id:
            return 0.0
        started = time.monotonic()
        with archive.open("rb") as handle:
            host.run(
                self.ctr("images", "import", "-"), f"image import on {self.name}", 1800, handle
            )
        marker = self.root_dir / "torchkube-images.json"
        try:
            recorded = json.loads(marker.read_text())
        except (OSError, ValueError):
            recorded = {}
        recorded[ref] = image_id
        marker.write_text(json.dumps(recorded, indent=2))
        return time.monotonic() - started

    def _kubelet_kubeconfig(self) -> Path:
        pki = self.owner.cluster.pki
        assert pki is not None
        pair = pki.ca.issue(
            self.dir / "pki",
            "kubelet-client",
            f"system:node:{self.name}",
            organizations=["system:nodes"],
            client=True,
        )
        path = self.dir / "kubelet.kubeconfig"
        write_kubeconfig(path, render_kubeconfig(self.owner.cluster.server, pki.ca_cert, pair))
        return path

    def _kubelet_config(self) -> Path:
        pki = self.owner.cluster.pki
        assert pki is not None
        resolv = self.dir / "resolv.conf"
        resolv.write_text(f"nameserver {self.owner.dns_ip}\n")
        config = kubelet.kubelet_config(
            address=self.gateway,
            port=self.kubelet_port,
            healthz_port=self.healthz_port,
            client_ca=pki.ca_cert,
            cgroup_root=self.cgroup_root,
            socket=self.socket,
            node_dir=self.dir,
            dns_ip=self.owner.dns_ip,
            resolv_conf=resolv,
            lease_seconds=self.owner.cluster.config.node_lease_duration_s,
        )
        path = self.dir / "kubelet.yaml"
        path.write_text(json.dumps(config, indent=2))
        return path

    def _start_kubelet(self) -> None:
        kubeconfig = self._kubelet_kubeconfig()
        config = self._kubelet_config()
        labels = kubelet.node_labels(self.name)
        self.kubelet = Process(
            f"kubelet-{self.name}",
            [
                str(self.owner.cluster.binaries().path("kubelet")),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--cert-dir={self.dir / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.gateway}",
                f"--node-labels={labels}",
                "--v=2",
            ],
            self.owner.log_dir / f"kubelet-{self.name}.log",
            env={**os.environ, "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"},
        ).start()

    def ready_status(self) -> str:
        try:
            return self.owner.cluster.node_ready_status(self.name)
        except Exception:
            return ""

    def wait_ready(self, timeout: float = 120) -> None:
        proc = self.kubelet
        if proc is None:
            raise ClusterError(self.name, "not running")

        def ready() -> bool:
            proc.check_alive()
            if self.containerd is not None:
                self.containerd.check_alive()
            return self.ready_status() == "True"

        try:
            wait_for(ready, timeout, interval=0.5, what=f"node {self.name} to be Ready")
        except WaitTimeout as exc:
            raise proc.error(str(exc)) from None

    # -------------------------------------------------------------- loss and teardown
    @property
    def alive(self) -> bool:
        return self.kubelet is not None and self.kubelet.alive()

    def kill(self) -> None:
        """Power loss: SIGKILL containers, shims, containerd and kubelet, all at once."""
        victims = host.cgroup_pids(self.cgroup_root) | host.pids_with_arg(str(self.socket))
        for proc in (self.kubelet, self.containerd):
            if proc is not None and proc.pid is not None:
                victims.add(proc.pid)
        host.kill_pids(victims)
        for proc in (self.kubelet, self.containerd):
            if proc is not None:
                proc.kill()
        # Whatever a shim started in the meantime (nothing should, its containerd is gone).
        host.kill_pids(host.cgroup_pids(self.cgroup_root) | host.pids_with_arg(str(self.socket)))

    def cleanup(self) -> None:
        """After :meth:`kill`: mounts, network namespaces, bridge, cgroups, run state."""
        claimed = [self.root_dir] if self._root_lock is not None else []
        host.unmount_under([self.dir, self.state_dir, *claimed])
        network.delete_netns_in(self.subnet)
        network.delete_link(self.bridge)
        for _ in range(3):
            host.remove_cgroups(self.cgroup_root)
            if not any(
                (h / self.cgroup_root.lstrip("/")).exists() for h in host.cgroup_hierarchies()
            ):
                break
            time.sleep(0.3)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self._release_root()

    def restart(self, timeout: float = 120) -> None:
        """Power back on: fresh containerd state and kubelet on the same root and identity."""
        self.kill()
        host.unmount_under([self.state_dir])
        network.delete_netns_in(self.subnet)
        self.unplugged_at_restart = network.unplug_pods(self.bridge)
        if left := network.ports_of(self.bridge):
            raise RuntimeError(f"{self.name}: pods still on {self.bridge} at power-on: {left}")
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._start_containerd()
        self._forget_old_containers()
        self._start_kubelet()
        self.wait_ready(timeout)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ip": self.gateway,
            "subnet": str(self.subnet),
            "bridge": self.bridge,
            "kubelet_port": self.kubelet_port,
            "containerd_socket": str(self.socket),
            "containerd_root": str(self.root_dir),
            "kubelet_pid": self.kubelet.pid if self.kubelet else None,
            "containerd_pid": self.containerd.pid if self.containerd else None,
            "started_in_s": self.started_in_s,
            "unplugged_at_restart": self.unplugged_at_restart,
        }


# ------------------------------------------------------------------------------- all nodes
class RealNodes:
    """The real nodes of one :class:`~testbed.cluster.Cluster`, plus CoreDNS."""

    def __init__(self, cluster: Cluster, count: int, report: Report | None = None):
        from testbed.docker import cache_root

        self.cluster = cluster
        self.count = count
        self.report = report or cluster.report
        self.id_short = f"tk{secrets.token_hex(2)}"
        self.prefix = f"torchkube-{self.id_short}"
        self.workdir = cluster.workdir / "realnodes"
        self.log_dir = cluster.log_dir
        self.cache_dir = cache_root() / "realnodes"
        # Picked now, before the control plane starts: the Service range lies inside it.
        self.supernet = network.pick_supernet()
        self.dns_bridge = f"{self.id_short}-dns"
        self.dns_ip = ""
        self.coredns: Process | None = None
        self.apiproxy: Process | None = None
        self.nodes: list[RealNode] = []
        self.pause_archive = Path()
        self.pause_ref = ""
        self._images: dict[str, LoadedImage] = {}

    @property
    def service_cidr(self) -> str:
        """The cluster's Service range: the last /24 of its /16 (nodes use the first ones), so
        the ``kubernetes`` ClusterIP routes to this machine from every pod
        (:mod:`testbed.apiproxy`)."""
        return f"{self.supernet.network_address + (255 << 8)}/24"

    @property
    def service_ip(self) -> str:
        """The ``kubernetes`` Service's ClusterIP (``KUBERNETES_SERVICE_HOST`` in pods)."""
        return str(ipaddress.IPv4Network(self.service_cidr).network_address + 1)

    @property
    def names(self) -> list[str]:
        return [node.name for node in self.nodes]

    def node(self, name: str) -> RealNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"{name!r} is not a real node of this cluster")

    def start(self, timeout: float = 120) -> RealNodes:
        """Create bridges, start CoreDNS, containerd and kubelets; wait for every node Ready."""
        host.require_host()
        self._require_binaries()
        self.workdir.mkdir(parents=True, exist_ok=True)
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        self.pause_archive, self.pause_ref = containerd.pause_archive(self.cache_dir / "images")
        # CoreDNS on a bridge of its own (x.x.0.1): a node loss never takes cluster DNS with it.
        self.dns_ip = str(self.supernet.network_address + 1)
        network.create_bridge(self.dns_bridge, f"{self.dns_ip}/32")
        self._start_apiproxy()
        self._start_coredns()
        self.nodes = [RealNode(self, index + 1) for index in range(self.count)]
        began = time.monotonic()
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_ready(timeout)
            # From "start the nodes" to this node Ready (nodes start side by side).
            node.started_in_s = time.monotonic() - began
        self._wait_dns()
        return self

    def _require_binaries(self) -> None:
        """kubelet and coredns next to the control plane, built there first if missing.

        ``hack/build-cluster.sh`` puts every component in one folder per pin set, so a folder
        made without the opt-in CoreDNS target (``TORCHKUBE_BIN_DIR`` from a default build)
        gets it added; a failed build raises a ClusterError naming the component.
        """
        from testbed.binaries import build

        binaries = self.cluster.binaries()
        try:
            binaries.require(["kubelet", "coredns"])
        except ClusterError as missing:
            self.report(f"{missing}; building it (cold: minutes) ...")
            built = build(("kubernetes", "coredns"))
            if built.resolve() != binaries.bin_dir.resolve():
                raise ClusterError(
                    "coredns",
                    f"built into {built}, not into the cluster's {binaries.bin_dir}: rebuild"
                    " with `hack/build-cluster.sh all`",
                ) from missing
            binaries.require(["kubelet", "coredns"])

    def _start_apiproxy(self) -> None:
        """The ``kubernetes`` ClusterIP on the DNS bridge, forwarded to the apiserver."""
        from testbed.binaries import repo_root

        network.add_address(self.dns_bridge, f"{self.service_ip}/32")
        target = ["127.0.0.1", str(self.cluster.ports["kube-apiserver"])]
        self.apiproxy = Process(
            "apiproxy",
            [sys.executable, "-m", "testbed.apiproxy", self.service_ip, "443", *target],
            self.log_dir / "apiproxy.log",
            cwd=repo_root(),
        ).start()
        proc = self.apiproxy

        def listening() -> bool:
            proc.check_alive()
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.service_ip, 443), timeout=1),
            ):
                return True
            return False

        try:
            wait_for(listening, 30, interval=0.1, what="the kubernetes Service forwarder")
        except WaitTimeout as exc:
            raise proc.error(str(exc)) from None

    def _start_coredns(self) -> None:
        port = free_port()
        corefile = self.workdir / "Corefile"
        corefile.write_text(
            f""".:53 {{
    bind {self.dns_ip}
    errors
    health 127.0.0.1:{port}
    kubernetes {kubelet.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.cluster.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
}}
"""
        )
        self.coredns = Process(
            "coredns",
            [str(self.cluster.binaries().path("coredns")), "-conf", str(corefile)],
            self.log_dir / "coredns.log",
            cwd=self.workdir,
        ).start()
        self._coredns_health = f"http://127.0.0.1:{port}/health"

    def _wait_dns(self) -> None:
        import urllib.request

        proc = self.coredns
        assert proc is not None

        def healthy() -> bool:
            proc.check_alive()
            try:
                with urllib.request.urlopen(self._coredns_health, timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        try:
            wait_for(healthy, 60, interval=0.3, what="coredns /health")
        except WaitTimeout as exc:
            raise proc.error(str(exc)) from None

    def check(self) -> None:
        for proc in (self.coredns, self.apiproxy):
            if proc is not None:
                proc.check_alive()

    def load_image(self, docker: Docker, tag: str) -> LoadedImage:
        """Make ``tag`` (in ``docker``) available on every node, the way a user loads images
        into their nodes: ``hack/load-images.sh --containerd SOCKET ...``. A node that already
        holds that image ID is skipped; the others import one ``docker save`` in parallel.
        Containerd roots are cached between runs, so an unchanged image costs seconds."""
        from testbed.binaries import repo_root

        image_id = docker.check("image", "inspect", "--format", "{{.Id}}", tag).strip()
        size = docker.image_size(tag)
        self._check_room(tag, image_id, size)
        argv = ["bash", str(repo_root() / "hack" / "load-images.sh")]
        for node in self.nodes:
            argv += ["--containerd", str(node.socket)]
        env = {**os.environ, "DOCKER": str(docker.client), "DOCKER_HOST": docker.host}
        env["CTR"] = host.tool("ctr")
        started = time.monotonic()
        proc = subprocess.run(
            [*argv, tag], capture_output=True, text=True, env=env, timeout=1800, check=False
        )
        if proc.returncode != 0:
            raise ClusterError(
                f"hack/load-images.sh {tag}", f"exited {proc.returncode}", log_tail=proc.stderr
            )
        by_socket = {str(node.socket): node.name for node in self.nodes}
        imported = [
            by_socket[line.split()[2]]
            for line in proc.stdout.splitlines()
            if line.startswith("imported ")
        ]
        loaded = LoadedImage(tag, image_id, size, time.monotonic() - started, imported)
        self._images[tag] = loaded
        self.report(
            f"image {tag} ({size / 1e9:.2f} GB) on real nodes in {loaded.seconds:.1f} s"
            f" (imported into {', '.join(imported) or 'none: all had it'})"
        )
        return loaded

    def _check_room(self, tag: str, image_id: str, size: int) -> None:
        """Fail before the import, not halfway through it, when the disk cannot take the image.

        A node that lacks it needs its size twice (the layers and their unpacked copy); one that
        holds an earlier build of the tag frees about as much first (hack/load-images.sh)."""
        label = f'labels."{containerd.IMAGE_ID_LABEL}"'
        need: dict[Path, int] = {}
        for node in self.nodes:
            holding = node.ctr("images", "list", "--quiet", f"{label}=={image_id}")
            if host.run(holding, node.name).strip():
                continue
            loaded = host.run(node.ctr("images", "list", "--quiet", label), node.name).split()
            if any(containerd.names_tag(name, tag) for name in loaded):
                continue
            mount = _mount_point(node.root_dir)
            need[mount] = need.get(mount, 0) + 2 * size
        for mount, needed in need.items():
            free = shutil.disk_usage(mount).free
            if free < needed:
                raise ClusterError(
                    f"image {tag} on real nodes",
                    f"needs about {needed / 1e9:.1f} GB free on {mount} (its layers and their "
                    f"unpacked copy on each node that lacks it), {free / 1e9:.1f} GB is free; make "
                    f"room there, e.g. `docker builder prune` against the test engine, or remove "
                    f"{self.cache_dir} so the nodes' image stores start afresh",
                )

    def kill_node(self, name: str) -> None:
        """Power loss of one node (see :meth:`RealNode.kill`)."""
        self.node(name).kill()

    def stop(self) -> None:
        """Kill every node, clean mounts, namespaces, bridges and cgroups; stop CoreDNS."""
        for node in self.nodes:
            node.kill()
        for node in self.nodes:
            node.cleanup()
        for proc in (self.coredns, self.apiproxy):
            if proc is not None:
                proc.stop()
        self.coredns = self.apiproxy = None
        network.delete_link(self.dns_bridge)

    def describe(self) -> dict[str, Any]:
        return {
            "dns": self.dns_ip,
            "kubernetes_service_ip": self.service_ip,
            "pod_network": str(self.supernet),
            "coredns_pid": self.coredns.pid if self.coredns else None,
            "nodes": [node.describe() for node in self.nodes],
        }


def log_tail(node: RealNode, lines: int = 30) -> str:
    """The kubelet's and containerd's last log lines, for assertion messages."""
    parts = []
    for proc in (node.kubelet, node.containerd):
        if proc is not None:
            parts.append(f"--- {proc.log_path} ---\n{tail(proc.log_path, lines)}")
    return "\n".join(parts)


def pod_process(pod_uid: str, command: bytes, without: bytes | None = None) -> int:
    """The host pid of the process in a real node's pod (by its cgroup) whose command line
    holds ``command`` and not ``without``; the harness runs as root on the nodes' host."""
    wanted = {f"pod{pod_uid}", f"pod{pod_uid.replace('-', '_')}"}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue
        if without is not None and without in cmdline:
            continue
        if command in cmdline and any(w in cgroup for w in wanted):
            return int(proc.name)
    raise ClusterError("real nodes", f"no {command.decode()} process in pod {pod_uid} here")


def trainer_process(pod_uid: str) -> int:
    """A worker pod's training process: forked from its launcher's forkserver (warm
    workers), or started by torchrun as ``python -m torchkube.trainer``."""
    launcher = pod_process(pod_uid, b"torchkube.elastic.launch")
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            tree.setdefault(parent, []).append(int(stat.parent.name))
    workers = workers_of(launcher, tree)
    if not workers:
        raise ClusterError("real nodes", f"no training process in pod {pod_uid} here")
    return workers[0]
