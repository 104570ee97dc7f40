"""Live recovery (``failurePolicy.recovery: live``): each pod is one torchft replica group.

A pod's ``nprocPerNode`` processes are one group: DDP (or FSDP's reduce-scatter) averages
their gradients inside the pod (its own torchrun world), then each process averages the result
with the same local rank of the other groups through torchft's Manager.

With restart recovery the loss of one pod stops every worker, and training resumes from the
newest checkpoint: every step since it is computed twice. Here the data-parallel all-reduce
across pods goes through torchft's Manager instead (its fault-tolerant all-reduce), and every step
begins with a quorum of the replica groups alive, formed by torchft's Lighthouse
(``TORCHKUBE_LIGHTHOUSE``). So:

* a group that dies mid-step fails the step's all-reduce; the survivors do not commit that
  attempt (the step counter stays), and from the next quorum on they train without it;
* the global batch stays the spec's: it is dealt out over the groups of the current quorum
  (``data.Layout``), so fewer groups accumulate more micro-batches each;
* a group that starts while others train (the lost pod's replacement) is behind the quorum's
  step: torchft copies the live state (weights, optimizer, schedule, data position) to it from
  a healthy peer over HTTP before the step, and it trains from there. Only when no group is
  ahead (the whole job started, or resumed after a whole-job loss) is the newest checkpoint
  on the volume loaded, by every group alike.

Checkpoints to the volume still happen, for the losses live recovery cannot cover: the group
of quorum rank 0 (the lowest replica id alive) writes them, synchronously, at the committed
step. It claims the folder (``checkpoint.CheckpointManager.claim``) whenever it becomes that
writer, and only it writes the progress record, which carries :class:`LiveProgress`.

Strategy ``fsdp`` shards each group's state over the pod's processes: the gradients are
averaged shard by shard, and a joining group's process copies its shards from the process of
the same local rank (:func:`local_shards`, :func:`copy_into`) — the layouts are the same.

Not covered yet (refused at admission, ``spec._live_recovery_is_supported``): tensor
parallelism, ``zero1``, and ``hsdp`` (whose replicate dimension inside the pod torchft's
would duplicate).
"""

import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import _init_optim_state
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR
from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL
from torchft.checkpointing import HTTPTransport

from torchkube.api.contract import (
    LIVE_MIN_REPLICA_GROUPS,
    STANDBY_RELEASED,
    Env,
    ExitCode,
    LiveProgress,
    training_finished_message,
)
from torchkube.api.trainer import TrainerSpec
from torchkube.elastic.heartbeat import Heartbeat
from torchkube.trainer import distributed, standby
from torchkube.trainer.chaos import ChaosHold
from torchkube.trainer.checkpoint import CheckpointManager, TrainState
from torchkube.trainer.data import Layout, StepLoader
from torchkube.trainer.distributed import StopRequest
from torchkube.trainer.loader import ConfigError, RunEnv
from torchkube.trainer.metrics import TrainMetrics
from torchkube.trainer.parallel import build_optimizer, lr_lambda, parallelize
from torchkube.trainer.reporting import ProgressReporter, Reporter
from torchkube.trainer.server import start_metrics_server
from torchkube.trainer.timing import step_timer
from torchkube.trainer.train import (
    _write_termination_message,
    accumulate,
    apply_update,
    configure_determinism,
)
from torchkube.trainer.workload import Workload, builtin_workload

log = logging.getLogger("torchkube.trainer")

LIVE_TIMEOUT = timedelta(seconds=30)
"""How long an all-reduce, a commit vote or a state transfer may take before the group gives
up on the step. A SIGKILLed peer breaks gloo's connections at once; this bounds a hung one."""
QUORUM_TIMEOUT = timedelta(seconds=120)
"""How long a group waits for a quorum: the Lighthouse forms one as soon as the groups that
heartbeat have asked, so this only bounds a Lighthouse that is away."""


