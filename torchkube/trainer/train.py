"""The training loop, top to bottom: setup, resume, loop (step, log, eval, save), teardown.

Everything that is not the loop's shape lives in a helper module: process groups in
``distributed``, strategies in ``parallel``, data order in ``data``, checkpoints in
``checkpoint``, what it reports (metrics, progress) in ``reporting``.
"""

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import Dataset

from torchkube.api.contract import ExitCode, training_finished_message
from torchkube.api.trainer import TrainerSpec
from torchkube.elastic.heartbeat import Heartbeat
from torchkube.trainer import distributed, stragglers, tensorboard
from torchkube.trainer.chaos import ChaosHold
from torchkube.trainer.checkpoint import STEP_PREFIX, CheckpointManager, FencedError, TrainState
from torchkube.trainer.data import Layout, StepLoader, eval_batches
from torchkube.trainer.distributed import (
    DistInfo,
    StepAgreement,
    StopRequest,
    mean_across_ranks,
)
from torchkube.trainer.export import export_hf
from torchkube.trainer.loader import ConfigError, RunEnv
from torchkube.trainer.metrics import TrainMetrics
from torchkube.trainer.parallel import (
    autocast,
    build_optimizer,
    gradient_sync,
    lr_lambda,
    parallelize,
    shards_parameters,
)
from torchkube.trainer.permanent_error import report_permanent_error
from torchkube.trainer.recovery import recovery_for
from torchkube.trainer.reporting import ProgressReporter, Reporter
from torchkube.trainer.server import start_metrics_server
from torchkube.trainer.tensorboard import EventWriter
from torchkube.trainer.timing import step_timer
from torchkube.trainer.workload import Workload, builtin_workload

log = logging.getLogger("torchkube.trainer")


