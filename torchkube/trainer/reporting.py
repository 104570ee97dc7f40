"""What the training loop reports: metrics on every rank, the progress line, and rank 0's
progress record (``progress.json`` and ``GET /progress``) for the operator."""

import logging
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from torchkube.api.contract import PROGRESS_FILE, ProgressReport, RankTiming
from torchkube.api.times import rfc3339
from torchkube.api.trainer import TrainerSpec
from torchkube.trainer import stragglers
from torchkube.trainer.checkpoint import CheckpointManager, TrainState
from torchkube.trainer.data import Layout
from torchkube.trainer.distributed import DistInfo, gather_across_ranks
from torchkube.trainer.files import write_json_atomic
from torchkube.trainer.flops import peak_flops
from torchkube.trainer.loader import RunEnv
from torchkube.trainer.metrics import TrainMetrics
from torchkube.trainer.parallel import matmul_precision
from torchkube.trainer.tensorboard import EventWriter
from torchkube.trainer.timing import StepTimer

log = logging.getLogger("torchkube.trainer")


class ProgressReporter:
    """Rank 0's progress record: ``<checkpoint_dir>/progress.json`` and ``GET /progress``.

    Written at every log step and at least every ``min_interval`` seconds when anything
    changed, atomically, so the operator can poll it from the volume or over HTTP.
    """

    def __init__(self, folder: Path | None, enabled: bool, min_interval: float = 5.0):
        self.path = folder / PROGRESS_FILE if folder is not None else None
        self.enabled = enabled
        self.min_interval = min_interval
        self._report = ProgressReport()
        self._written = 0.0
        self._lock = threading.Lock()

    @property
    def record(self) -> dict[str, Any]:
        """The report in its wire form (the contract's :class:`ProgressReport`)."""
        with self._lock:
            return self._report.to_wire()

    def update(self, force: bool = False, **fields: Any) -> None:
        """Merge ``fields`` (ProgressReport's field names) into the report; write it when
        forced or the interval has passed."""
        unknown = set(fields) - set(ProgressReport.model_fields)
        if unknown:
            raise TypeError(f"not ProgressReport fields: {sorted(unknown)}")
        now = time.time()
        with self._lock:
            self._report = self._report.model_copy(update={**fields, "updated": rfc3339(now)})
            record = self._report.to_wire()
        if not (self.enabled and self.path is not None):
            return
        if force or now - self._written >= self.min_interval:
            try:
                write_json_atomic(self.path, record)
                self._written = now
            except OSError as e:  # progress is advisory; never fail training over it
                log.warning("could not write %s: %s", self.path, e)


