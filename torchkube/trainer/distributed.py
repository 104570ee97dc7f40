"""Process-group setup from torchrun's environment, and the few collectives the loop needs.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT;
without them the trainer runs as one process on an in-memory store, so the same code path
(and the same checkpoint format) serves a laptop and a cluster.

Three process groups, each with one job:
- the default group (NCCL for CUDA tensors, gloo for CPU ones) carries gradients and
  parameters;
- ``control`` (gloo, main thread only) carries the per-step stop/save agreement, object
  broadcasts and metric averages, off the GPU stream;
- ``checkpoint`` (gloo) is used only by torch.distributed.checkpoint, whose async saves run
  their collectives on a background thread; a group of its own keeps those from interleaving
  with the main thread's collectives (IBM/PyTorch, "Reducing checkpointing times").
"""

import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import cast

import torch
import torch.distributed as dist

from torchkube.api.trainer import TrainerSpec
from torchkube.trainer.loader import ConfigError

log = logging.getLogger("torchkube.trainer")


@dataclass
class DistInfo:
    """Where this process sits in the job and which groups it talks on."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    control_group: dist.ProcessGroup
    checkpoint_group: dist.ProcessGroup
    tensor_size: int = 1
    """Ranks of one tensor-parallel group: consecutive ranks, so consecutive local ranks of one
    pod (torchrun numbers a node's processes consecutively)."""

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs, writes progress and commits checkpoints."""
        return self.rank == 0

    @property
    def data_size(self) -> int:
        """Data-parallel ranks: the ways the global batch is split. A tensor group reads one
        share of it together, so this is the world size over the tensor size."""
        return self.world_size // self.tensor_size

    @property
    def data_rank(self) -> int:
        """Which share of the global batch this rank reads (its tensor group's index)."""
        return self.rank // self.tensor_size


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def setup_logging(rank: int) -> None:
    """Rank 0 logs at INFO; the others only warnings and errors, tagged with their rank."""
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name("torchkube-trainer")
    tag = "" if rank == 0 else f" [rank {rank}]"
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s torchkube{tag}: %(message)s")
    )
    # Replace only our own handler: one set up by an earlier run in the same process.
    log.handlers[:] = [h for h in log.handlers if h.get_name() != handler.get_name()]
    log.addHandler(handler)
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False


def pick_device(spec: TrainerSpec, local_rank: int) -> torch.device:
    """One GPU per process, chosen by LOCAL_RANK; CPU when asked or when there is no GPU."""
    want_cuda = spec.device == "cuda" or (spec.device == "auto" and torch.cuda.is_available())
    if not want_cuda:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but no CUDA device is visible")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"LOCAL_RANK {local_rank} has no GPU: only {torch.cuda.device_count()} visible; "
            "run at most one process per GPU"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def setup(spec: TrainerSpec) -> DistInfo:
    """Join the job's process groups (or make a one-process world) and pin the device."""
    rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    setup_logging(rank)
    device = pick_device(spec, local_rank)
    timeout = timedelta(seconds=spec.collective_timeout_seconds)
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        nccl_timeouts(spec.collective_timeout_seconds)
    if "RANK" in os.environ:
        dist.init_process_group(
            backend, timeout=timeout, device_id=device if device.type == "cuda" else None
        )
    else:
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    if rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        log.warning(
            "torchrun shares its rendezvous store with the workers and keeps it across restarts, "
            "so restarted workers can read the previous round's addresses (gloo: 'Connection "
            "refused'); set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (torchkube.elastic.launch does)"
        )
    control = cast(dist.ProcessGroup, dist.new_group(backend="gloo", timeout=timeout))
    checkpoint = cast(dist.ProcessGroup, dist.new_group(backend="gloo", timeout=timeout))
    local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
    check_tensor_size(spec.parallelism.tensor, local_world_size)
    return DistInfo(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        device=device,
        control_group=control,
        checkpoint_group=checkpoint,
        tensor_size=spec.parallelism.tensor,
    )


NCCL_HEARTBEAT_MARGIN_SECONDS = 60


def nccl_timeouts(collective_timeout_seconds: int) -> None:
    """NCCL settings that make a blocked collective end at ``collectiveTimeoutSeconds``
    (``init_process_group``'s timeout) instead of blocking for ever, agreeing with the
    launcher's hang watchdog, which acts before it (``torchkube.api.hang``). The user's own
    values in ``spec.env`` win. Not measured here (no GPU in CI).

    - ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``: on a timed-out or failed collective, abort the
      communicators and end the process (torchrun then restarts the round);
    - ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``: the monitor that kills a process whose NCCL
      watchdog thread is itself stuck waits past the collective timeout, so it never fires
      first;
    - ``TORCH_NCCL_DUMP_ON_TIMEOUT`` with a trace buffer: the flight recorder writes which
      collective each rank was in when it timed out.
    """
    defaults = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(
            collective_timeout_seconds + NCCL_HEARTBEAT_MARGIN_SECONDS
        ),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    }
    for name, value in defaults.items():
        os.environ.setdefault(name, value)


