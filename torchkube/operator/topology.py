"""Packing a job's workers into one topology domain with the scheduler's own pod affinity.

Every worker carries one pod-affinity term toward the job's other workers on the domain's node
label, so the scheduler puts it where they are: the first worker goes wherever it fits (no
worker of the job runs yet, and a pod that matches its own term may then land anywhere), the
others follow it, and a replacement lands beside the survivors. What this cannot do, and
Kueue's topology-aware scheduling does, is choose the domain for the whole job up front: a
first worker placed in a rack with room for it alone leaves the rest Pending
(docs/queueing.md, "Topology").
"""

import json
from typing import Any

from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.operator import pods as p

PREFERRED_WEIGHT = 100
"""The preference's weight when the domain is only preferred: the most a preference can have."""


def workers_term(job: TrainingJob, level: str) -> dict[str, Any]:
    """The pod-affinity term "on a node whose ``level`` label equals that of a node where one of
    this job's workers runs" (in the job's namespace, the term's default)."""
    selector = {lbl.JOB_NAME: job.name, lbl.ROLE: lbl.ROLE_WORKER}
    return {"labelSelector": {"matchLabels": selector}, "topologyKey": level}


def packed(job: TrainingJob, affinity: dict[str, Any] | None) -> dict[str, Any] | None:
    """``affinity`` (the user's ``scheduling.affinity``) with the job's topology term added:
    a requirement or a preference, as ``scheduling.topology.mode`` says."""
    topology = job.spec.scheduling.topology
    if topology is None:
        return affinity
    merged: dict[str, Any] = json.loads(json.dumps(affinity or {}))
    pod_affinity = merged.setdefault("podAffinity", {})
    term = workers_term(job, topology.level)
    if topology.mode == "required":
        pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    else:
        preferred = pod_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
        preferred.append({"weight": PREFERRED_WEIGHT, "podAffinityTerm": term})
    return merged


def unschedulable_hint(job: TrainingJob, workers: list[dict[str, Any]]) -> str:
    """What to do about workers that cannot be scheduled, when the job's required domain may
    be why: the domain is the one the job's placed workers are in (empty: none is placed)."""
    topology = job.spec.scheduling.topology
    if topology is None or topology.mode != "required":
        return ""
    placed = sorted({node for pod in workers if (node := p.node_name(pod))})
    if not placed:
        return ""
    return (
        f". scheduling.topology requires every worker in the {topology.level} domain of the "
        f"nodes the job's workers run on ({', '.join(placed)}): when that domain has no room, "
        "free a node there, lower replicas, or set scheduling.topology.mode to preferred"
    )
