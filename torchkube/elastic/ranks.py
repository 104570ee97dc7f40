"""Ranks in slot order: a round's agents are ranked by their pod's slot (its replica index).

torch ranks a round's agents by their node descriptor — the ``--local-addr`` first, so by pod
IP, which says nothing about where the pods run. Under Kueue's topology-aware scheduling the
slot *is* the placement's order: the worker pods carry their index in Kueue's pod-index label,
and Kueue assigns consecutive indices to the same finest domain (a node, then a rack, then a
block), so with ranks in slot order a rank's data-parallel neighbours — the ring's next hop,
FSDP's shard neighbours, global rank ``r`` and ``r + nproc`` — are its topological neighbours.
A replacement takes its predecessor's slot and so its place in the order; a spare, whose slot
comes after the job's, joins at the end.

Here each agent's descriptor carries its slot (``Env.REPLICA_INDEX``; without one it sorts
first, by address as torch does) and orders by it. Every agent of a round runs this launcher,
so every descriptor in the shared rendezvous state is one of these; torch sorts them when it
marks a round complete, and global ranks follow the agents' ranks.
"""

import operator
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

from torchkube.api.contract import Env

NO_SLOT = -1


def _order(node: rdzv._NodeDesc) -> tuple[int, str, int, int]:
    return (getattr(node, "slot", NO_SLOT), node.addr, node.pid, node.local_id)


@dataclass(eq=True, frozen=True, repr=False)
class SlottedNode(rdzv._NodeDesc):
    """torch's node descriptor (address, pid, id; its ``repr`` in torch's logs) with the
    pod's slot, which orders it first; a plain descriptor sorts as one without a slot."""

    slot: int = NO_SLOT

    def __lt__(self, other: Any) -> bool:
        return _compared(self, other, operator.lt)

    def __le__(self, other: Any) -> bool:
        return _compared(self, other, operator.le)

    def __gt__(self, other: Any) -> bool:
        return _compared(self, other, operator.gt)

    def __ge__(self, other: Any) -> bool:
        return _compared(self, other, operator.ge)


def _compared(node: SlottedNode, other: Any, op: Callable[[Any, Any], bool]) -> bool:
    """``op`` on the two nodes' orders; NotImplemented for anything but a node descriptor."""
    if not isinstance(other, rdzv._NodeDesc):
        return NotImplemented
    return op(_order(node), _order(other))


class _SlottedNodes(rdzv._NodeDescGenerator):
    def __init__(self, slot: int) -> None:
        super().__init__()
        self.slot = slot

    def generate(self, local_addr: str | None = None) -> rdzv._NodeDesc:
        node = super().generate(local_addr)
        return SlottedNode(node.addr, node.pid, node.local_id, self.slot)


def slot_from_env() -> int:
    value = os.environ.get(Env.REPLICA_INDEX, "")
    return int(value) if value.isdigit() else NO_SLOT


def follow_slots() -> None:
    """Have every rendezvous handler this process creates describe its agent with the pod's
    slot (see the module docstring)."""
    handler_class: Any = rdzv.DynamicRendezvousHandler
    handler_class._node_desc_generator = _SlottedNodes(slot_from_env())