def check_tensor_size(tensor: int, local_world_size: int) -> None:
    """A tensor group must fit in one pod: ``tensor`` divides the pod's process count (which
    admission checks against nprocPerNode; here against what torchrun really started)."""
    if local_world_size % tensor:
        raise ConfigError(
            f"parallelism.tensor ({tensor}) must divide the processes of this pod "
            f"(LOCAL_WORLD_SIZE {local_world_size}): a tensor group never spans pods"
        )


def teardown(after_error: bool = False) -> None:
    """Leave the process groups.

    After an error on GPU the NCCL communicators may wait forever on a dead peer, so they are
    left to the process exit; gloo groups are always safe to destroy.
    """
    if not dist.is_initialized():
        return
    if after_error and dist.get_backend() != "gloo":
        return
    try:
        dist.destroy_process_group()
    except Exception as e:  # a broken group cannot be left cleanly; the process ends anyway
        log.warning("process group teardown: %s", e)


def gather_across_ranks(values: list[float], group: dist.ProcessGroup) -> list[list[float]]:
    """Every rank's few host-side numbers, in rank order (one all-gather)."""
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine, group=group)
    return [t.tolist() for t in gathered]


def mean_across_ranks(values: list[float], group: dist.ProcessGroup) -> list[float]:
    """Average a few host-side numbers over all ranks (for logging and metrics)."""
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return (t / world_size).tolist()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Turns SIGTERM/SIGINT into a flag the loop checks between steps.

    torchrun forwards SIGTERM to its workers on pod deletion, preemption and before a
    scale-up re-rendezvous, then waits ``--shutdown-timeout`` (the pod's grace less a moment,
    :func:`torchkube.api.worker_launch.shutdown_timeout`) before SIGKILL: enough for an
    emergency checkpoint of the current step if we stop at a step boundary instead of dying
    mid-collective.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def close(self) -> None:
        """Give the signals back to whoever handled them before (matters in-process)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            log.warning(
                "received %s: will checkpoint and stop after this step", signal.Signals(signum).name
            )
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None


class StepAgreement:
    """All ranks decide together, once per step, whether to stop or checkpoint after it.

    A signal may reach ranks at different moments and only rank 0's clock decides time-based
    checkpoints, so each rank contributes its flags to a MAX all-reduce on the control group.
    It is started before the step's compute and awaited after it, so it costs no step time; a
    signal that arrives during a step is therefore agreed on in the next one. A world of one
    has nobody to agree with: it makes no collective call and reads its stop flag at the end of
    the step, so it stops right after the step the signal came in.
    """

    def __init__(self, group: dist.ProcessGroup, stop_requested: Callable[[], bool]):
        self.group = group
        self.stop_requested = stop_requested
        self.alone = dist.get_world_size(group) == 1
        self._flags = torch.zeros(2, dtype=torch.int32)
        self._work: dist.Work | None = None

    def start(self, save: bool) -> None:
        self._flags = torch.tensor([int(self.stop_requested()), int(save)], dtype=torch.int32)
        if not self.alone:
            self._work = dist.all_reduce(
                self._flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True
            )

    def result(self) -> tuple[bool, bool]:
        """(stop, save) as agreed by every rank."""
        if self.alone:
            return self.stop_requested(), bool(self._flags[1])
        assert self._work is not None, "start() first"
        self._work.wait()
        return bool(self._flags[0]), bool(self._flags[1])