def train(spec: TrainerSpec, run_env: RunEnv, workload: Workload | None = None) -> int:
    """Train to ``spec.steps`` under the current process group; returns the exit code."""
    workload = workload or builtin_workload(spec)
    info = distributed.setup(spec)
    stop = StopRequest()
    metrics = TrainMetrics(run_env.job_name, info.rank)
    progress = ProgressReporter(run_env.checkpoint_dir, enabled=info.is_main)
    server = (
        start_metrics_server(run_env.metrics_port, metrics.registry, progress)
        if info.local_rank == 0
        else None
    )
    heartbeat = Heartbeat.from_env(spec.collective_timeout_seconds)
    chaos = ChaosHold.from_env()
    recovery = recovery_for(spec, run_env, info, progress, stop, heartbeat)
    board = open_board(spec, run_env, info)
    try:
        # --- setup: the same seed on every rank gives every rank the same initial weights;
        # then each rank draws (dropout) from a stream of its own, seed + rank, as nanoGPT does
        configure_determinism(spec)
        torch.manual_seed(spec.seed)
        # a sharded model whose weights can be filled in shard by shard: built on meta, so
        # that no rank ever holds all of it
        fillable = workload.load_weights or workload.init_weights
        on_meta = fillable is not None and shards_parameters(spec)
        with torch.device("meta" if on_meta else info.device):
            model = workload.build_model(spec)
        torch.manual_seed(spec.seed + info.rank)
        flops_per_token = workload.flops_per_token(model, spec)
        hf_config = workload.hf_config(model, spec) if workload.hf_config is not None else None
        model = parallelize(model, spec, info, workload.blocks(model), workload.tensor_plan)
        if on_meta:
            model.to_empty(device=info.device)  # uninitialised: a checkpoint or weights fill it
        probe = stragglers.attach(model)
        where = stragglers.places(info.control_group, run_env.pod_name, run_env.node_name)
        optimizer = build_optimizer(model, spec, info)
        scheduler = LambdaLR(optimizer, lr_lambda(spec))
        state = TrainState()
        dataset = workload.train_dataset(spec)
        ckpt = CheckpointManager.for_run(
            recovery.checkpoint_env(run_env),
            spec,
            info,
            model,
            optimizer,
            scheduler,
            state,
            metrics,
            dataset,
            hf_config,
        )
        stand_down = recovery.start(model, optimizer, scheduler, state)
        if stand_down is not None:
            if stand_down.message is not None:
                _write_termination_message(run_env, stand_down.message)
            return stand_down.code

        # --- resume: the newest loadable checkpoint (with its ranks' random streams), whatever
        # world size wrote it; else the starting weights (or a live peer's state)
        def restore() -> bool:
            if ckpt.load():
                state.resumes = ckpt.count_resume(state.resumes)
                if board is not None:
                    board.resumed(state.step)
                return True
            if workload.load_weights is not None:
                load_weights(workload, model, spec, info)
            elif on_meta:
                assert workload.init_weights is not None
                workload.init_weights(model, spec.seed)
            return False

        recovery.join(ckpt, restore)
        here = recovery.place()
        layout = plan_layout(spec, here.data_size, info, state)
        loader = StepLoader(dataset, spec.seed, layout, here.data_rank, info.device)
        eval_data = workload.eval_dataset(spec) if spec.eval_interval_steps else None
        timer = step_timer(info.device)
        report = Reporter(
            spec, run_env, info, layout, metrics, progress, ckpt, flops_per_token, timer, where
        )
        report.board = board
        report.started(state)
        agreement = StepAgreement(info.control_group, lambda: stop.requested)

        # --- loop
        heartbeat.training()
        while state.step < spec.steps:
            place = recovery.begin_step()
            if place != here:  # live: the quorum of replica groups changed
                here = place
                layout = plan_layout(spec, here.data_size, info, state)
                loader = StepLoader(dataset, spec.seed, layout, here.data_rank, info.device)
                report.layout = layout
            agreement.start(save=info.is_main and here.writer and ckpt.due(state.step + 1))
            timer.start()
            if recovery.computes():
                with chaos.computing(layout.samples(here.data_rank), layout.micro_batch_size):
                    loss, data_wait = accumulate(
                        model,
                        loader.micro_batches(state.consumed_samples),
                        layout.grad_accum_steps,
                        spec,
                        workload.loss_fn,
                    )
            else:
                loss, data_wait = torch.zeros((), device=info.device), 0.0
            recovery.reduce(model, loss)
            committed = recovery.commit()
            stop_now, save_now = agreement.result()
            if not committed:  # live: groups lost in every quorum tried; computed again
                optimizer.zero_grad(set_to_none=True)
                if not stop_now:
                    continue
            else:
                grad_norm = apply_update(model, optimizer, scheduler, spec)
                timer.stop()
                state.step += 1
                heartbeat.beat(state.step)
                state.consumed_samples += layout.global_batch_size
                recovery.committed(state)
                waited = probe.take() if probe is not None else None
                report.step(state, data_wait, float(scheduler.get_last_lr()[0]), waited)
                at_log = state.step % spec.log_interval_steps == 0
                if at_log or state.step == spec.steps or stop_now:
                    report.log(state, recovery.step_loss(loss), grad_norm)
                    recovery.publish()
                chaos.after(state.step)
                at_eval = eval_data is not None and state.step % spec.eval_interval_steps == 0
                if eval_data is not None and (at_eval or state.step == spec.steps):
                    with heartbeat.pausing("evaluation"):
                        report.eval(state, evaluate(model, eval_data, spec, info, workload.loss_fn))
            ckpt.poll()
            if recovery.place().writer:  # live: the writer group of the step's last quorum
                with heartbeat.pausing("checkpoint"):
                    if state.step == spec.steps:
                        ckpt.save(state.step, blocking=True)
                    elif stop_now:
                        ckpt.save_on_stop(state.step)
                    elif save_now:
                        ckpt.save(state.step)
                report.checkpointed()
            if stop_now:
                break

        # --- teardown
        ckpt.close()
        if state.step < spec.steps:
            log.warning(
                "stopped at step %d after the emergency checkpoint (step-%s)",
                state.step,
                ckpt.last_step if recovery.place().writer else "written by the writer group",
            )
            return 128 + (stop.signum or signal.SIGTERM)
        if spec.export_format == "hf" and info.is_main and recovery.place().writer:
            with heartbeat.pausing("export"):  # minutes for a large model: not a hang
                export_final(spec, run_env, ckpt.last_step)
        report.finished(state)
        recovery.finish(state)
        _write_termination_message(run_env, training_finished_message(state.step))
        return ExitCode.OK
    finally:
        stop.close()
        heartbeat.close()
        recovery.close()
        if board is not None:
            board.close()
        if server is not None:
            server.close()


def run(spec: TrainerSpec, run_env: RunEnv, workload: Workload | None = None) -> int:
    """:func:`train` with the exit-code contract: errors become one line and a code."""
    code: int = ExitCode.FAILURE
    try:
        code = train(spec, run_env, workload)
    except ConfigError as e:
        report_permanent_error(str(e), run_env)
        code = ExitCode.CONFIG_ERROR
    except FencedError as e:
        log.error("fenced off: %s", e)
        code = ExitCode.FENCED
    except Exception:
        log.exception("training failed")
    finally:
        distributed.teardown(after_error=code in (ExitCode.FAILURE, ExitCode.FENCED))
    return code


def open_board(spec: TrainerSpec, run_env: RunEnv, info: DistInfo) -> EventWriter | None:
    """Rank 0's TensorBoard event file under the checkpoint folder, when the spec asks."""
    if not spec.tensorboard or not info.is_main:
        return None
    if run_env.checkpoint_dir is None:
        log.warning("tensorboard: no checkpoint folder to write the event files under")
        return None
    return EventWriter(run_env.checkpoint_dir / tensorboard.FOLDER)


def export_final(spec: TrainerSpec, run_env: RunEnv, step: int | None) -> None:
    """Rank 0: the final checkpoint as a Hugging Face folder, ``hf-step-N`` beside it, with
    weightsPath's tokenizer; kept when a restart finds it written. An error fails the run, and
    the retry resumes from the final checkpoint and exports again."""
    if run_env.checkpoint_dir is None or step is None:
        log.warning("exportFormat hf: no checkpoint folder to export from and to")
        return
    out = run_env.checkpoint_dir / f"hf-step-{step}"
    if out.is_dir():
        log.info("the final checkpoint is already exported to %s", out)
        return
    tokenizer = Path(spec.weights_path) if spec.weights_path else None
    export_hf(run_env.checkpoint_dir / f"{STEP_PREFIX}{step}", out, tokenizer=tokenizer)


