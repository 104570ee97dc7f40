"""Packing a job's workers into one topology domain with the scheduler's own pod affinity.

Every worker carries one pod-affinity term toward the job's other workers on the domain's node
label, so the scheduler puts it where they are: the first worker goes wherever it fits (no
worker of the job runs yet, and a pod that matches its own term may then land anywhere), the
others follow it, and a replacement lands beside the survivors. What this cannot do, and
Kueue's topology-aware scheduling does, is choose the domain for the whole job up front: a
first worker placed in a rack with room for it alone leaves the rest Pending
(docs/queueing.md, "Topology").

Whichever placed them, :func:`report` says where the workers are (``status.topology``) and,
with the ``TopologySpread`` condition, when they are in more than one domain: a job that
trains slower for it says so.
"""

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.api.spec import TopologySpec
from torchkube.api.status import (
    MAX_SLOT_RANGES,
    MAX_TOPOLOGY_DOMAINS,
    UNLABELLED_DOMAIN,
    TopologyStatus,
)
from torchkube.operator import conditions as cond
from torchkube.operator import pods as p

if TYPE_CHECKING:  # builders imports this module, and decision imports builders (workloads)
    from torchkube.operator.decision import Context

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


def unschedulable_hint(
    job: TrainingJob, workers: list[dict[str, Any]], nodes: Mapping[str, p.NodeHealth]
) -> str:
    """What to do about workers that cannot be scheduled, when the job's required domain may
    be why: the domain is the one the job's placed workers are in, named by its label value
    where their nodes carry it (empty: none is placed)."""
    topology = job.spec.scheduling.topology
    if topology is None or topology.mode != "required":
        return ""
    placed = sorted({node for pod in workers if (node := p.node_name(pod))})
    if not placed:
        return ""
    named = sorted(set(occupied(workers, nodes, topology.level)) - {UNLABELLED_DOMAIN})
    domain = f", {' and '.join(named)}" if named else ""
    there = f"in {' or '.join(named)}" if named else "there"
    return (
        f". scheduling.topology requires every worker in the {topology.level} domain of the "
        f"nodes the job's workers run on ({', '.join(placed)}){domain}: when that domain has "
        f"no room, free a node {there}, lower replicas, or set scheduling.topology.mode to "
        "preferred"
    )


def occupied(
    workers: list[dict[str, Any]], nodes: Mapping[str, p.NodeHealth], level: str
) -> dict[str, list[int]]:
    """The slots of the workers in each domain, in order: the ``level`` label's value on the
    node of each worker bound to a node and not on its way out (a Pending one there holds its
    place), ``UNLABELLED_DOMAIN`` for a node without the label. A worker whose node is gone
    from the node cache is left out: it is lost with its node (``node_loss``), not placed
    somewhere else."""
    domains: dict[str, list[int]] = {}
    for pod in workers:
        health = nodes.get(p.node_name(pod) or "")
        if health is None or p.state(pod) not in ("pending", "running"):
            continue
        domains.setdefault(health.labels.get(level, UNLABELLED_DOMAIN), []).append(p.slot(pod))
    return {domain: sorted(slots) for domain, slots in domains.items()}


def slot_ranges(slots: list[int], limit: int = MAX_SLOT_RANGES) -> str:
    """Sorted slots as ranges, ``0-3,8``; past ``limit`` characters cut at a comma with ``…``
    (the domain's worker count is in the spread condition)."""
    runs: list[list[int]] = []
    for slot in slots:
        if runs and slot == runs[-1][1] + 1:
            runs[-1][1] = slot
        else:
            runs.append([slot, slot])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    if len(text) <= limit:
        return text
    return text[: text.rindex(",", 0, limit)] + ",…"


SPREAD = "SpreadOverDomains"
MESSAGE_DOMAINS = 8
"""The spread message lists the domains with the most workers, this many at most."""


def report(ctx: "Context") -> None:
    """``status.topology`` (the domains the job's workers occupy) and the ``TopologySpread``
    condition: a Warning, once, when they occupy more than one, naming the domains and what
    would pack the job again. Without ``scheduling.topology`` neither is there (a topology
    removed from the spec takes both away)."""
    topology = ctx.spec.scheduling.topology
    if topology is None:
        ctx.status.topology = None
        ctx.clear(cond.TOPOLOGY_SPREAD, "NoTopology", "scheduling.topology is not set")
        return
    workers = [pod for pod in ctx.owned if p.role(pod) == lbl.ROLE_WORKER]
    slots = occupied(workers, ctx.nodes, topology.level)
    counts = {domain: len(held) for domain, held in slots.items()}
    domains = sorted(slots)
    listed = domains[:MAX_TOPOLOGY_DOMAINS]
    ctx.status.topology = TopologyStatus(
        level=topology.level,
        domains=listed,
        domain_count=len(domains),
        slots={domain: slot_ranges(slots[domain]) for domain in listed},
    )
    if len(domains) > 1:
        ctx.warn_once(cond.TOPOLOGY_SPREAD, SPREAD, spread_message(topology, counts))
    elif domains:
        text = f"the workers run in one {topology.level} domain: {domains[0]}"
        ctx.clear(cond.TOPOLOGY_SPREAD, "OneDomain", text)
    else:
        ctx.clear(cond.TOPOLOGY_SPREAD, "NoWorkerPlaced", "no worker is on a node")


def spread_message(topology: TopologySpec, counts: Mapping[str, int]) -> str:
    """The domains (most workers first), the one the job is packed back into — the labelled
    one with the most workers: the scheduler's affinity score favours it for a replacement —
    and the room it lacks for the workers outside it."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    home, held = next(item for item in ranked if item[0] != UNLABELLED_DOMAIN)
    total = sum(counts.values())
    outside = total - held
    shown = ", ".join(
        f"{domain} ({_workers(n)} on nodes without {topology.level})"
        if domain == UNLABELLED_DOMAIN
        else f"{domain} ({_workers(n)})"
        for domain, n in ranked[:MESSAGE_DOMAINS]
    )
    if len(ranked) > MESSAGE_DOMAINS:
        shown += f" and {len(ranked) - MESSAGE_DOMAINS} more"
    more = "1 more worker" if outside == 1 else f"{outside} more workers"
    text = (
        f"the job's {_workers(total)} on nodes run in {len(ranked)} {topology.level} domains: "
        f"{shown}; collectives cross between them, slower than within one. Missing: room in "
        f"{home} for {more}. Running workers are not moved: the job is packed again when the "
        f"workers outside {home} are replaced there (delete their pods once it has room: training "
        "restarts from a checkpoint, as for any lost pod)"
    )
    if topology.mode == "preferred":
        text += (
            ". With scheduling.topology.mode required a worker waits Pending instead of "
            "starting outside the domains the job occupies"
        )
    return text


def _workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"
