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
SIGKILLed at once. Images reach nodes with :meth:`RealNodes.load_image` (``docker save`` once,
``ctr images import`` per node, skipped when the node already has that image ID); containerd
roots are kept under ``${TORCHKUBE_CACHE}/realnodes`` so the next run does not import again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from torchkube.testing.errors import ClusterError
from torchkube.testing.kubeconfig import render_kubeconfig, write_kubeconfig
from torchkube.testing.ports import free_port
from torchkube.testing.process import Process, tail
from torchkube.testing.wait import WaitTimeout, wait_for

if TYPE_CHECKING:
    from torchkube.testing.cluster import Cluster
    from torchkube.testing.docker import Docker

CNI_BIN_DIR = Path("/usr/lib/cni")
CGROUP_V1 = Path("/sys/fs/cgroup")
INSTALL_HINT = (
    "run hack/install-system-deps.sh (installs containerd, runc, containernetworking-plugins,"
    " iproute2)"
)
PAUSE_REPOSITORY = "torchkube/pause"
PAUSE_SOURCE = r"""
#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
    for (;;) pause();
}
"""
REAL_NODE_LABEL = "torchkube.dev/real-node"
CLUSTER_DOMAIN = "cluster.local"

Report = Callable[[str], None]


def _run(
    argv: Sequence[str], what: str, timeout: float = 60, stdin: IO[bytes] | None = None
) -> str:
    """Run a command; ClusterError naming ``what`` with its output when it fails."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, timeout=timeout, check=False, stdin=stdin
        )
    except FileNotFoundError as exc:
        raise ClusterError(what, f"cannot execute {argv[0]}: {exc}; {INSTALL_HINT}") from exc
    except subprocess.TimeoutExpired:
        raise ClusterError(what, f"`{' '.join(argv)}` did not finish in {timeout:.0f} s") from None
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout).decode(errors="replace")
        raise ClusterError(what, f"`{' '.join(argv)}` exited {proc.returncode}", log_tail=output)
    return proc.stdout.decode(errors="replace")


def _tool(name: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        raise ClusterError("real nodes", f"{name} not found; {INSTALL_HINT}")
    return found


def require_host() -> None:
    """Everything real nodes need from the machine, or a ClusterError saying what is missing."""
    if os.geteuid() != 0:
        raise ClusterError("real nodes", "need root (bridges, cgroups, containerd)")
    for name in ("containerd", "runc", "ctr", "ip", "iptables"):
        _tool(name)
    for plugin in ("bridge", "host-local", "portmap", "loopback"):
        if not (CNI_BIN_DIR / plugin).is_file():
            raise ClusterError(
                "real nodes", f"CNI plugin {CNI_BIN_DIR / plugin} missing; {INSTALL_HINT}"
            )
    if not (CGROUP_V1 / "memory").is_dir() and not (CGROUP_V1 / "cgroup.controllers").exists():
        raise ClusterError("real nodes", f"no cgroup filesystem at {CGROUP_V1}")


# ------------------------------------------------------------------------------- images
def pause_archive(directory: Path) -> tuple[Path, str]:
    """A docker-archive of the sandbox image (a static binary waiting for a signal).

    Built with the C compiler, no Docker needed; returns (archive path, image reference).
    """
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(PAUSE_SOURCE.encode()).hexdigest()[:12]
    ref = f"docker.io/{PAUSE_REPOSITORY}:{digest}"
    archive = directory / f"pause-{digest}.tar"
    if archive.is_file():
        return archive, ref
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "pause.c"
        source.write_text(PAUSE_SOURCE)
        binary = Path(tmp) / "pause"
        _run([_tool("gcc"), "-static", "-Os", "-s", "-o", str(binary), str(source)], "pause image")
        layer = io.BytesIO()
        with tarfile.open(fileobj=layer, mode="w") as tar:
            info = tar.gettarinfo(str(binary), arcname="pause")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with binary.open("rb") as handle:
                tar.addfile(info, handle)
    layer_bytes = layer.getvalue()
    layer_sha = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_sha}"]},
        }
    ).encode()
    config_sha = hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        [
            {
                "Config": f"{config_sha}.json",
                "RepoTags": [f"{PAUSE_REPOSITORY}:{digest}"],
                "Layers": [f"{layer_sha}/layer.tar"],
            }
        ]
    ).encode()
    partial = archive.with_suffix(".tmp")
    with tarfile.open(partial, mode="w") as tar:
        for name, data in (
            (f"{layer_sha}/layer.tar", layer_bytes),
            (f"{config_sha}.json", config),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    partial.rename(archive)
    return archive, ref


@dataclass(frozen=True)
class LoadedImage:
    """One image made available on every real node."""

    tag: str
    image_id: str
    size_bytes: int
    save_s: float
    """``docker save`` time (0 when the archive was cached)."""
    import_s: dict[str, float]
    """Per node: ``ctr images import`` time (0 when the node already had this image ID)."""


# ------------------------------------------------------------------------------- network
def _addresses_in_use() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = _run(["ip", "-4", "-o", "route", "show", "table", "all"], "ip route")
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for line in out.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("local", "broadcast", "unreachable", "multicast"):
            word = line.split()[1]
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(word if word != "default" else "0.0.0.0/32"))
    return nets


def pick_supernet(tries: int = 64) -> ipaddress.IPv4Network:
    """A free 10.x.0.0/16 for this cluster's pods: no route on the machine overlaps it."""
    used = _addresses_in_use()
    for _ in range(tries):
        candidate = ipaddress.IPv4Network(f"10.{100 + secrets.randbelow(150)}.0.0/16")
        if not any(candidate.overlaps(net) for net in used if net.prefixlen > 0):
            return candidate
    raise ClusterError("real nodes", "no free 10.x.0.0/16 for pod networks")


