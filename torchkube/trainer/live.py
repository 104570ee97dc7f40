"""Live recovery (``failurePolicy.recovery: live``): each pod is one torchft replica group.

This is a component of the one training loop (``train.py``, through ``recovery.Recovery``),
not a loop of its own: everything the loop does — starting weights, eval, export, TensorBoard,
stragglers, step agreement — is the same in both modes.

A pod's ``nprocPerNode`` processes are one group: DDP (or FSDP's reduce-scatter) averages
their gradients inside the pod (its own torchrun world), then each process averages the result
with the same local rank of the other groups through torchft's Manager.

With restart recovery the loss of one pod stops every worker, and training resumes from the
newest checkpoint: every step since it is computed twice. Here the data-parallel all-reduce
across pods goes through torchft's Manager instead (its fault-tolerant all-reduce), and every step
begins with a quorum of the replica groups alive, formed by torchft's Lighthouse. So:

* a group that dies mid-step fails the step's all-reduce; the survivors do not commit that
  attempt (the step counter stays), but they keep the gradients they computed: the next
  quorum, without the lost group, reduces those again and commits the step, and they train
  on without it;
* the global batch stays the spec's: it is dealt out over the groups of the current quorum
  (``data.Layout``), so fewer groups accumulate more micro-batches each;
* a group that starts while others train (the lost pod's replacement) is behind the quorum's
  step: torchft copies the live state (weights, optimizer, schedule, data position) to it from
  a healthy peer over HTTP before the step, and it trains from there. Only when no group is
  ahead (the whole job started, or resumed after a whole-job loss) does each group take its
  starting state as restart mode does: the newest checkpoint, else ``weightsPath``, else the
  seeded initialisation — the same in every group.

Checkpoints to the volume still happen, for the losses live recovery cannot cover: the group
of quorum rank 0 (the lowest replica id alive) writes them, synchronously, at the committed
step. It claims the folder (``checkpoint.CheckpointManager.claim``) whenever it becomes that
writer, and only it writes the progress record (which carries :class:`LiveProgress`) and the
TensorBoard scalars.

Strategy ``fsdp`` shards each group's state over the pod's processes: the gradients are
averaged shard by shard, and a joining group's process copies its shards from the process of
the same local rank (:func:`local_shards`, :func:`copy_into`) — the layouts are the same.

Refused at admission (``spec._live_recovery_is_supported``): tensor parallelism, ``zero1``,
and ``hsdp`` (whose replicate dimension inside the pod torchft's would duplicate).
"""

import gc
import hashlib
import logging
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ReduceOp
from torch.distributed.checkpoint.state_dict import _init_optim_state
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR
from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL
from torchft.checkpointing import HTTPTransport
from torchft.manager import extract_trailing_digits

from torchkube.api.contract import (
    LIVE_COLLECTIVE_SECONDS,
    LIVE_MIN_REPLICA_GROUPS,
    STANDBY_RELEASED,
    ChaosPhase,
    ExitCode,
    LiveProgress,
)
from torchkube.api.trainer import TrainerSpec
from torchkube.elastic.heartbeat import Heartbeat
from torchkube.trainer import cross_group, distributed, standby
from torchkube.trainer.chaos import hold_if_armed
from torchkube.trainer.checkpoint import CheckpointManager, TrainState
from torchkube.trainer.data import Layout
from torchkube.trainer.distributed import StopRequest
from torchkube.trainer.loader import ConfigError, LiveEnv, RunEnv
from torchkube.trainer.recovery import Place, StandDown
from torchkube.trainer.reporting import ProgressReporter

log = logging.getLogger("torchkube.trainer")

