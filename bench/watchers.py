"""Whose pod watches the API server closed, read from its log.

The API server counts the watches it closes because their client did not drain them in time
(``apiserver_terminated_watchers_total``), but not whose they were; at ``--v=1`` its cacher
logs each one with the watch's key and selectors (testbed's API server runs so). A
start-up trial that lost watches is slower by the relists that follow, and which component
fell behind the burst (the scheduler, KWOK, the operator under test) says whether the
operator is the cause.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from torchkube.api import labels as lbl

CLOSED = re.compile(
    r'Forcing pods watcher close due to unresponsiveness: key: "([^"]*)", '
    r'labels: "([^"]*)", fields: "([^"]*)"'
)
"""kube-apiserver's cacher (``cache_watcher.go``, klog V(1)); key ``/pods`` for a watch of
every namespace, ``/pods/<namespace>`` for one."""

SAID = (
    "the API server's log (--v=1) of each watch it closed, named by its key and selectors "
    "(bench/watchers.py)"
)
"""How a record's notes say where the names of closed watches come from."""

UNFILTERED = "unfiltered (the controller-manager's; a Kubeflow operator's)"
NAMESPACED_UNFILTERED = "unfiltered, one namespace (a Kubeflow operator's)"


def watcher(key: str, labels: str, fields: str) -> str:
    """Who holds a pod watch of this key and these selectors, in the benchmarks' clusters:
    in one namespace the benchmark watches its job's pods by label, a Kubeflow operator
    (``--namespace``) every pod; of the cluster-wide watches the scheduler leaves out ended
    pods, KWOK watches scheduled ones, torchkube's operator its jobs' pods by label, and the
    controller-manager's and a cluster-wide Kubeflow operator's are unfiltered alike."""
    if key.count("/") > 1:
        return "the benchmark" if labels else NAMESPACED_UNFILTERED
    if "status.phase!=" in fields and not labels:
        return "kube-scheduler"
    if fields.startswith("spec.nodeName"):
        return "KWOK"
    if labels == lbl.JOB_NAME:
        return "torchkube's operator"
    if not labels and not fields:
        return UNFILTERED
    return f"{key} labels {labels!r} fields {fields!r}"


def closed_pod_watchers(text: str) -> dict[str, int]:
    """How many pod watches the log ``text`` says were closed, by :func:`watcher`."""
    return dict(Counter(watcher(*found.groups()) for found in CLOSED.finditer(text)))


def log_size(path: Path) -> int:
    """Where a log ends now: a trial reads what was written after it."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def closed_since(path: Path, offset: int) -> dict[str, int]:
    """The pod watches the API server logged closing after ``offset`` of its log ``path``."""
    try:
        with path.open("rb") as log:
            log.seek(offset)
            return closed_pod_watchers(log.read().decode(errors="replace"))
    except OSError:
        return {}


def said(closers: dict[str, int]) -> str:
    """``kube-scheduler 3, KWOK 1``: whose, most first."""
    ranked = sorted(closers.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{name} {count}" for name, count in ranked)
