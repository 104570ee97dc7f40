"""What real nodes need from this machine, and the blunt tools to tidy up after them:
commands with clear errors, cgroups, processes and mounts. Used by the node modules
(``network``, ``containerd``, ``kubelet``) and ``realnodes``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from testbed.errors import ClusterError

CNI_BIN_DIR = Path("/usr/lib/cni")
CGROUP_V1 = Path("/sys/fs/cgroup")
INSTALL_HINT = (
    "run hack/install-system-deps.sh (installs containerd, runc, containernetworking-plugins,"
    " iproute2)"
)


def run(argv: Sequence[str], what: str, timeout: float = 60, stdin: IO[bytes] | None = None) -> str:
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


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        raise ClusterError("real nodes", f"{name} not found; {INSTALL_HINT}")
    return found


def require_host() -> None:
    """Everything real nodes need from the machine, or a ClusterError saying what is missing."""
    if os.geteuid() != 0:
        raise ClusterError("real nodes", "need root (bridges, cgroups, containerd)")
    for name in ("containerd", "runc", "ctr", "ip", "iptables"):
        tool(name)
    for plugin in ("bridge", "host-local", "portmap", "loopback"):
        if not (CNI_BIN_DIR / plugin).is_file():
            raise ClusterError(
                "real nodes", f"CNI plugin {CNI_BIN_DIR / plugin} missing; {INSTALL_HINT}"
            )
    if not (CGROUP_V1 / "memory").is_dir() and not (CGROUP_V1 / "cgroup.controllers").exists():
        raise ClusterError("real nodes", f"no cgroup filesystem at {CGROUP_V1}")


def cgroup_hierarchies() -> list[Path]:
    return sorted(p for p in CGROUP_V1.iterdir() if p.is_dir() and (p / "cgroup.procs").exists())


def _cgroup_tree(root: Path) -> list[Path]:
    """``root`` and every cgroup below it, parents first. os.walk, not Path.rglob: a kubelet
    removes pod cgroups while they are walked, and rglob raises for a folder that went away
    (a node "lost" mid-test by that error then stayed alive)."""
    return [Path(folder) for folder, _, _ in os.walk(root)]


def cgroup_pids(relative: str) -> set[int]:
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / relative.lstrip("/")
        if not root.is_dir():
            continue
        for folder in _cgroup_tree(root):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in (folder / "cgroup.procs").read_text().split())
    return pids


def pids_with_arg(needle: str) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle.encode() in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
    found.discard(os.getpid())
    return found


def kill_pids(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def unmount_under(prefixes: Sequence[Path]) -> None:
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


def remove_cgroups(relative: str) -> None:
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / relative.lstrip("/")
        if not root.is_dir():
            continue
        for directory in reversed(_cgroup_tree(root)):
            with contextlib.suppress(OSError):
                directory.rmdir()


def make_cgroup_root(relative: str) -> None:
    """A cgroup of its own in every v1 hierarchy (cpuset's needs its cpus and mems filled)."""
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / relative.lstrip("/")
        path.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (path / knob).write_text((hierarchy / knob).read_text())