def load_weights(workload: Workload, model: nn.Module, spec: TrainerSpec, info: DistInfo) -> None:
    """The workload's starting weights; a folder that does not fit the model is permanent."""
    assert workload.load_weights is not None
    try:
        workload.load_weights(model, spec, info.checkpoint_group)
    except (ValueError, CheckpointException) as e:
        raise ConfigError(f"weightsPath: {str(e).strip().splitlines()[-1]}") from e


def configure_determinism(spec: TrainerSpec) -> None:
    """Deterministic kernels when asked (bitwise resumes on GPU); else allow TF32 matmuls."""
    if spec.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    else:
        torch.set_float32_matmul_precision("high")


def plan_layout(spec: TrainerSpec, ranks: int, info: DistInfo, state: TrainState) -> Layout:
    """Split the constant global batch over the step's ``ranks`` data-parallel ranks (the
    world, with no tensor parallelism; live: every process of the quorum's groups); say so
    when their number changed."""
    what = "world size" if info.tensor_size == 1 else "data-parallel size"
    layout = Layout(spec.global_batch_size, spec.micro_batch_size, ranks)
    accum = layout.grad_accum_steps
    if state.world_size and state.world_size != ranks:
        log.info(
            "%s changed %d → %d: gradient accumulation %d → %d micro-steps, "
            "global batch stays %d sequences",
            what,
            state.world_size,
            ranks,
            state.grad_accum_steps,
            accum,
            spec.global_batch_size,
        )
    if state.global_batch_size and state.global_batch_size != spec.global_batch_size:
        log.warning(
            "global batch changed by configuration: %d → %d sequences",
            state.global_batch_size,
            spec.global_batch_size,
        )
    log.info(
        "global batch %d sequences over %s %d: %s (%d tokens per step, strategy %s%s, device %s)",
        spec.global_batch_size,
        what,
        ranks,
        layout.describe(),
        spec.tokens_per_step,
        spec.strategy,
        f" × tensor {info.tensor_size}" if info.tensor_size > 1 else "",
        info.device,
    )
    idle = sum(layout.samples(r) < accum for r in range(ranks))
    if idle:
        log.warning(
            "%d of %d ranks hold fewer sequences than micro-steps and compute a weightless "
            "filler micro-batch to stay in step: a globalBatchSize that is a multiple of "
            "microBatchSize × %d avoids that waste",
            idle,
            ranks,
            ranks,
        )
    # TrainState.world_size is the layout's: data-parallel ranks
    state.world_size, state.grad_accum_steps = ranks, accum
    state.global_batch_size = spec.global_batch_size
    return layout


def accumulate(
    model: nn.Module,
    batches: Iterator[tuple[Any, float]],
    accum_steps: int,
    spec: TrainerSpec,
    loss_fn: Any,
) -> tuple[torch.Tensor, float]:
    """Forward and backward over this rank's micro-batches; the gradients are averaged over
    ranks in the last backward.

    Each micro-loss is multiplied by its micro-batch's weight (its share of the global batch
    times the world size, see ``data.MicroBatch``), so after the gradient averaging over ranks
    the update equals one over the whole global batch, however unevenly it is split.
    Returns this rank's weighted loss and the data wait.
    """
    device = next(model.parameters()).device
    total = torch.zeros((), device=device)
    data_wait = 0.0
    for micro_step in range(accum_steps):
        t = time.monotonic()
        batch, weight = next(batches)
        data_wait += time.monotonic() - t
        with gradient_sync(model, micro_step == accum_steps - 1):
            with autocast(spec, model, device):
                loss = loss_fn(model, batch) * weight
            loss.backward()
        total += loss.detach()
    return total, data_wait


def apply_update(
    model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LambdaLR, spec: TrainerSpec
) -> torch.Tensor | None:
    """Clip, step the optimizer and the schedule, drop the gradients; returns the gradient
    norm before clipping (None without clipping)."""
    grad_norm = (
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        if spec.grad_clip
        else None
    )
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


@torch.no_grad()
def evaluate(
    model: nn.Module, dataset: Dataset, spec: TrainerSpec, info: DistInfo, loss_fn: Any
) -> float:
    """Mean loss over the fixed evaluation set (the same samples at every world size)."""
    model.eval()
    weighted = 0.0
    for batch, weight in eval_batches(
        dataset,
        spec.micro_batch_size,
        spec.eval_batches,
        info.data_rank,
        info.data_size,
        info.device,
    ):
        with autocast(spec, model, info.device):
            weighted += loss_fn(model, batch).item() * weight
    model.train()
    return mean_across_ranks([weighted], info.control_group)[0]


def _write_termination_message(run_env: RunEnv, message: str) -> None:
    """Tell the operator, through the pod's termination message, that training really ended."""
    if run_env.termination_log is None:
        return
    with contextlib.suppress(OSError):
        run_env.termination_log.write_text(message + "\n")
