"""Read training progress from a worker (the trainer's ``GET /progress``, docs/trainer.md).

Every worker pod's local rank 0 serves the report, and in a synchronous job they all report
the same step, so one answer is enough: the pod that answered last time is asked first, then
the others one by one until one answers. A 512-worker job costs one request per poll, not 512.
A worker that does not answer within a second is skipped: progress is informative, never
blocking. So is a live-recovery hot spare standing by, whose trainer has no training to report.
"""

import json
import logging
import urllib.request
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api.contract import ProgressReport
from torchkube.operator import pods as p

log = logging.getLogger(__name__)
TIMEOUT_SECONDS = 1.0
MAX_TRIES = 3
"""Pods asked per poll before giving up until the next one."""


def _fetch(url: str) -> ProgressReport | None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            return ProgressReport.model_validate(json.loads(response.read()))
    except (OSError, ValueError) as error:  # pydantic's ValidationError is a ValueError
        log.debug("no progress from %s: %s", url, error)
        return None


def read_progress(
    template: str, pods: list[dict[str, Any]], port: int, preferred: str | None = None
) -> tuple[ProgressReport | None, str | None]:
    """(report, pod that answered), or (None, None) if nobody answered."""
    if not template:
        return None, None
    candidates = [
        pod
        for pod in pods
        if p.state(pod) == "running"
        and p.role(pod) == lbl.ROLE_WORKER
        and pod.get("status", {}).get("podIP")
    ]
    # The pod that answered last, then Ready ones: a spare standing by has no trainer to ask.
    candidates.sort(key=lambda pod: (p.name(pod) != preferred, not p.is_ready(pod)))
    for pod in candidates[:MAX_TRIES]:
        url = template.format(
            pod_ip=pod["status"]["podIP"],
            port=port,
            namespace=pod["metadata"]["namespace"],
            pod=p.name(pod),
        )
        report = _fetch(url)
        if report is not None and not (report.live is not None and report.live.standing_by):
            return report, p.name(pod)
    return None, None
