"""Read training progress from the workers (the trainer's ``GET /progress``, docs/trainer.md).

Every worker pod's local rank 0 serves the report; the freshest answer wins. A worker that
does not answer within a second is skipped: progress is informative, never blocking.
"""

import json
import logging
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torchkube.operator import pods as p

log = logging.getLogger(__name__)
TIMEOUT_SECONDS = 1.0


def _fetch(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            report: dict[str, Any] = json.loads(response.read())
            return report
    except (OSError, ValueError) as error:
        log.debug("no progress from %s: %s", url, error)
        return None


def read_progress(
    template: str, pods: list[dict[str, Any]], port: int, pool: ThreadPoolExecutor
) -> dict[str, Any] | None:
    """The newest report among the running workers, or None if nobody answered."""
    if not template:
        return None
    urls = [
        template.format(
            pod_ip=pod["status"]["podIP"],
            port=port,
            namespace=pod["metadata"]["namespace"],
            pod=p.name(pod),
        )
        for pod in pods
        if p.state(pod) == "running"
        and p.role(pod) == "worker"
        and pod.get("status", {}).get("podIP")
    ]
    reports = [r for r in pool.map(_fetch, urls) if r]
    if not reports:
        return None
    return max(reports, key=lambda r: (r.get("step", 0), str(r.get("updated", ""))))
