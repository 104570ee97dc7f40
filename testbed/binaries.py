"""Where the control-plane binaries are, building them with ``hack/build-cluster.sh`` if needed.

The build script is the single source of truth for pins and the cache key; this module only runs
it (a no-op in about a second when everything is built) and reads the folder from its last line.
``TORCHKUBE_BIN_DIR`` points at a ready folder instead, e.g. on a machine without Go.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from testbed.errors import ClusterError

BIN_DIR_ENV = "TORCHKUBE_BIN_DIR"
"""Environment variable naming a folder of ready binaries; skips the build script entirely."""

COMPONENT_OF = {
    "etcd": "etcd",
    "kube-apiserver": "kubernetes",
    "kube-controller-manager": "kubernetes",
    "kube-scheduler": "kubernetes",
    "kubectl": "kubernetes",
    "kubelet": "kubernetes",
    "kwok": "kwok",
    "helm": "helm",
    "coredns": "coredns",
    "kueue": "kueue",
}
"""Binary name -> the build-script component that produces it."""

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
"""The binaries a :class:`~testbed.cluster.Cluster` needs."""


def repo_root() -> Path:
    """The checkout this harness lives in (it is never installed: it is the repository's)."""
    return Path(__file__).resolve().parents[1]


def build_script() -> Path:
    """Path of ``hack/build-cluster.sh`` in the checkout."""
    return repo_root() / "hack" / "build-cluster.sh"


@dataclass(frozen=True)
class Binaries:
    """A folder of built control-plane binaries."""

    bin_dir: Path

    def path(self, name: str) -> Path:
        """Absolute path of binary ``name``; :class:`ClusterError` names it if it is missing."""
        candidate = self.bin_dir / name
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            component = COMPONENT_OF.get(name, name)
            raise ClusterError(
                name,
                f"binary missing: {candidate} (build it with `{build_script()} {component}`"
                f" or point {BIN_DIR_ENV} at a folder that has it)",
            )
        return candidate

    def require(self, names: tuple[str, ...] | list[str] = CONTROL_PLANE) -> Binaries:
        """Check that every binary in ``names`` is present; return self for chaining."""
        for name in names:
            self.path(name)
        return self


def _failed_component(output: str) -> str:
    match = re.search(r"FAILED to build (\S+)", output)
    return f"build of {match.group(1)}" if match else "hack/build-cluster.sh"


def build(
    components: tuple[str, ...] = (), progress: TextIO | None = None, timeout: float = 3600
) -> Path:
    """Run the build script for ``components`` (default set when empty) and return the bin folder.

    Build progress is streamed to ``progress`` (stderr by default) because a cold build takes
    many minutes; a failure raises :class:`ClusterError` naming the component that failed.
    """
    script = build_script()
    if not script.is_file():
        raise ClusterError(
            "hack/build-cluster.sh",
            f"not found at {script}: testbed needs a source checkout to build the"
            f" control plane, or {BIN_DIR_ENV} pointing at built binaries",
        )
    progress = progress or sys.stderr
    last_lines: deque[str] = deque(maxlen=40)
    try:
        proc = subprocess.Popen(
            ["bash", str(script), *components],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError as exc:
        raise ClusterError("hack/build-cluster.sh", f"cannot run bash: {exc}") from exc
    assert proc.stderr is not None and proc.stdout is not None
    for line in proc.stderr:
        last_lines.append(line.rstrip("\n"))
        progress.write(line)
        progress.flush()
    stdout = proc.stdout.read()
    code = proc.wait(timeout=timeout)
    if code != 0:
        tail = "\n".join(last_lines)
        raise ClusterError(
            _failed_component(tail), f"build script exited with code {code}", None, tail
        )
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ClusterError("hack/build-cluster.sh", "printed no bin folder on stdout")
    return Path(lines[-1].strip())


def find_binaries(
    names: tuple[str, ...] | list[str] = CONTROL_PLANE, progress: TextIO | None = None
) -> Binaries:
    """Locate (building if needed) a folder holding every binary in ``names``."""
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        return Binaries(Path(override)).require(names)
    components = tuple(sorted({COMPONENT_OF.get(name, name) for name in names}))
    return Binaries(build(components, progress=progress)).require(names)