def _create_bridge(name: str, address: str) -> None:
    _run(["ip", "link", "add", "name", name, "type", "bridge"], f"bridge {name}")
    _run(["ip", "addr", "add", address, "dev", name], f"bridge {name}")
    _run(["ip", "link", "set", name, "up"], f"bridge {name}")


def _delete_link(name: str) -> None:
    subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


# ------------------------------------------------------------------------------- cleanup helpers
def _cgroup_hierarchies() -> list[Path]:
    return sorted(p for p in CGROUP_V1.iterdir() if p.is_dir() and (p / "cgroup.procs").exists())


def _cgroup_pids(relative: str) -> set[int]:
    pids: set[int] = set()
    for hierarchy in _cgroup_hierarchies():
        root = hierarchy / relative.lstrip("/")
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in procs.read_text().split())
    return pids


def _pids_with_arg(needle: str) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle.encode() in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
    found.discard(os.getpid())
    return found


def _kill_pids(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _unmount_under(prefixes: Sequence[Path]) -> None:
    """Lazily unmount every mount point under ``prefixes``, deepest first."""
    texts = [str(p.resolve()) for p in prefixes]
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            point = line.split()[1].replace("\\040", " ")
            if any(point == t or point.startswith(t + "/") for t in texts):
                mounts.append(point)
    for point in sorted(set(mounts), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _remove_cgroups(relative: str) -> None:
    for hierarchy in _cgroup_hierarchies():
        root = hierarchy / relative.lstrip("/")
        if not root.is_dir():
            continue
        dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts))
        for directory in [*reversed(dirs), root]:
            with contextlib.suppress(OSError):
                directory.rmdir()