class Reporter:
    """Metrics on every rank, the progress line and ``progress.json`` on rank 0."""

    def __init__(
        self,
        spec: TrainerSpec,
        run_env: RunEnv,
        info: DistInfo,
        layout: Layout,
        metrics: TrainMetrics,
        progress: ProgressReporter,
        ckpt: CheckpointManager,
        flops_per_token: float | None,
        timer: StepTimer,
        where: list[tuple[str, str]],
    ):
        self.spec, self.info, self.layout = spec, info, layout
        self.where = where
        self.timer = timer
        self.metrics, self.progress, self.ckpt = metrics, progress, ckpt
        self.flops_per_token = flops_per_token
        name = torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else "cpu"
        precision = matmul_precision(spec, info.device, torch.get_float32_matmul_precision())
        self.peak = peak_flops(name, precision)
        self.elastic_restarts = run_env.elastic_restart_count
        self._window_start = time.monotonic()
        self._window_steps = self._timed_steps = 0
        self._step_time = self._data_wait = 0.0
        self._collective_wait: float | None = None
        self._data_wait_total = 0.0
        self._lr = 0.0
        self.slowest: RankTiming | None = None
        self.tokens_per_second = 0.0
        self._published_checkpoint = ckpt.last_step
        self.board: EventWriter | None = None  # rank 0's TensorBoard scalars, when asked

    def _record(self, state: TrainState) -> dict[str, Any]:
        """The fields of the operator's progress report (the contract's ProgressReport)."""
        return {
            "step": state.step,
            "total_steps": self.spec.steps,
            "loss": state.loss,
            "tokens_per_second": round(self.tokens_per_second, 1),
            "world_size": self.info.world_size,
            "last_checkpoint_step": self.ckpt.last_step,
            "last_checkpoint_time": rfc3339(self.ckpt.last_time) if self.ckpt.last_time else None,
            "resumes": state.resumes,
            "checkpoint_blocking_seconds": round(self.ckpt.blocked_seconds, 3),
            "data_wait_seconds": round(self._data_wait_total, 3),
            "slowest_rank": self.slowest,
            "finished": False,
        }

    def started(self, state: TrainState) -> None:
        m = self.metrics
        m.total_steps.set(self.spec.steps)
        m.step.set(state.step)
        m.world_size.set(self.info.world_size)
        m.data_parallel_size.set(self.info.data_size)
        m.tensor_parallel_size.set(self.info.tensor_size)
        m.grad_accum_steps.set(self.layout.grad_accum_steps)
        m.global_batch.set(self.layout.global_batch_size)
        m.restarts.inc(self.elastic_restarts)
        m.resumes.inc(state.resumes)
        m.mfu.set(float("nan"))
        self.progress.update(force=True, **self._record(state))

    def _timed(self, wait: bool = False) -> None:
        """Step times the timer has (on GPU: of the steps the GPU finished)."""
        for seconds in self.timer.finished(wait):
            self.metrics.step_duration.observe(seconds)
            self._step_time += seconds
            self._timed_steps += 1

    def step(self, state: TrainState, data_wait: float, lr: float, waited: float | None) -> None:
        """One step done; ``waited``: its time in collectives for the other ranks (None:
        not measured for this strategy and device)."""
        m = self.metrics
        m.step.set(state.step)
        m.last_step_time.set(time.time())
        if waited is not None:
            self._collective_wait = (self._collective_wait or 0.0) + waited
        self._timed()
        m.data_wait.inc(data_wait)
        if self.info.rank % self.info.tensor_size == 0:  # a tensor group's tokens count once
            m.tokens.inc(self.layout.samples(self.info.data_rank) * self.spec.seq_len)
        m.learning_rate.set(lr)
        self._window_steps += 1
        self._data_wait += data_wait
        self._data_wait_total += data_wait
        self._lr = lr
        self.progress.update(step=state.step)  # written when min_interval has passed

    def log(self, state: TrainState, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        """Collective (all ranks, same steps): average over ranks, then rank 0 reports."""
        norm = (
            float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
            if grad_norm is not None
            else float("nan")
        )
        n = max(1, self._window_steps)
        loss_value = loss.item()  # syncs with the GPU, so waiting for the step times is free
        self._timed(wait=True)
        own_step = self._step_time / max(1, self._timed_steps)
        own_wait = -1.0 if self._collective_wait is None else self._collective_wait / n
        ranks = gather_across_ranks(
            [loss_value, own_step, self._data_wait / n, own_wait], self.info.control_group
        )
        means = [statistics.fmean(rank[i] for rank in ranks) for i in range(3)]
        mean_loss, step_time, data_wait = means
        self._compare_ranks(ranks)
        elapsed = time.monotonic() - self._window_start
        state.loss = mean_loss
        self.tokens_per_second = self._window_steps * self.spec.tokens_per_step / max(elapsed, 1e-9)
        self._window_start, self._window_steps, self._timed_steps = time.monotonic(), 0, 0
        self._step_time = self._data_wait = 0.0
        self._collective_wait = None
        mfu = None
        if self.flops_per_token and self.peak:
            mfu = self.flops_per_token * self.tokens_per_second / (self.info.world_size * self.peak)
            self.metrics.mfu.set(mfu)
        self.metrics.loss.set(mean_loss)
        self.metrics.tokens_per_second.set(self.tokens_per_second)
        if self._writes_board():
            assert self.board is not None
            scalars = {
                "train/loss": mean_loss,
                "train/learning_rate": self._lr,
                "train/tokens_per_second": self.tokens_per_second,
            }
            if grad_norm is not None:
                scalars["train/grad_norm"] = norm
            if mfu is not None:
                scalars["train/mfu"] = mfu
            self.board.scalars(state.step, scalars)
        self.progress.update(force=True, **self._record(state))
        log.info(
            "step %d/%d | loss %.4f | lr %.2e | grad norm %.3f | %s tok/s | mfu %s | "
            "%.1f ms/step (data %.1f ms) | world %d%s × accum %d%s",
            state.step,
            self.spec.steps,
            mean_loss,
            self._lr,
            norm,
            f"{self.tokens_per_second:,.0f}",
            f"{mfu:.1%}" if mfu is not None else "n/a",
            step_time * 1e3,
            data_wait * 1e3,
            self.info.world_size,
            f" (data {self.info.data_size} × tensor {self.info.tensor_size})"
            if self.info.tensor_size > 1
            else "",
            self.layout.grad_accum_steps,
            f" | slowest rank {self.slowest.rank} ×{self.slowest.slowdown:.2f}"
            if self.slowest is not None
            else "",
        )

    def _compare_ranks(self, ranks: list[list[float]]) -> None:
        """Each rank's compute time per step (its step less its wait in collectives) into the
        metrics, and the slowest rank into the report; a wait of -1 means not measured."""
        own_step, own_wait = ranks[self.info.rank][1], ranks[self.info.rank][3]
        if own_wait < 0:
            self.slowest = None
            return
        self.metrics.step_wait.set(own_wait)
        self.metrics.step_compute.set(max(0.0, own_step - own_wait))
        compute = [max(0.0, step - wait) for _, step, _, wait in ranks]
        self.slowest = stragglers.slowest(compute, self.where)
        if self.slowest is not None and self.info.is_main:
            self.metrics.slowest_rank.set(self.slowest.rank)
            self.metrics.slowest_slowdown.set(self.slowest.slowdown)

    def _writes_board(self) -> bool:
        """The scalars go where the progress record goes: under live recovery, the writer
        group's alone (every group computes the same loss; one curve, not one per group)."""
        return self.board is not None and self.progress.enabled

    def eval(self, state: TrainState, loss: float) -> None:
        self.metrics.eval_loss.set(loss)
        if self._writes_board():
            assert self.board is not None
            self.board.scalars(state.step, {"eval/loss": loss})
        log.info("step %d | eval loss %.4f", state.step, loss)

    def checkpointed(self) -> None:
        """Publish a newly committed checkpoint at once (the operator's recovery point)."""
        if self.ckpt.last_step == self._published_checkpoint:
            return
        self._published_checkpoint = self.ckpt.last_step
        self.progress.update(
            force=True,
            last_checkpoint_step=self.ckpt.last_step,
            last_checkpoint_time=rfc3339(self.ckpt.last_time) if self.ckpt.last_time else None,
        )

    def finished(self, state: TrainState) -> None:
        self.progress.update(force=True, **{**self._record(state), "finished": True})
        log.info(
            "finished: %d steps, final loss %s",
            state.step,
            "n/a" if state.loss is None else f"{state.loss:.4f}",
        )
