"""Make one process a straggler: a CPU quota on a cgroup of its own, as a node with a
throttled or shared CPU would run it.

The process (every thread of it) is moved into a new child of the ``cpu`` cgroup it is in —
the test runner's for a local worker, its container's for a pod on a real node — whose CFS
quota allows ``share`` of one CPU. The child lives under the process's own cgroup, so a
kubelet's accounting of the container still counts it. Leaving the context moves it back and
removes the child. cgroup v1 (the CI machine's) and v2 both work; either needs root.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from testbed.errors import ClusterError

CGROUP = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def _cpu_cgroup(pid: int) -> tuple[Path, bool]:
    """(the process's cpu cgroup folder, whether it is cgroup v2)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError as error:
        raise ClusterError("throttle", f"process {pid} is gone: {error}") from None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
                if (CGROUP / mount / "cpu.cfs_quota_us").exists():
                    return CGROUP / mount / path.lstrip("/"), False
    for line in lines:
        if line.startswith("0::") and (CGROUP / "cgroup.controllers").exists():
            return CGROUP / line[3:].lstrip("/"), True
    raise ClusterError("throttle", f"no cpu cgroup controller for process {pid}")


def _move(pid: int, cgroup: Path) -> None:
    (cgroup / "cgroup.procs").write_text(str(pid))


@contextlib.contextmanager
def throttle_cpu(pid: int, share: float, in_place: bool = False) -> Iterator[Path]:
    """Limit process ``pid`` to ``share`` of one CPU while the context lasts.

    ``in_place``: limit the cgroup the process is in instead — a container's own, which
    holds its whole pod's worker; no child is left behind for its runtime to trip over when
    the container goes (a container cgroup with a child cannot be removed)."""
    if os.geteuid() != 0:
        raise ClusterError("throttle", "a CPU quota needs root")
    parent, v2 = _cpu_cgroup(pid)
    if in_place:
        with _quota(parent, v2, share):
            yield parent
        return
    child = parent / f"torchkube-throttle-{pid}-{int(time.time())}"
    try:
        child.mkdir()
        if v2:
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text("+cpu")
    except OSError as error:
        raise ClusterError("throttle", f"could not make a cgroup in {parent}: {error}") from None
    try:
        with _quota(child, v2, share):
            _move(pid, child)
            yield child
    finally:
        with contextlib.suppress(OSError):
            for task in (child / "cgroup.procs").read_text().split():
                _move(int(task), parent)
        with contextlib.suppress(OSError):
            child.rmdir()


@contextlib.contextmanager
def _quota(cgroup: Path, v2: bool, share: float) -> Iterator[None]:
    """A CFS quota of ``share`` CPUs on ``cgroup``, the one it had put back afterwards."""
    quota = max(1000, int(share * PERIOD_US))
    files = (
        [("cpu.max", f"{quota} {PERIOD_US}")]
        if v2
        else [
            ("cpu.cfs_period_us", str(PERIOD_US)),
            ("cpu.cfs_quota_us", str(quota)),
        ]
    )
    before = {}
    try:
        for name, value in files:
            before[name] = (cgroup / name).read_text().strip()
            (cgroup / name).write_text(value)
    except OSError as error:
        raise ClusterError("throttle", f"could not set a CPU quota on {cgroup}: {error}") from None
    try:
        yield
    finally:
        for name, value in reversed(list(before.items())):
            with contextlib.suppress(OSError):  # the container may be gone with its cgroup
                (cgroup / name).write_text(value)