@dataclass(frozen=True)
class LiveEnv:
    """The pod's side of the live-recovery contract."""

    lighthouse: str
    replica_id: str
    """``<job>-<slot>``: torchft orders the quorum by it and reads the slot from its digits."""
    host: str
    """Where the other groups reach this one (its Manager and the state it serves to a joining
    group): the pod IP, as a pod's host name resolves nowhere; outside a pod the host name."""
    slot: int = 0
    target: int | None = None
    """Replica groups that train (``Env.REPLICA_GROUPS``); None: every group trains."""

    @classmethod
    def from_env(cls, job_name: str) -> "LiveEnv":
        lighthouse = os.environ.get(Env.LIGHTHOUSE, "")
        if not lighthouse:
            raise ConfigError(
                f"failurePolicy.recovery live needs a torchft Lighthouse ({Env.LIGHTHOUSE}): "
                "the operator and torchkube run start one beside the rendezvous store"
            )
        slot = int(os.environ.get(Env.REPLICA_INDEX, "0"))
        host = os.environ.get(Env.POD_IP) or socket.gethostname()
        groups = os.environ.get(Env.REPLICA_GROUPS)
        return cls(lighthouse, f"{job_name}-{slot}", host, slot, int(groups) if groups else None)


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
        return {
            "model": local_shards(self.model.state_dict()),
            "optimizer": local_shards(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict(),
            "train": self.state.state_dict(),
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Copied into the tensors in place, shard by shard; an optimizer that has not
        stepped yet gets its state first (zeros, from a step at learning rate 0)."""
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


class AdvertisedTransport(HTTPTransport):
    """torchft's HTTP state transfer, advertised at :attr:`LiveEnv.host` rather than at the
    host name, which torchft's own uses and which no other pod can resolve."""

    def __init__(self, host: str, timeout: timedelta) -> None:
        self.host = host  # before torchft's constructor, which may ask for the address
        super().__init__(timeout=timeout, num_chunks=0)

    def address(self) -> str:
        port = self._server.socket.getsockname()[1]
        return f"http://{self.host}:{port}/checkpoint/"


def replica_store() -> tuple[str, int, dist.TCPStore | None]:
    """The group's store for torchft's process groups: torchrun's (rank 0 serves it at
    MASTER_ADDR:MASTER_PORT), or one of our own outside torchrun."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return "127.0.0.1", store.port, store


def average_gradients(manager: Any, model: nn.Module) -> None:
    """Average the accumulated gradients over the quorum's groups, in one message, through
    the Manager: a peer lost during it fails the step's commit vote instead of the process.
    (torchft's DDP wrapper would overlap this with the backward pass, but its comm hook fails an
    assertion when the all-reduce errors, which is exactly the case that matters here.)"""
    grads = [local_shards(p.grad) for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    manager.allreduce(flat).wait()
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def take_a_place(
    info: distributed.DistInfo, live_env: LiveEnv, stop: StopRequest, host: str, port: int
) -> standby.Decision | None:
    """Whether this group trains now, after standing by if the quorum is whole
    (``standby.wait_for_a_place``). Rank 0 decides for the pod's processes and tells them
    through the group's own store, under this incarnation's key (torchrun may keep the store
    across an in-place restart)."""
    stopped = lambda: stop.requested  # noqa: E731
    board = standby.QuorumBoard.from_env()
    if info.world_size == 1:
        return standby.wait_for_a_place(board, live_env.slot, live_env.target, stopped)
    store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False)
    key = f"torchkube/standby/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if info.is_main:
        decision = standby.wait_for_a_place(board, live_env.slot, live_env.target, stopped)
        store.set(key, decision or "stopped")
        return decision
    while not store.check([key]):
        time.sleep(standby.POLL_SECONDS)
    told = store.get(key).decode()
    return None if told == "stopped" else cast(standby.Decision, told)


def describe_split(groups: int, layout: Layout) -> str:
    return (
        f"{groups} replica group{'s' if groups != 1 else ''}, {layout.describe()} "
        f"(global batch {layout.global_batch_size})"
    )


def unsupported(spec: TrainerSpec) -> list[str]:
    """What the restart-mode trainer does that this loop does not do yet: refused (exit 3)
    rather than quietly skipped."""
    found = []
    if spec.eval_interval_steps:
        found.append(f"evalIntervalSteps {spec.eval_interval_steps}")
    if spec.export_format is not None:
        found.append(f"exportFormat {spec.export_format}")
    if spec.tensorboard:
        found.append("tensorboard")
    return found


def train_live(spec: TrainerSpec, run_env: RunEnv, workload: Workload | None = None) -> int:
    """Train to ``spec.steps`` as one replica group of the job; returns the exit code."""
    missing = unsupported(spec)
    if missing:
        raise ConfigError(
            f"failurePolicy.recovery live does not support {', '.join(missing)} yet: turn "
            "them off or use recovery restart"
        )
    live_env = LiveEnv.from_env(run_env.job_name)
    workload = workload or builtin_workload(spec)
    info = distributed.setup(spec)  # this pod's own world: its processes, one group
    metrics = TrainMetrics(run_env.job_name, info.rank)
    progress = ProgressReporter(run_env.checkpoint_dir, enabled=False)
    server = (
        start_metrics_server(run_env.metrics_port, metrics.registry, progress)
        if info.local_rank == 0
        else None
    )
    heartbeat = Heartbeat.from_env(spec.collective_timeout_seconds)
    host, port, _own_store = replica_store()  # served while this function runs
    manager: Manager | None = None
    stop = StopRequest()
    try:
        configure_determinism(spec)
        torch.manual_seed(spec.seed)  # every group builds the same initial weights
        with torch.device(info.device):
            model = workload.build_model(spec)
        flops_per_token = workload.flops_per_token(model, spec)
        model = parallelize(model, spec, info, workload.blocks(model), workload.tensor_plan)
        optimizer = build_optimizer(model, spec, info)
        scheduler = LambdaLR(optimizer, lr_lambda(spec))
        state = TrainState()
        live = LiveState(model, optimizer, scheduler, state)
        place = take_a_place(info, live_env, stop, host, port)
        if place is None:
            return 128 + (stop.signum or signal.SIGTERM)
        if place == "released":
            log.info("live: %s: training ended while this group stood by", STANDBY_RELEASED)
            _write_termination_message(run_env, STANDBY_RELEASED)
            return ExitCode.OK
        pg = (
            ProcessGroupNCCL()
            if info.device.type == "cuda"
            else ProcessGroupGloo(timeout=LIVE_TIMEOUT)
        )
        manager = Manager(
            pg=pg,
            load_state_dict=live.load_state_dict,
            state_dict=live.state_dict,
            min_replica_size=LIVE_MIN_REPLICA_GROUPS,
            use_async_quorum=False,  # a joining group copies the state before it computes
            init_sync=False,  # the same seed already gives every group the same weights
            timeout=LIVE_TIMEOUT,
            quorum_timeout=QUORUM_TIMEOUT,
            rank=info.rank,
            world_size=info.world_size,
            store_addr=host,
            store_port=port,
            lighthouse_addr=live_env.lighthouse,
            replica_id=live_env.replica_id,
            hostname=live_env.host,
            checkpoint_transport=AdvertisedTransport(live_env.host, LIVE_TIMEOUT),
        )
        dataset = workload.train_dataset(spec)
        # synchronous saves: a save ends before the next quorum, so the writer can change
        # between two steps without two groups ever committing into the folder at once
        ckpt = CheckpointManager.for_run(
            replace(run_env, checkpoint_mode="sync"),
            spec,
            info,
            model,
            optimizer,
            scheduler,
            state,
            metrics,
            dataset,
            workload.hf_config(model, spec) if workload.hf_config is not None else None,
        )
        reporter = Reporter(
            spec,
            run_env,
            info,
            Layout(spec.global_batch_size, spec.micro_batch_size, info.world_size),
            metrics,
            progress,
            ckpt,
            flops_per_token,
            step_timer(info.device),
            [],  # no straggler measurement in live mode
        )
        reporter.started(state)
        loop = LiveLoop(
            spec, live_env, info, manager, model, live, ckpt, progress, workload, dataset, stop
        )
        signum = loop.run(reporter, heartbeat)
        if signum is not None:
            return 128 + signum
        _write_termination_message(run_env, training_finished_message(state.step))
        return ExitCode.OK
    finally:
        stop.close()
        heartbeat.close()
        if manager is not None:
            manager.shutdown(wait=False)
        if server is not None:
            server.close()


class LiveLoop:
    """The step loop of one replica group: quorum, accumulate, vote, update."""

    def __init__(
        self,
        spec: TrainerSpec,
        live_env: LiveEnv,
        info: distributed.DistInfo,
        manager: Any,
        model: nn.Module,
        live: LiveState,
        ckpt: CheckpointManager,
        progress: ProgressReporter,
        workload: Workload,
        dataset: Any,
        stop: StopRequest,
    ) -> None:
        self.spec, self.live_env, self.info, self.stop = spec, live_env, info, stop
        self.manager, self.model, self.live, self.ckpt = manager, model, live, ckpt
        self.progress, self.workload = progress, workload
        self.state = live.state
        self.split: tuple[int, int] | None = None  # (groups, this group's rank) of the layout
        self.layout = Layout(spec.global_batch_size, spec.micro_batch_size, info.world_size)
        self.loader: StepLoader | None = None
        self.dataset = dataset
        self.device = next(model.parameters()).device
        self.writer = False
        self.record = LiveProgress(replica_groups=0, grad_accum_steps=1)
        self.board = standby.QuorumBoard.from_env()
        """Where the writer group tells standbys how many groups train."""
        self.steps_done = 0

    def run(self, reporter: Reporter, heartbeat: Heartbeat) -> int | None:
        """Train to the last step; returns the signal that stopped it before, if one did."""
        chaos = ChaosHold.from_env()
        heartbeat.training()
        while self.state.step < self.spec.steps:
            if self.stop.signum is not None:
                self._stop_on_a_checkpoint(reporter, heartbeat)
                return self.stop.signum
            began = time.monotonic()
            self.manager.start_quorum()  # a group behind the quorum copies the state here
            quorum = time.monotonic() - began
            if self.steps_done == 0 and self.live.copied_step is None:
                self._resume_from_volume()
            self._note_peer_copy()
            self._arrange(reporter)
            reporter.timer.start()
            self.live.optimizer.zero_grad(set_to_none=True)  # a discarded attempt's gradients
            assert self.loader is not None
            loss, data_wait = accumulate(
                self.model,
                self.loader.micro_batches(self.state.consumed_samples),
                self.layout.grad_accum_steps,
                self.spec,
                self.workload.loss_fn,
            )
            reduce_began = time.monotonic()
            average_gradients(self.manager, self.model)
            allreduce = time.monotonic() - reduce_began
            reporter.timer.stop()
            vote_began = time.monotonic()
            if not self.manager.should_commit():
                self._discarded()
                continue
            commit = time.monotonic() - vote_began
            grad_norm = apply_update(
                self.model, self.live.optimizer, self.live.scheduler, self.spec
            )
            self.state.step = self.manager.current_step()
            self.state.consumed_samples += self.layout.global_batch_size
            heartbeat.beat(self.state.step)
            took = time.monotonic() - began
            self._timed(took, quorum, allreduce, commit)
            if self.writer and self.info.is_main:
                groups = self.split[0] if self.split else 1
                self.board.post(groups, self.live_env.target, took)
            reporter.step(self.state, data_wait, float(self.live.scheduler.get_last_lr()[0]), None)
            last = self.state.step == self.spec.steps
            if self.state.step % self.spec.log_interval_steps == 0 or last:
                reporter.log(self.state, loss, grad_norm)
                self._publish()
            chaos.after(self.state.step)
            if self.writer and (last or self.ckpt.due(self.state.step)):
                with heartbeat.pausing("checkpoint"):
                    self.ckpt.save(self.state.step, blocking=True)
                reporter.checkpointed()
        reporter.finished(self.state)  # written by the writer alone
        if self.writer and self.info.is_main:
            self.board.post(self.record.replica_groups, self.live_env.target, 0.0, finished=True)
        self._publish()
        log.info(
            "live: finished at step %d; longest step after the first %s, %d quorum changes, "
            "%d discarded attempts",
            self.state.step,
            f"{self.record.longest_step_seconds:.2f} s"
            if self.record.longest_step_seconds is not None
            else "n/a",
            self.record.quorum_changes,
            self.record.discarded_steps,
        )
        return None

    def _stop_on_a_checkpoint(self, reporter: Reporter, heartbeat: Heartbeat) -> None:
        """SIGTERM (a deletion, a suspension, a preemption) between two steps: the writer
        group saves the last committed step, so a job stopped whole resumes there. The other
        groups hold the same state and just leave; a group stopped alone (a scale-down) costs
        the writer nothing."""
        if self.writer and self.state.step > 0 and self.ckpt.last_step != self.state.step:
            with heartbeat.pausing("checkpoint"):
                self.ckpt.save_on_stop(self.state.step)
            reporter.checkpointed()
        log.warning(
            "live: stopped at step %d%s",
            self.state.step,
            f" after the emergency checkpoint (step-{self.ckpt.last_step})" if self.writer else "",
        )

    def _resume_from_volume(self) -> None:
        """No group of the quorum is ahead of step 0: the whole job (re)starts, and every
        group loads the newest checkpoint on the volume alike. Reading claims nothing: the
        folder is the writer's alone (claimed as it becomes the writer); another group
        claiming it here could take it from the writer, whose next save would be fenced."""
        if self.manager.current_step() != 0:
            return
        if self.ckpt.load():
            self.state.resumes = self.ckpt.count_resume(self.state.resumes)
            self.manager.load_state_dict(
                {"step": self.state.step, "batches_committed": self.state.step}
            )
            log.info(
                "live: no live peer ahead; resumed from the checkpoint of step %d", self.state.step
            )

    def _note_peer_copy(self) -> None:
        copied = self.live.copied_step
        if copied is None or copied == self.record.joined_from_peer_step:
            return
        self.record = self.record.model_copy(update={"joined_from_peer_step": copied})
        log.info(
            "live: joined from a live peer: copied the weights, optimizer and data position "
            "of step %d over the network; no checkpoint loaded, no step redone",
            copied,
        )

    def _arrange(self, reporter: Reporter) -> None:
        """Deal the global batch out over this step's quorum (over every process of its
        groups: a group's processes hold consecutive ranks); say so when it changed."""
        groups = self.manager.num_participants()
        rank = self.manager.participating_rank()
        split = (groups, 0 if rank is None else rank)
        was_writer, self.writer = self.writer, rank == 0
        self.progress.enabled = self.writer and self.info.is_main
        if self.writer and not was_writer:
            self.ckpt.claim()  # the writer may change between steps: the folder is its now
        if split == self.split:
            return
        before = self.split
        self.split = split
        processes = self.info.world_size
        self.layout = Layout(
            self.spec.global_batch_size, self.spec.micro_batch_size, groups * processes
        )
        rank_in_job = split[1] * processes + self.info.rank
        self.loader = StepLoader(
            self.dataset, self.spec.seed, self.layout, rank_in_job, self.device
        )
        reporter.layout = self.layout
        changes = self.record.quorum_changes + (before is not None and before[0] != groups)
        self.record = self.record.model_copy(
            update={
                "replica_groups": groups,
                "grad_accum_steps": self.layout.grad_accum_steps,
                "quorum_changes": changes,
            }
        )
        if before is None or before[0] == groups:
            log.info(
                "live: replica group %s, rank %d of %s",
                self.live_env.replica_id,
                split[1],
                describe_split(groups, self.layout),
            )
        else:
            log.warning(
                "live: the quorum changed from %d to %d replica groups at step %d: %s; "
                "no restart, no checkpoint reload",
                before[0],
                groups,
                self.state.step,
                describe_split(groups, self.layout),
            )
        self._publish(force=True)

    def _discarded(self) -> None:
        self.record = self.record.model_copy(
            update={"discarded_steps": self.record.discarded_steps + 1}
        )
        log.warning(
            "live: step %d not committed (a replica group failed during it): the step counter "
            "stays and the step is tried again with the next quorum",
            self.state.step + 1,
        )

    def _timed(self, seconds: float, quorum: float, allreduce: float, commit: float) -> None:
        """One committed step's time (``seconds``) and its parts in torchft's quorum, the
        all-reduce and the commit vote, into the record."""
        self.steps_done += 1
        if self.steps_done == 1:
            return  # the first step pays for start-up: warm-up, the first quorum, a copy
        longest = max(self.record.longest_step_seconds or 0.0, round(seconds, 3))
        timed = self.record.step_time.plus(seconds, quorum, allreduce, commit)
        self.record = self.record.model_copy(
            update={"longest_step_seconds": longest, "step_time": timed}
        )

    def _publish(self, force: bool = True) -> None:
        self.progress.update(force=force, world_size=self.record.replica_groups, live=self.record)