LIVE_TIMEOUT = timedelta(seconds=LIVE_COLLECTIVE_SECONDS)
CONNECT_TIMEOUT = timedelta(seconds=10)
"""How long a new quorum's process group waits for its members to connect. They all ask as
the Lighthouse answers, so one that has not come within seconds was lost in between; a group
waiting the collective timeout for it holds every survivor a step's worth of seconds."""
QUORUM_TIMEOUT = timedelta(seconds=120)
"""How long a group waits for a quorum: the Lighthouse forms one as soon as the groups that
heartbeat have asked, so this only bounds a Lighthouse that is away — its pod replaced (a pod
start), or its node lost at the defaults (about 40 s to NotReady, ``nodeLostGraceSeconds``
30 s, then a pod start). Past it the groups restart from the newest checkpoint."""
REDUCTION_QUORUMS = 3
"""How many quorums a step's reduction is tried in before the step is computed again: a group
lost mid-step fails the vote once, its survivors' next quorum finishes the step; a second
loss before that quorum's vote costs one more."""
RESTARTED_LIGHTHOUSE_WAIT = timedelta(seconds=1)
"""How long a group that a Lighthouse started afresh answered with a smaller quorum waits
before it asks again: the other groups heartbeat every 100 ms once their client has connected
again, and a quorum asked for before their heartbeats are in is answered without them."""
RESTARTED_LIGHTHOUSE_ASKS = 3
"""How many times such a group asks again before it takes the smaller quorum (its other
groups are gone)."""
FIRST_QUORUM_WAIT = timedelta(seconds=30)
"""How long the groups of a job that starts (or starts again from a checkpoint) wait for the
groups it trains before the first quorum trains without the missing ones — torch's default
last call, the same wait for the same reason: pods start seconds apart."""
FIRST_QUORUM_ASK_EVERY = timedelta(seconds=0.5)
"""How often such a group asks again meanwhile."""
LIGHTHOUSE_RETRY = timedelta(seconds=0.5)
"""How often a group asks again for a quorum the Lighthouse could not answer (it is away)."""
QUORUM_RETRIES = round(QUORUM_TIMEOUT / LIGHTHOUSE_RETRY) - 1
"""torchft's Manager sleeps ``quorum_timeout / (quorum_retries + 1)`` after each failed request
to the Lighthouse, so this many retries ask every :data:`LIGHTHOUSE_RETRY` for the whole quorum
timeout. (Its default, 0, fails the quorum at the first refused request and every later one
with it: the group's workers restart.)"""