def _delete_netns_in(subnet: ipaddress.IPv4Network) -> None:
    """Delete the named network namespaces whose pod address is in ``subnet``."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith("cni-"):
            continue
        addrs = subprocess.run(
            ["ip", "-n", name, "-4", "-o", "addr"], capture_output=True, text=True, check=False
        ).stdout
        for word in addrs.split():
            if "/" in word:
                with contextlib.suppress(ValueError):
                    if ipaddress.ip_interface(word).ip in subnet:
                        subprocess.run(["ip", "netns", "delete", name], check=False)
                        break


# ------------------------------------------------------------------------------- one node
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
        _create_bridge(self.bridge, f"{self.gateway}/24")
        self._make_cgroup_root()
        self._write_cni()
        self._start_containerd()
        self.ensure_archive(self.owner.pause_archive, self.owner.pause_ref)
        self._forget_old_containers()
        self._start_kubelet()
        self.started_in_s = time.monotonic() - started

    def _make_cgroup_root(self) -> None:
        for hierarchy in _cgroup_hierarchies():
            path = hierarchy / self.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (path / knob).write_text((hierarchy / knob).read_text())

    def _write_cni(self) -> None:
        conf_dir = self.dir / "cni"
        conf_dir.mkdir(exist_ok=True)
        conflist = {
            "cniVersion": "0.4.0",
            "name": self.cni_network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(self.subnet), "gateway": self.gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.state_dir / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (conf_dir / "10-torchkube.conflist").write_text(json.dumps(conflist, indent=2))

    def _containerd_config(self) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{self.root_dir}"
state = "{self.state_dir / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.root_dir / "opt"}"
[{cri}]
  sandbox_image = "{self.owner.pause_ref}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  [{cri}.containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.dir / "cni"}"
"""

    def _start_containerd(self) -> None:
        config = self.dir / "containerd.toml"
        config.write_text(self._containerd_config())
        self.containerd = Process(
            f"containerd-{self.name}",
            [_tool("containerd"), "--config", str(config), "--log-level", "info"],
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
        return [_tool("ctr"), "--address", str(self.socket), "--namespace", "k8s.io", *args]

    def _forget_old_containers(self) -> None:
        """Containers a killed run left in the cached root: gone with their node, remove them."""
        out = _run(self.ctr("containers", "list", "--quiet"), f"containerd of {self.name}")
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
        present = set(_run(self.ctr("images", "list", "--quiet"), self.name).split())
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
            _run(self.ctr("images", "import", "-"), f"image import on {self.name}", 1800, handle)
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
        lease = self.owner.cluster.config.node_lease_duration_s
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.gateway,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "x509": {"clientCAFile": str(pki.ca_cert)},
                "webhook": {"enabled": True},
                "anonymous": {"enabled": False},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "failSwapOn": False,
            "failCgroupV1": False,
            "podLogsDir": str(self.dir / "pod-logs"),
            "clusterDNS": [self.owner.dns_ip],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(resolv),
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "enforceNodeAllocatable": [],
            "nodeLeaseDurationSeconds": lease,
            "nodeStatusUpdateFrequency": "5s",
            "nodeStatusReportFrequency": "10s",
            "serializeImagePulls": False,
            "volumePluginDir": str(self.dir / "volume-plugins"),
            "shutdownGracePeriod": "0s",
            "maxPods": 20,
            "protectKernelDefaults": False,
            "makeIPTablesUtilChains": False,
        }
        path = self.dir / "kubelet.yaml"
        path.write_text(json.dumps(config, indent=2))
        return path

    def _start_kubelet(self) -> None:
        kubeconfig = self._kubelet_kubeconfig()
        config = self._kubelet_config()
        labels = ",".join(
            [
                f"{REAL_NODE_LABEL}=true",
                "type=real",
                f"topology.kubernetes.io/zone={self.name}",
            ]
        )
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
        victims = _cgroup_pids(self.cgroup_root) | _pids_with_arg(str(self.socket))
        for proc in (self.kubelet, self.containerd):
            if proc is not None and proc.pid is not None:
                victims.add(proc.pid)
        _kill_pids(victims)
        for proc in (self.kubelet, self.containerd):
            if proc is not None:
                proc.kill()
        # Whatever a shim started in the meantime (nothing should, its containerd is gone).
        _kill_pids(_cgroup_pids(self.cgroup_root) | _pids_with_arg(str(self.socket)))

    def cleanup(self) -> None:
        """After :meth:`kill`: mounts, network namespaces, bridge, cgroups, run state."""
        claimed = [self.root_dir] if self._root_lock is not None else []
        _unmount_under([self.dir, self.state_dir, *claimed])
        _delete_netns_in(self.subnet)
        _delete_link(self.bridge)
        for _ in range(3):
            _remove_cgroups(self.cgroup_root)
            if not any((h / self.cgroup_root.lstrip("/")).exists() for h in _cgroup_hierarchies()):
                break
            time.sleep(0.3)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self._release_root()

    def restart(self, timeout: float = 120) -> None:
        """Power back on: fresh containerd state and kubelet on the same root and identity."""
        self.kill()
        _unmount_under([self.state_dir])
        _delete_netns_in(self.subnet)
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
        }


