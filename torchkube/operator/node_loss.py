"""Node-loss policy: when a pod on a node that stopped reporting is lost, and when node trouble
is a partition rather than lost machines.

A deleted node loses its pods at once; a NotReady one after ``failurePolicy.
nodeLostGraceSeconds``. A lost pod is force-deleted (its kubelet will never confirm the
delete) and, unless the operator had already let it go, counts as a ``NodeLost`` failure. A
pod that finished before its node went is not lost: its result stands.

Nothing is lost while most of the cluster is NotReady at once: that is a network or
control-plane partition, and replacing every worker would only double the job once the nodes
report again. Partitions heal node by node, so a node still NotReady when one heals gets its
grace from the partition's end, not from when it stopped reporting.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from torchkube.api.times import parse_time
from torchkube.operator import conditions as cond
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, Context, Step

PARTITION_SHARE = 0.55
PARTITION_MIN_NODES = 3
"""More than this share of the cluster's nodes NotReady at once, and at least this many, is
taken for a network or control-plane partition: kube-controller-manager's node-lifecycle
controller stops evicting in the same situation (its ``unhealthy-zone-threshold`` is 0.55).
The share is judged when a lost node's grace (``nodeLostGraceSeconds``) runs out, so a
partition is recognised when its nodes are marked NotReady within that grace of each other
(the controller marks them within a node-monitor period or two; the default grace is 30 s)."""


@dataclass(frozen=True)
class Partition:
    """Most of the cluster stopped reporting at once."""

    not_ready: int
    nodes: int

    @property
    def message(self) -> str:
        return (
            f"{self.not_ready} of {self.nodes} nodes are NotReady at once: this looks like a "
            "network or control-plane partition, not lost machines. Workers on them are kept "
            "(not force-deleted and replaced) until their nodes come back or are deleted."
        )


def partition(nodes: dict[str, p.NodeHealth]) -> Partition | None:
    not_ready = sum(1 for health in nodes.values() if not health.ready)
    if not_ready >= PARTITION_MIN_NODES and not_ready > PARTITION_SHARE * len(nodes):
        return Partition(not_ready, len(nodes))
    return None


@dataclass(frozen=True)
class NodeLoss:
    """The nodes as this planning pass judges them."""

    nodes: dict[str, p.NodeHealth]
    grace: timedelta
    now: datetime
    partition: Partition | None = None
    partition_ended: datetime | None = None
    """When the last partition the job saw ended: now if it still lasted at the previous
    plan (None: never one)."""

    @classmethod
    def of(cls, ctx: Context) -> "NodeLoss":
        previous = ctx.condition(cond.NODES_UNREACHABLE)
        ended = None
        if previous is not None:
            ended = (
                ctx.now if previous.status == "True" else parse_time(previous.last_transition_time)
            )
        return cls(
            ctx.nodes,
            timedelta(seconds=ctx.spec.failure_policy.node_lost_grace_seconds),
            ctx.now,
            partition(ctx.nodes),
            ended,
        )

    def deadline(self, node: str | None) -> float | None:
        """Seconds until a pod on ``node`` counts as lost (≤ 0: lost now); None: never (not
        scheduled, its node Ready, or a partition)."""
        if node is None:
            return None
        health = self.nodes.get(node)
        if health is None:
            return 0.0
        if health.ready or self.partition is not None:
            return None
        since = max(filter(None, (health.since, self.partition_ended)), default=self.now)
        return (since + self.grace - self.now).total_seconds()

    def lost(self, ctx: Context, pod: dict[str, Any]) -> bool:
        """Whether ``pod`` is lost with its node now (one that succeeded never is). A lost pod
        is force-deleted; the others on a NotReady node are looked at again when its grace
        runs out, and not after: a pod that ended is past changing."""
        wait = self.deadline(p.node_name(pod))
        if wait is None:
            return False
        if wait > 0:
            ctx.plan.requeue(wait)
            return False
        if p.state(pod) == "succeeded":
            return False
        ctx.plan.delete(pod, force=True)
        return True


def report_partition(ctx: Context) -> Step:
    """``NodesUnreachable``: True, with a Warning, while most nodes are NotReady at once."""
    found = partition(ctx.nodes)
    if found is None:
        ctx.clear(cond.NODES_UNREACHABLE, "NodesReachable", "the nodes report again")
    else:
        ctx.warn_once(cond.NODES_UNREACHABLE, "Partition", found.message)
    return CONTINUE