class LiveState:
    """What a joining group copies from a peer: the weights, the optimizer and its schedule,
    and the train state (step and data position)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: LambdaLR,
        state: TrainState,
    ) -> None:
        self.model, self.optimizer, self.scheduler, self.state = model, optimizer, scheduler, state
        self.copied_step: int | None = None
        """The step of the state last copied from a peer (None: never)."""

    def state_dict(self) -> dict[str, Any]:
        """Sharded tensors (FSDP inside the pod) as this process's shards: the joining
        group's process of the same local rank holds the same shards of the same layout."""
        hold_if_armed(ChaosPhase.SERVING_STATE)
        return {
            "model": local_shards(self.model.state_dict()),
            "optimizer": local_shards(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict(),
            "train": self.state.state_dict(),
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Copied into the tensors in place, shard by shard; an optimizer that has not
        stepped yet gets its state first (zeros, from a step at learning rate 0)."""
        hold_if_armed(ChaosPhase.RECEIVING_STATE)
        with torch.no_grad():
            copy_into(self.model.state_dict(), saved["model"])
            _init_optim_state(self.optimizer)
            current = self.optimizer.state_dict()
            copy_into(current["state"], saved["optimizer"]["state"])
        for group, told in zip(
            self.optimizer.param_groups, saved["optimizer"]["param_groups"], strict=True
        ):
            group.update({k: v for k, v in told.items() if k != "params"})
        self.scheduler.load_state_dict(saved["scheduler"])
        self.state.load_state_dict(saved["train"])
        self.copied_step = self.state.step


def local_shards(tree: Any) -> Any:
    """``tree`` with each DTensor replaced by this process's shard of it."""
    if isinstance(tree, DTensor):
        return tree.to_local()
    if isinstance(tree, dict):
        return {key: local_shards(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(local_shards(value) for value in tree)
    return tree


def copy_into(current: Any, saved: Any) -> None:
    """Copy the tensors of ``saved`` (:func:`local_shards` of a peer's) into ``current``'s,
    in place: a model's parameters and an optimizer's states are these very tensors."""
    if isinstance(current, DTensor):
        current.to_local().copy_(saved)
    elif isinstance(current, torch.Tensor):
        current.copy_(saved)
    elif isinstance(current, dict):
        for key, value in current.items():
            copy_into(value, saved[key])
    elif isinstance(current, list | tuple):
        for value, told in zip(current, saved, strict=True):
            copy_into(value, told)


class QuickConnectGloo(ProcessGroupGloo):
    """torchft's gloo group, which gives up on a member missing from a new quorum after
    :data:`CONNECT_TIMEOUT`, while its collectives keep :data:`LIVE_TIMEOUT` (torchft gives
    gloo one timeout for both)."""

    def __init__(self) -> None:
        super().__init__(timeout=CONNECT_TIMEOUT)

    def _create_pg(self, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
        pg = super()._create_pg(store, rank, world_size)
        pg._get_backend(torch.device("cpu")).set_timeout(LIVE_TIMEOUT)
        return pg

    def close_after_error(self, error: BaseException | None) -> None:
        """Close this group's connections as soon as a collective failed. In a ring a lost
        group's neighbours see the loss at once, but a group further round waits for data
        from a neighbour that gave up — until the collective timeout, while the Lighthouse
        holds the next quorum for it (it heartbeats and has not asked). Closing them fails
        its wait now. gloo closes a group's sockets only when nothing holds it any more, and
        the error's frames hold the collective's work: they are cleared first. The next
        quorum connects a new group: the Lighthouse bumps the quorum id when a member reports
        a failed commit, as this group does, and torchft reconfigures on a new id only."""
        if error is not None and error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
        self._pg = None
        gc.collect()


FINISHING = "finishing-a-broken-step;"
"""What a group's state-transfer metadata begins with while its next quorum finishes a step
its last vote lost (torchft's answer to a joining group does not say which groups lost
theirs)."""


class AdvertisedTransport(HTTPTransport):
    """torchft's HTTP state transfer, advertised at :attr:`LiveEnv.host` rather than at the
    host name, which torchft's own uses and which no other pod can resolve. Its metadata,
    which a joining group reads from the peer it copies from, also says whether that peer is
    finishing a step a lost group broke (:data:`FINISHING`)."""

    def __init__(self, host: str, timeout: timedelta) -> None:
        self.host = host  # before torchft's constructor, which may ask for the address
        self.finishing = False
        """Set by this group before a quorum that finishes the step its last vote lost."""
        self.source_finishing = False
        """Whether the peer this group last copied its state from was finishing a step."""
        super().__init__(timeout=timeout, num_chunks=0)

    def address(self) -> str:
        port = self._server.socket.getsockname()[1]
        return f"http://{self.host}:{port}/checkpoint/"

    def metadata(self) -> str:
        return (FINISHING if self.finishing else "") + self.address()

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        self.source_finishing = metadata.startswith(FINISHING)
        return super().recv_checkpoint(src_rank, metadata.removeprefix(FINISHING), step, timeout)


def replica_store() -> tuple[str, int, dist.TCPStore | None]:
    """The group's store for torchft's process groups: torchrun's (rank 0 serves it at
    MASTER_ADDR:MASTER_PORT), or one of our own outside torchrun."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return "127.0.0.1", store.port, store


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def summed(manager: Any, message: torch.Tensor) -> torch.Tensor:
    """``message`` (:func:`cross_group.outgoing`) summed over the quorum's groups, in place,
    through the Manager: a peer lost during it fails the step's commit vote instead of the
    process, and the gradients keep this group's values until the step commits, so the
    reduction can be done again among the survivors. (torchft's DDP wrapper would overlap
    this with the backward pass, but its comm hook fails an assertion when the all-reduce
    errors, which is exactly the case that matters here.)"""
    manager.allreduce(message, reduce_op=ReduceOp.SUM).wait()
    return message


def take_average(params: list[nn.Parameter], update: cross_group.Average) -> None:
    """The contributors' mean gradients into the parameters', for the optimizer: the same
    update in every group, a joining group that computed none included."""
    for param, grad in zip(params, update.grads, strict=True):
        if grad is None:
            param.grad = None
            continue
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        local = local_shards(param.grad)
        local.copy_(grad.view_as(local))


def take_a_place(
    info: distributed.DistInfo,
    live_env: LiveEnv,
    board: standby.QuorumBoard,
    stop: StopRequest,
    store_at: tuple[str, int],
    incarnation: int,
) -> standby.Decision | None:
    """Whether this group trains now, after standing by if the quorum is whole
    (``standby.wait_for_a_place``). Rank 0 decides for the pod's processes and tells them
    through the group's own store, under this ``incarnation``'s key (torchrun may keep the
    store across an in-place restart): a collective would time out during a long wait."""
    stopped = lambda: stop.requested  # noqa: E731
    if info.world_size == 1:
        return standby.wait_for_a_place(board, live_env.slot, live_env.target, stopped)
    store = dist.TCPStore(*store_at, is_master=False, wait_for_workers=False)
    key = f"torchkube/standby/{incarnation}"
    if info.is_main:
        decision = standby.wait_for_a_place(board, live_env.slot, live_env.target, stopped)
        store.set(key, decision or "stopped")
    else:
        while not store.check([key]):
            time.sleep(standby.POLL_SECONDS)
        told = store.get(key).decode()
        decision = None if told == "stopped" else cast(standby.Decision, told)
    # every process has read the decision before rank 0, which serves the store, may leave
    dist.barrier(group=info.control_group)
    return decision


class QuorumMembers:
    """Which replica groups the last quorum holds, by slot. torchft's Manager keeps only their
    number; the Lighthouse's answer names them (``<job>-<slot>:<uuid>``), so the Manager's
    client is watched as it answers, and everything else is passed through to it.

    Two things it mends when the Lighthouse is lost and started afresh (its quorum ids begin
    again at 1, as the groups' own ids were after its last start):

    * The new Lighthouse knows no group until each heartbeats, so the first groups to ask —
      the others' heartbeats not in yet — get a quorum of their own, and would train a step
      among themselves (a step of all the groups' micro-batches, for one group) while the
      others wait for them. A group answered with fewer groups than the last quorum by a
      Lighthouse that started afresh (:func:`lone_after_restart`) asks again, and joins the
      quorum the others have been waiting in; if they are gone, it gets the same small
      quorum again and goes on.
    * torchft connects a new process group only when the quorum id changes, and a new
      Lighthouse's ids may equal the old one's: a quorum of other groups under the same id
      kept the old group, whose collectives then waited for groups not in the step, until
      they timed out. Each answer's id is replaced by one of the id and the members together
      (:func:`quorum_key`): the same for every member, new whenever either changes."""

    def __init__(self, client: Any, target: int | None = None) -> None:
        self._client = client
        self._target = target
        """The groups the job trains (``replicas.target``); None: not known."""
        self._last: Any = None
        self.slots: list[int] = []
        self.max_step = 0
        """The step of the quorum's groups furthest ahead (0: the whole job starts)."""

    @classmethod
    def watch(cls, manager: Any, target: int | None = None) -> "QuorumMembers":
        manager._client = members = cls(manager._client, target)
        return members

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        result = self._client._quorum(*args, **kwargs)
        if short_at_start(self._last, result, self._target):
            result = self._wait_for_the_job(result, args, kwargs)
        for attempt in range(RESTARTED_LIGHTHOUSE_ASKS):
            if not lone_after_restart(self._last, result):
                break
            if attempt == 0:
                log.warning(
                    "live: the Lighthouse came back and answered with a quorum of %s of the "
                    "last quorum's %d: asking again in %.0f s, once the others' heartbeats are "
                    "in, so that no group trains a step alone while the others wait for it",
                    describe_groups(len(result.replica_ids)),
                    len(self._last.replica_ids),
                    RESTARTED_LIGHTHOUSE_WAIT.total_seconds(),
                )
            time.sleep(RESTARTED_LIGHTHOUSE_WAIT.total_seconds())
            result = self._client._quorum(*args, **kwargs)
        self._last = result
        ids = (replica_id.split(":")[0] for replica_id in result.replica_ids)
        self.slots = sorted(extract_trailing_digits(replica_id) for replica_id in ids)
        self.max_step = result.max_step
        return KeyedAnswer(result, quorum_key(result))

    def _wait_for_the_job(self, result: Any, args: Any, kwargs: Any) -> Any:
        """Ask again until the job's groups are in, or :data:`FIRST_QUORUM_WAIT` passed."""
        assert self._target is not None
        log.info(
            "live: the job's first quorum holds %s of the %d it trains: asking again until they "
            "are in (at most %.0f s), so that no group trains a step alone while the others start",
            describe_groups(len(result.replica_ids)),
            self._target,
            FIRST_QUORUM_WAIT.total_seconds(),
        )
        deadline = time.monotonic() + FIRST_QUORUM_WAIT.total_seconds()
        while short_at_start(None, result, self._target) and time.monotonic() < deadline:
            time.sleep(FIRST_QUORUM_ASK_EVERY.total_seconds())
            result = self._client._quorum(*args, **kwargs)
        if short_at_start(None, result, self._target):
            log.warning(
                "live: the job starts with %s of the %d it trains after %.0f s; the others join "
                "as they start",
                describe_groups(len(result.replica_ids)),
                self._target,
                FIRST_QUORUM_WAIT.total_seconds(),
            )
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class KeyedAnswer:
    """torchft's answer to a quorum request with the quorum id replaced (:func:`quorum_key`)."""

    def __init__(self, answer: Any, quorum_id: int) -> None:
        self._answer, self.quorum_id = answer, quorum_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._answer, name)


def quorum_key(answer: Any) -> int:
    """A quorum id of the Lighthouse's id and the quorum's members together: the same in every
    member's answer, and new whenever either changes."""
    members = ",".join(sorted(answer.replica_ids))
    digest = hashlib.blake2b(f"{answer.quorum_id}|{members}".encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


def short_at_start(last: Any, answer: Any, target: int | None) -> bool:
    """Whether ``answer`` is a group's first quorum (``last`` None) of a job starting — no
    group in it ahead of the others, so nobody heals from a peer — with fewer groups than the
    ``target`` the job trains: the others are still starting."""
    return (
        last is None and target is not None and not answer.heal and len(answer.replica_ids) < target
    )


def lone_after_restart(last: Any, answer: Any) -> bool:
    """Whether ``answer`` holds fewer groups than ``last`` under a quorum id that did not grow:
    a Lighthouse bumps its id whenever a quorum's members change, so it comes from one that
    started after the one that answered ``last``."""
    return (
        last is not None
        and answer.quorum_id <= last.quorum_id
        and len(answer.replica_ids) < len(last.replica_ids)
    )


def adds_gradients(copied_from_a_group_finishing: bool, own_votes_lost: int) -> bool:
    """Whether a group computes its step's gradients and adds them to the quorum's average.
    Not a group that just copied its state, in this quorum, from a peer finishing a step a
    lost group broke, while it lost no vote itself (it joins): the survivors computed that
    step's gradients before the loss and wait only for the reduction; computing its own would
    hold them a whole step, for a share of the data that was the lost group's."""
    return not (copied_from_a_group_finishing and own_votes_lost == 0)


def describe_groups(groups: int) -> str:
    return f"{groups} replica group{'s' if groups != 1 else ''}"


def describe_split(groups: int, layout: Layout) -> str:
    return (
        f"{describe_groups(groups)}, {layout.describe()} (global batch {layout.global_batch_size})"
    )


class LiveRecovery:
    """The torchft side of each step (:class:`recovery.Recovery`): quorum, the cross-group
    reduction, the commit vote, the writer group, and joining from a peer."""

    def __init__(
        self,
        spec: TrainerSpec,
        run_env: RunEnv,
        info: distributed.DistInfo,
        progress: ProgressReporter,
        stop: StopRequest,
        heartbeat: Heartbeat,
    ) -> None:
        if run_env.live is None:
            raise ConfigError(
                "failurePolicy.recovery live needs the live-recovery environment (a torchft "
                "Lighthouse): the operator and torchkube run set it for every live job"
            )
        self.spec, self.live_env, self.info = spec, run_env.live, info
        self.progress, self.stop, self.heartbeat = progress, stop, heartbeat
        progress.enabled = False  # until this group is the quorum's writer (:meth:`_arrange`)
        self.replica_id = run_env.live.replica_id(run_env.job_name)
        self.incarnation = run_env.elastic_restart_count
        self.board = standby.QuorumBoard(run_env.rendezvous_endpoint)
        """Where the writer group tells standbys how many groups train."""
        self.store_host, self.store_port, self._own_store = replica_store()
        self.manager: Any = None
        self.pg: ProcessGroupNCCL | QuickConnectGloo | None = None
        self.members: QuorumMembers | None = None
        self.transport: AdvertisedTransport | None = None
        self._start: Callable[[], bool] | None = None
        """A group's starting state (``join``'s ``restore``) while it has none: its first copy
        broke off."""
        self.live: LiveState | None = None
        self.ckpt: CheckpointManager | None = None
        self.split: tuple[int, int] | None = None  # (groups, this group's rank) of the quorum
        self._place = Place(info.data_rank, info.data_size, writer=False)
        self.writer = False
        self.record = LiveProgress(replica_groups=0, grad_accum_steps=1)
        self._quorum_taken = False  # the first quorum, taken by join(), serves the first step
        self._attempt_began: float | None = None  # the first attempt at the step to commit
        self._quorum = self._allreduce = self._vote = 0.0
        self._params: list[nn.Parameter] = []
        self._shapes: list[torch.Tensor] = []  # the parameters' local tensors, for the message
        self._loss: torch.Tensor | None = None  # this group's loss of the step, for its message
        self._reduced: torch.Tensor | None = None
        self._step_loss: torch.Tensor | None = None  # the last step committed's, its groups' mean
        self._votes_lost = 0  # in a row, since this group last committed a step
        self._adds_gradients = True
        self.steps_done = 0

    def checkpoint_env(self, run_env: RunEnv) -> RunEnv:
        """Synchronous saves: a save ends before the next quorum, so the writer can change
        between two steps (a lower replica id rejoins) without two groups ever committing into
        the folder at once, or the new writer's claim fencing the old one's save in flight."""
        if run_env.checkpoint_mode == "async":
            log.info("live: checkpoints are written synchronously, by the writer group alone")
        return replace(run_env, checkpoint_mode="sync")

    def start(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: LambdaLR,
        state: TrainState,
    ) -> StandDown | None:
        hold_if_armed(ChaosPhase.STARTING)
        if self.live_env.target is not None:  # may stand by: not a training group's report
            standby_record = LiveProgress(replica_groups=0, grad_accum_steps=1, standing_by=True)
            self.progress.update(force=True, live=standby_record)
        decision = take_a_place(
            self.info,
            self.live_env,
            self.board,
            self.stop,
            (self.store_host, self.store_port),
            self.incarnation,
        )
        if decision is None:
            return StandDown(128 + (self.stop.signum or signal.SIGTERM))
        if decision == "released":
            log.info("live: %s: training ended while this group stood by", STANDBY_RELEASED)
            return StandDown(ExitCode.OK, STANDBY_RELEASED)
        self.live = LiveState(model, optimizer, scheduler, state)
        self.pg = ProcessGroupNCCL() if self.info.device.type == "cuda" else QuickConnectGloo()
        self.transport = AdvertisedTransport(self.live_env.host, LIVE_TIMEOUT)
        self.manager = Manager(
            pg=self.pg,
            load_state_dict=self.live.load_state_dict,
            state_dict=self.live.state_dict,
            min_replica_size=LIVE_MIN_REPLICA_GROUPS,
            use_async_quorum=False,  # a joining group copies the state before it computes
            init_sync=False,  # a group with no peer ahead takes its starting state as all do
            timeout=LIVE_TIMEOUT,
            quorum_timeout=QUORUM_TIMEOUT,
            quorum_retries=QUORUM_RETRIES,
            rank=self.info.rank,
            world_size=self.info.world_size,
            store_addr=self.store_host,
            store_port=self.store_port,
            lighthouse_addr=self.live_env.lighthouse,
            replica_id=self.replica_id,
            hostname=self.live_env.host,
            checkpoint_transport=self.transport,
        )
        self.members = QuorumMembers.watch(self.manager, self.live_env.target)
        return None

    def join(self, ckpt: CheckpointManager, restore: Callable[[], bool]) -> None:
        """The first quorum: a group behind it copies the live state from a peer there; when
        no group of it is ahead of step 0 (the whole job starts or resumes), every group takes
        the same starting state from ``restore``. A group whose copy broke off (its peer lost
        while serving it) is behind a quorum that is ahead: it takes nothing from the volume
        and copies at the next quorum, or starts there if no group is ahead any more
        (:meth:`_start_if_none_ahead`). Reading claims nothing: the folder is the
        writer's alone (claimed as it becomes the writer); another group claiming it here
        could take it from the writer, whose next save would be fenced."""
        self.ckpt = ckpt
        self._take_quorum()
        self._decide_contribution()
        self._quorum_taken = True
        assert self.live is not None
        behind = self.live.copied_step is None and self.manager.current_step() == 0
        if behind and self._ahead() > 0:
            self._start = restore
            log.warning(
                "live: the copy of the live state from a peer at step %d broke off; this group "
                "takes no checkpoint (its peers are ahead), commits nothing, and copies again at "
                "the next quorum",
                self._ahead(),
            )
        elif behind:
            self._start_from(restore)
        self._note_peer_copy()
        self._arrange()

    def place(self) -> Place:
        return self._place

    def begin_step(self) -> Place:
        if self._quorum_taken:
            self._quorum_taken = False
            return self._place
        self._quorum_and_place()
        self._decide_contribution()
        return self._place

    def _decide_contribution(self) -> None:
        """After a step's quorum (not the quorums a broken step's reduction is tried in
        again, where a group sends what it sent before): see :func:`adds_gradients`."""
        assert self.transport is not None
        adds = adds_gradients(self.transport.source_finishing, self._votes_lost)
        if self.info.world_size > 1:  # the group's processes compute together or not at all
            agreed = torch.tensor([1.0 if adds else 0.0])
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=self.info.control_group)
            adds = bool(agreed.item())
        if not adds:
            log.info(
                "live: joined the quorum finishing step %d, which a lost group broke: this "
                "group adds no gradients to it (its peers computed theirs before the loss) "
                "and takes its update",
                self.manager.current_step() + 1,
            )
        self._adds_gradients = adds

    def _quorum_and_place(self, finishing: bool = False) -> None:
        self._take_quorum(finishing)
        self._note_peer_copy()
        self._start_if_none_ahead()
        self._arrange()

    def _start_if_none_ahead(self) -> None:
        """A group whose first copy broke off has no state of its own yet (not even its
        starting weights): once it has copied one, nothing is left to do; in a quorum whose
        groups are all at step 0 (the peer it copied from was the last one ahead), it takes
        its starting state as a job that starts does."""
        if self._start is None:
            return
        assert self.live is not None
        copied = self.live.copied_step is not None
        if not copied and (self._ahead() > 0 or self.manager.current_step() > 0):
            return
        restore, self._start = self._start, None
        if not copied:
            self._start_from(restore)

    def _ahead(self) -> int:
        """The step of the last quorum's groups furthest ahead (0: every one starts)."""
        return self.members.max_step if self.members is not None else 0

    def _start_from(self, restore: Callable[[], bool]) -> None:
        """Take the starting state a job that starts takes: the newest checkpoint (the
        Manager told its step), else the weights or the initialisation ``restore`` applies."""
        assert self.live is not None
        if restore():
            state = self.live.state
            self.manager.load_state_dict({"step": state.step, "batches_committed": state.step})
            log.info("live: no live peer ahead; resumed from the checkpoint of step %d", state.step)

    def _take_quorum(self, finishing: bool = False) -> None:
        """``finishing``: the quorum finishes the step this group's last vote lost."""
        began = time.monotonic()
        if self._attempt_began is None:
            self._attempt_began = began
        if self.transport is not None:  # what a group that copies from this one reads
            self.transport.finishing = finishing
            self.transport.source_finishing = False
        with self.heartbeat.pausing("quorum"):  # a Lighthouse away is waited for, not a hang
            self.manager.start_quorum()  # a group behind the quorum copies the state here
        self._quorum = time.monotonic() - began

    def computes(self) -> bool:
        return self._adds_gradients

    def reduce(self, model: nn.Module, loss: torch.Tensor) -> None:
        if self._adds_gradients:
            hold_if_armed(ChaosPhase.REDUCING)
        self._params, self._loss = trainable(model), loss
        self._shapes = [local_shards(p.detach()) for p in self._params]
        self._reduce()

    def _reduce(self) -> None:
        assert self._loss is not None
        began = time.monotonic()
        grads = [None if p.grad is None else local_shards(p.grad) for p in self._params]
        message = cross_group.outgoing(self._shapes, grads, self._loss, self._adds_gradients)
        self._reduced = summed(self.manager, message)
        self._allreduce = time.monotonic() - began

    def step_loss(self, own: torch.Tensor) -> torch.Tensor:
        """The loss of the step just committed: the mean over the groups that computed it."""
        return self._step_loss if self._step_loss is not None else own

    def commit(self) -> bool:
        """The commit vote; a vote lost to a group that failed mid-step is taken again, up to
        :data:`REDUCTION_QUORUMS` times, after the same reduction in the next quorum: the
        survivors' gradients are still theirs (:func:`all_reduced`), so the step is finished
        among them with the quorum's global batch less the lost group's share, instead of
        being computed again. A group that finds the quorum ahead of it (a peer committed
        the step) copies that peer's state there, as a joiner does: its gradients belong to
        a step it has passed, so it computes the quorum's step afresh, in that quorum."""
        try:
            for attempt in range(REDUCTION_QUORUMS):
                if attempt > 0 and not self._reduced_in_next_quorum():
                    return False
                began = time.monotonic()
                assert self._reduced is not None
                if cross_group.contributors(self._reduced) == 0:  # the same sum in every group
                    self.manager.report_error(RuntimeError("no group computed the step"))
                if self.manager.should_commit():
                    self._vote = time.monotonic() - began
                    update = cross_group.average(self._reduced, self._shapes)
                    take_average(self._params, update)
                    self._step_loss = update.loss
                    self._votes_lost, self._adds_gradients = 0, True
                    if attempt > 0:
                        self._finished_among_survivors()
                    return True
                self._votes_lost += 1
                self._lost_vote(again=attempt + 1 < REDUCTION_QUORUMS)
            return False
        finally:
            self._params, self._shapes, self._loss, self._reduced = [], [], None, None

    def _lost_vote(self, again: bool) -> None:
        self._discarded(again)
        if isinstance(self.pg, QuickConnectGloo):  # NCCL's torchft aborts on error itself
            error = self.manager.errored()
            self.pg.close_after_error(getattr(error, "original_exception", error))

    def _reduced_in_next_quorum(self) -> bool:
        """The step's reduction again, in the next quorum; False when that quorum was ahead
        and this group copied its state: the quorum's step is then computed afresh."""
        step = self.manager.current_step()
        self._quorum_and_place(finishing=True)
        if self.manager.current_step() != step:
            self._quorum_taken = True  # the next attempt is this quorum's step
            self._adds_gradients = True  # computed afresh, by every group of the quorum
            log.info(
                "live: a peer committed step %d meanwhile; this group copied its state and "
                "computes step %d afresh (its own gradients were of a step passed)",
                self.manager.current_step(),
                self.manager.current_step() + 1,
            )
            return False
        self._reduce()
        return True

    def committed(self, state: TrainState) -> None:
        """Time the step from its first attempt (a discarded attempt and the wait for the
        next quorum included) and tell standbys how many groups train."""
        assert self._attempt_began is not None
        took = time.monotonic() - self._attempt_began
        self._attempt_began = None
        self._timed(took)
        if self.writer and self.info.is_main:
            groups = self.split[0] if self.split else 1
            self.board.post(groups, self.live_env.target, took)

    def publish(self) -> None:
        self.progress.update(force=True, world_size=self.record.replica_groups, live=self.record)

    def finish(self, state: TrainState) -> None:
        if self.writer and self.info.is_main:
            self.board.post(self.record.replica_groups, self.live_env.target, 0.0, finished=True)
        self.publish()
        longest = self.record.longest_step_seconds
        log.info(
            "live: finished at step %d; longest step after the first %s, %d quorum changes, "
            "%d discarded attempts",
            state.step,
            f"{longest:.2f} s" if longest is not None else "n/a",
            self.record.quorum_changes,
            self.record.discarded_steps,
        )

    def close(self) -> None:
        if self.manager is not None:
            self.manager.shutdown(wait=False)

    def _note_peer_copy(self) -> None:
        assert self.live is not None
        copied = self.live.copied_step
        if copied is None or copied == self.record.joined_from_peer_step:
            return
        self.record = self.record.model_copy(update={"joined_from_peer_step": copied})
        log.info(
            "live: joined from a live peer: copied the weights, optimizer and data position "
            "of step %d over the network; no checkpoint loaded, no step redone",
            copied,
        )

    def _arrange(self) -> None:
        """This step's place: the global batch is dealt out over every process of the
        quorum's groups (a group's processes hold consecutive data ranks); say so when the
        quorum changed."""
        groups = self.manager.num_participants()
        rank = self.manager.participating_rank()
        split = (groups, 0 if rank is None else rank)
        was_writer, self.writer = self.writer, rank == 0
        self.progress.enabled = self.writer and self.info.is_main
        if self.writer and not was_writer:
            assert self.ckpt is not None
            self.ckpt.claim()  # the writer may change between steps: the folder is its now
        processes = self.info.data_size
        self._place = Place(
            split[1] * processes + self.info.data_rank, groups * processes, self.writer
        )
        slots = self.members.slots if self.members is not None else []
        if slots != self.record.training_slots:
            self.record = self.record.model_copy(update={"training_slots": slots})
            if split == self.split:
                self.publish()
        if split == self.split:
            return
        before, self.split = self.split, split
        layout = Layout(self.spec.global_batch_size, self.spec.micro_batch_size, groups * processes)
        changes = self.record.quorum_changes + (before is not None and before[0] != groups)
        self.record = self.record.model_copy(
            update={
                "replica_groups": groups,
                "grad_accum_steps": layout.grad_accum_steps,
                "quorum_changes": changes,
            }
        )
        assert self.live is not None
        if before is None or before[0] == groups:
            log.info(
                "live: replica group %s, rank %d of %s",
                self.replica_id,
                split[1],
                describe_split(groups, layout),
            )
        else:
            log.warning(
                "live: the quorum changed from %d to %d replica groups at step %d: %s; "
                "no restart, no checkpoint reload",
                before[0],
                groups,
                self.live.state.step,
                describe_split(groups, layout),
            )
        self.publish()

    def _discarded(self, again: bool) -> None:
        self.record = self.record.model_copy(
            update={"discarded_steps": self.record.discarded_steps + 1}
        )
        assert self.live is not None
        log.warning(
            "live: step %d not committed (a replica group failed during it): %s",
            self.live.state.step + 1,
            "its reduction is done again among the next quorum's groups, with the gradients "
            "already computed, unless a peer committed it meanwhile"
            if again
            else "the step counter stays and the step is computed again with the next quorum",
        )

    def _finished_among_survivors(self) -> None:
        finished = self.record.steps_finished_among_survivors + 1
        self.record = self.record.model_copy(update={"steps_finished_among_survivors": finished})
        assert self.live is not None
        log.info(
            "live: step %d committed among %s without computing it again",
            self.live.state.step + 1,
            describe_groups(self.record.replica_groups),
        )

    def _timed(self, seconds: float) -> None:
        """One committed step's time (``seconds``) and its parts in torchft's quorum, the
        all-reduce and the commit vote, into the record."""
        self.steps_done += 1
        if self.steps_done == 1:
            return  # the first step pays for start-up: warm-up, the first quorum, a copy
        longest = max(self.record.longest_step_seconds or 0.0, round(seconds, 3))
        timed = self.record.step_time.plus(seconds, self._quorum, self._allreduce, self._vote)
        self.record = self.record.model_copy(
            update={"longest_step_seconds": longest, "step_time": timed}
        )
