"""How the training loop survives the loss of a pod: the one contract between the loop
(``train.py``) and its recovery mode (``failurePolicy.recovery``).

The loop is the same in both modes; what differs is asked of a :class:`Recovery` at fixed
points of each step, as torchtitan keeps one loop with its torchft manager as a component:

* ``restart`` (:class:`RestartRecovery`) is the null case: every rank of the job is one
  torch.distributed world, the gradients are averaged inside it, every step commits, and a
  lost pod ends the round (the launcher and the operator restart it from the checkpoint);
* ``live`` (``live.LiveRecovery``, torchft) makes each pod one replica group: a quorum of
  the groups alive before each step, their gradients averaged across pods through torchft,
  a commit vote after it, one writer group, and a joining group that copies the live state
  from a peer instead of reading the checkpoint.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from torchkube.api.trainer import TrainerSpec
from torchkube.elastic.heartbeat import Heartbeat
from torchkube.trainer.checkpoint import CheckpointManager, TrainState
from torchkube.trainer.distributed import DistInfo, StopRequest
from torchkube.trainer.loader import RunEnv
from torchkube.trainer.reporting import ProgressReporter


@dataclass(frozen=True)
class Place:
    """This process's place in one step's data-parallel world."""

    data_rank: int
    data_size: int
    writer: bool
    """Whether this process's group writes the checkpoints, the progress record and the
    TensorBoard scalars (every group in restart mode, where the job is one group)."""


@dataclass(frozen=True)
class StandDown:
    """A process that is not to train after all, and how it ends."""

    code: int
    message: str | None = None
    """For the pod's termination message (None: none)."""


class Recovery(Protocol):
    """What the loop asks of its recovery mode, in the order it asks."""

    def checkpoint_env(self, run_env: RunEnv) -> RunEnv:
        """The run environment the checkpoint manager is made with."""
        ...

    def start(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: LambdaLR,
        state: TrainState,
    ) -> StandDown | None:
        """Before the first step, the model built; set when this process is not to train (a
        hot spare released at the end of training, or stopped while it stood by)."""
        ...

    def join(self, ckpt: CheckpointManager, restore: Callable[[], bool]) -> None:
        """Take the starting state: ``restore`` (the checkpoint, else the starting weights;
        True when a checkpoint was loaded), or a live peer's state."""
        ...

    def place(self) -> Place:
        """This process's place for the step about to start (after :meth:`begin_step`)."""
        ...

    def begin_step(self) -> Place:
        """Before a step's compute: its place (live: after the step's quorum)."""
        ...

    def computes(self) -> bool:
        """Whether this step's gradients are computed here (after :meth:`begin_step`); False:
        live, a group that joined the quorum finishing a step a lost group broke, whose peers
        computed theirs already."""
        ...

    def reduce(self, model: nn.Module, loss: torch.Tensor) -> None:
        """After the backward passes: average the gradients across what the world left out
        (``loss``: this process's loss of the step)."""
        ...

    def commit(self) -> bool:
        """Whether the step's update may be applied; False: the attempt is discarded and the
        step tried again."""
        ...

    def step_loss(self, own: torch.Tensor) -> torch.Tensor:
        """The committed step's loss to report, given this process's own (``own``)."""
        ...

    def committed(self, state: TrainState) -> None:
        """After a committed step's update (``state.step`` counted)."""
        ...

    def publish(self) -> None:
        """At each logged step: what the mode adds to the progress record."""
        ...

    def finish(self, state: TrainState) -> None:
        """Training reached its last step."""
        ...

    def close(self) -> None: ...


class RestartRecovery:
    """``failurePolicy.recovery: restart``: nothing to agree on beyond the world's own
    collectives; the whole job is the writer, and claims the checkpoint folder for its round
    before it reads it."""

    def __init__(self, info: DistInfo) -> None:
        self._place = Place(info.data_rank, info.data_size, writer=True)

    def checkpoint_env(self, run_env: RunEnv) -> RunEnv:
        return run_env

    def start(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: LambdaLR,
        state: TrainState,
    ) -> StandDown | None:
        return None

    def join(self, ckpt: CheckpointManager, restore: Callable[[], bool]) -> None:
        ckpt.claim()
        restore()

    def place(self) -> Place:
        return self._place

    def begin_step(self) -> Place:
        return self._place

    def computes(self) -> bool:
        return True

    def reduce(self, model: nn.Module, loss: torch.Tensor) -> None:
        """The world's DDP or FSDP already averaged the gradients in the backward pass."""

    def commit(self) -> bool:
        return True

    def step_loss(self, own: torch.Tensor) -> torch.Tensor:
        return own  # the reporter averages it over the world's ranks

    def committed(self, state: TrainState) -> None:
        pass

    def publish(self) -> None:
        pass

    def finish(self, state: TrainState) -> None:
        pass

    def close(self) -> None:
        pass


def recovery_for(
    spec: TrainerSpec,
    run_env: RunEnv,
    info: DistInfo,
    progress: ProgressReporter,
    stop: StopRequest,
    heartbeat: Heartbeat,
) -> Recovery:
    """The recovery mode the pod's environment names."""
    if run_env.recovery == "live":
        from torchkube.trainer.live import LiveRecovery  # torchft only where it is used

        return LiveRecovery(spec, run_env, info, progress, stop, heartbeat)
    return RestartRecovery(info)