# ------------------------------------------------------------------------------- all nodes
class RealNodes:
    """The real nodes of one :class:`~torchkube.testing.cluster.Cluster`, plus CoreDNS."""

    def __init__(self, cluster: Cluster, count: int, report: Report | None = None):
        from torchkube.testing.docker import cache_root

        self.cluster = cluster
        self.count = count
        self.report = report or cluster.report
        self.id_short = f"tk{secrets.token_hex(2)}"
        self.prefix = f"torchkube-{self.id_short}"
        self.workdir = cluster.workdir / "realnodes"
        self.log_dir = cluster.log_dir
        self.cache_dir = cache_root() / "realnodes"
        self.supernet = ipaddress.IPv4Network("10.0.0.0/16")
        self.dns_bridge = f"{self.id_short}-dns"
        self.dns_ip = ""
        self.coredns: Process | None = None
        self.nodes: list[RealNode] = []
        self.pause_archive = Path()
        self.pause_ref = ""
        self._images: dict[str, LoadedImage] = {}

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
        require_host()
        self._require_binaries()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.supernet = pick_supernet()
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        self.pause_archive, self.pause_ref = pause_archive(self.cache_dir / "images")
        # CoreDNS on a bridge of its own (x.x.0.1): a node loss never takes cluster DNS with it.
        self.dns_ip = str(self.supernet.network_address + 1)
        _create_bridge(self.dns_bridge, f"{self.dns_ip}/32")
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
        from torchkube.testing.binaries import build

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

    def _start_coredns(self) -> None:
        port = free_port()
        corefile = self.workdir / "Corefile"
        corefile.write_text(
            f""".:53 {{
    bind {self.dns_ip}
    errors
    health 127.0.0.1:{port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
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
        if self.coredns is not None:
            self.coredns.check_alive()

    def load_image(self, docker: Docker, tag: str) -> LoadedImage:
        """Make ``tag`` (in ``docker``) available on every node, once per image build.

        ``docker save`` writes one archive per image ID (kept in the cache, older ones of the
        same tag deleted); each node imports it in parallel unless it already has that ID.
        """
        image_id = docker.check("image", "inspect", "--format", "{{.Id}}", tag).strip()
        size = docker.image_size(tag)
        ref = tag if "/" in tag.split(":")[0] and "." in tag.split("/")[0] else f"docker.io/{tag}"
        images = self.cache_dir / "images"
        images.mkdir(parents=True, exist_ok=True)
        slug = tag.replace("/", "_").replace(":", "_")
        archive = images / f"{slug}-{image_id.split(':')[-1][:16]}.tar"
        save_s = 0.0
        need = [n for n in self.nodes if n.image_ids().get(ref) != image_id]
        if need and not archive.is_file():
            for old in images.glob(f"{slug}-*.tar"):
                old.unlink()
            started = time.monotonic()
            partial = archive.with_suffix(".partial")
            _run(docker.argv("save", "--output", str(partial), tag), f"docker save {tag}", 1800)
            partial.rename(archive)
            save_s = time.monotonic() - started
        with ThreadPoolExecutor(max_workers=max(1, len(self.nodes))) as pool:
            times = dict(
                zip(
                    [n.name for n in self.nodes],
                    pool.map(lambda n: n.ensure_archive(archive, ref, image_id), self.nodes),
                    strict=True,
                )
            )
        loaded = LoadedImage(tag, image_id, size, save_s, times)
        self._images[tag] = loaded
        self.report(
            f"image {tag} ({size / 1e9:.2f} GB) on real nodes: save {save_s:.1f} s, import "
            + ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
        )
        return loaded

    def kill_node(self, name: str) -> None:
        """Power loss of one node (see :meth:`RealNode.kill`)."""
        self.node(name).kill()

    def stop(self) -> None:
        """Kill every node, clean mounts, namespaces, bridges and cgroups; stop CoreDNS."""
        for node in self.nodes:
            node.kill()
        for node in self.nodes:
            node.cleanup()
        if self.coredns is not None:
            self.coredns.stop()
            self.coredns = None
        _delete_link(self.dns_bridge)

    def describe(self) -> dict[str, Any]:
        return {
            "dns": self.dns_ip,
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
