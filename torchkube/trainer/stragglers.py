"""Which rank is slow: each rank's compute time per step, apart from its wait for the others.

In a synchronous job every rank's step takes as long as the slowest rank's, because the others
wait for it in the gradient all-reduce; the step time cannot point at the straggler, the
compute time can. DDP calls its communication hook when a gradient bucket is ready on this
rank; :class:`WaitProbe` wraps the standard all-reduce hook and notes when this rank's last
bucket was ready and when its all-reduce completed. The gap is the time this rank waited for
the slowest one (plus the transfer itself, the same on every rank); the step's compute time is
its wall time less that wait. A rank slowed by a busy neighbour, a CPU limit, a throttled GPU
or a slow disk under its data loader shows a long compute time and a short wait.

Measured for ``ddp`` and ``zero1`` on CPU (gloo), where the hook's host times are the
collective's. Not measured for ``fsdp``/``hsdp`` (their collectives run inside forward and
backward, with no hook that tells a wait from a transfer) nor on GPU (an NCCL future completes
when the all-reduce is enqueued, not when it is done): no straggler summary there.

At every log step the ranks' compute and wait times travel with the metric averages in one
all-gather on the control group; rank 0 names the slowest rank against the median of the
others (:func:`slowest`), with its pod and node (:func:`places`), in its progress report.
"""

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from torchkube.api.contract import RankTiming


class WaitProbe:
    """Time this rank waited in the step's gradient all-reduce (host clock)."""

    def __init__(self) -> None:
        self._ready: float | None = None
        self._done: float | None = None

    def hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's all-reduce hook, timed: ready when called, done when its future completes."""
        self._ready = time.monotonic()

        def completed(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            self._done = time.monotonic()
            return fut.value()

        return default_hooks.allreduce_hook(state, bucket).then(completed)

    def take(self) -> float:
        """Seconds waited since the last call (the last bucket's ready-to-done gap)."""
        ready, done = self._ready, self._done
        self._ready = self._done = None
        if ready is None or done is None:
            return 0.0
        return max(0.0, done - ready)


def attach(model: nn.Module) -> WaitProbe | None:
    """A probe on ``model``'s gradient all-reduce where the split is measurable (DDP and
    ZeRO-1 on CPU), else None."""
    if not isinstance(model, DDP) or next(model.parameters()).device.type != "cpu":
        return None
    probe = WaitProbe()
    model.register_comm_hook(None, probe.hook)
    return probe


def places(group: dist.ProcessGroup, pod: str | None, node: str | None) -> list[tuple[str, str]]:
    """Every rank's (pod, node), gathered once per round on the control group."""
    world = dist.get_world_size(group)
    mine = (pod or "", node or "")
    if world == 1:
        return [mine]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    return [tuple(item) for item in gathered]


def slowest(compute: Sequence[float], where: Sequence[tuple[str, str]]) -> RankTiming | None:
    """The rank with the longest compute time per step, against the median of the others;
    None with fewer than two ranks or nothing measured."""
    if len(compute) < 2 or not any(compute):
        return None
    rank = max(range(len(compute)), key=lambda r: compute[r])
    others = [seconds for r, seconds in enumerate(compute) if r != rank]
    median = statistics.median(others)
    pod, node = where[rank] if rank < len(where) else ("", "")
    return RankTiming(
        rank=rank,
        pod=pod or None,
        node=node or None,
        compute_seconds=round(compute[rank], 6),
        median_seconds=round(median, 6),
        slowdown=round(compute[rank] / median, 3) if median > 0 else 0.0,
    )
