"""Checkpoints on the shared volume with torch.distributed.checkpoint (torchtitan's manager).

Layout of the checkpoint folder::

    .owner.json              which rendezvous round may write here (fencing, below)
    resumes.json             how many rounds resumed from a checkpoint (below)
    progress.json            rank 0's progress record for the operator
    step-120/                a committed checkpoint: DCP files + COMPLETE.json
    .tmp-step-140-<round>/   a save in flight; never read
    hf-step-200/             the final checkpoint exported (export.py), and tensorboard/

What is saved: model and optimizer state keyed by parameter name (``state_dicts``: DDP, ZeRO-1,
FSDP2 and HSDP, with or without tensor parallelism, share one format, so a checkpoint loads
into any strategy, any world size and any tensor size — DCP reshards), the LR scheduler, the
train state (step, consumed samples, resumes, the batch layout) and each rank's RNG state.
Replicated state is written by one rank each.

Atomicity: every rank writes into ``.tmp-step-N-<round>``; DCP's final collective means that
when rank 0's save returns, all ranks' files are written and rank 0 has written DCP's
``.metadata``. Rank 0 then records the file sizes in ``COMPLETE.json`` and renames the folder
to ``step-N``. Loading only considers ``step-N`` folders with a marker whose sizes match, so a
half-written checkpoint is never picked up; broken ones are skipped with a warning naming them.

Async: ``dcp.async_save`` copies this rank's share of the state to host memory (the only
blocking part) and writes from a background thread, on a gloo process group of its own. One
save is in flight at a time.

Fencing: a save is collective over the current process group, so a process left over from an
earlier rendezvous round (say, behind a network partition) cannot complete one with the
current round. As a second line, rank 0 claims the folder at start-up by writing a fresh round
id to ``.owner.json`` and re-reads it before every commit: a stale rank 0 finds a newer round's
id and stops (exit code 4) instead of renaming its checkpoint into place.

Resumes: the train state's count is only the loaded checkpoint's lineage. A round that resumed
and failed before its next save leaves the same checkpoint newest, and the next round would
count that resume again; so rank 0 keeps the tally in ``resumes.json`` beside the checkpoints.
"""

import json
import logging
import os
import shutil
import socket
import time
import uuid
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.stateful import Stateful
from torch.optim.lr_scheduler import LambdaLR, LRScheduler
from torch.utils.data import Dataset

from torchkube.api.contract import ChaosPhase
from torchkube.api.times import rfc3339
from torchkube.api.trainer import TrainerSpec
from torchkube.trainer.chaos import hold_if_armed
from torchkube.trainer.data import dataset_identity, describe_dataset
from torchkube.trainer.distributed import DistInfo
from torchkube.trainer.files import write_json_atomic
from torchkube.trainer.loader import ConfigError, RunEnv
from torchkube.trainer.metrics import TrainMetrics
from torchkube.trainer.state_dicts import OPTIMIZER_KEY, state_dicts, tensor_bytes

log = logging.getLogger("torchkube.trainer")

# State keys: one per component, as torchtitan does.
MODEL = "model"
OPTIMIZER = OPTIMIZER_KEY
LR_SCHEDULER = "lr_scheduler"
TRAIN_STATE = "train"
RNG = "rng"

MARKER = "COMPLETE.json"
HF_CONFIG = "hfConfig"  # the marker's copy of the model's Hugging Face config.json
HYPERPARAMETERS = "hyperparameters"  # the marker's copy of what the spec set of the optimisation
_OPTIMISATION_FIELDS = {
    "learning_rate",
    "min_learning_rate_ratio",
    "lr_schedule",
    "warmup_steps",
    "steps",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
    "global_batch_size",
}


def hyperparameters(spec: TrainerSpec) -> dict[str, Any]:
    """What the spec sets of the optimisation, by the spec's field names: recorded with each
    checkpoint, since the optimizer state holds none of it (the spec is the truth on a
    resume) and a resumed run should say what changed."""
    return spec.model_dump(mode="json", by_alias=True, include=_OPTIMISATION_FIELDS)


def changed_hyperparameters(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``name old → new`` for each hyper-parameter the checkpoint recorded otherwise."""
    return [
        f"{name} {saved[name]} → {value}"
        for name, value in current.items()
        if name in saved and saved[name] != value
    ]


OWNER = ".owner.json"
RESUMES = "resumes.json"
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-"


class FencedError(RuntimeError):
    """A newer rendezvous round owns the checkpoint folder; this process must stop."""


@dataclass
class TrainState(Stateful):
    """Where training stands; everything else follows from it and the spec."""

    step: int = 0
    consumed_samples: int = 0  # the data position: samples of all ranks so far
    resumes: int = 0  # times this job resumed from a checkpoint
    world_size: int = 0  # layout at save time, to log a resize on resume
    grad_accum_steps: int = 0
    global_batch_size: int = 0
    # The loss last reported. Saved so that a process resumed from the final checkpoint,
    # which runs no step, still reports the loss training finished with.
    loss: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key, value in state_dict.items():
            setattr(self, key, value if key == "loss" else int(value))


@dataclass
class _Pending:
    step: int
    folder: Path
    future: Future
    started: float
    blocking: float


@dataclass
class Candidate:
    """A committed checkpoint folder whose marker checks out."""

    step: int
    path: Path
    marker: dict[str, Any] = field(default_factory=dict)


def step_folders(folder: Path) -> list[tuple[int, Path]]:
    """``step-N`` folders, newest first."""
    found = []
    for p in folder.glob(f"{STEP_PREFIX}*"):
        suffix = p.name.removeprefix(STEP_PREFIX)
        if p.is_dir() and suffix.isdigit():
            found.append((int(suffix), p))
    return sorted(found, reverse=True)


class Incomplete(ValueError):
    """A checkpoint folder that was read and found incomplete or corrupt: it can never load."""


class Unreadable(ValueError):
    """A checkpoint folder the volume would not let us read just now (an I/O error other than
    a missing file): perhaps good, so it is skipped, never deleted."""


def validate(path: Path) -> dict[str, Any]:
    """The marker of a committed checkpoint; :class:`Incomplete` or :class:`Unreadable` says
    why the folder cannot be used."""
    try:
        text = (path / MARKER).read_text()
    except FileNotFoundError:
        raise Incomplete("partial: no completion marker (the save never finished)") from None
    except OSError as e:
        raise Unreadable(f"{MARKER}: {e.strerror or e}") from e
    try:
        marker = json.loads(text)
        sizes: dict[str, int] = marker["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise Incomplete(f"corrupt completion marker: {e}") from e
    if ".metadata" not in sizes:
        raise Incomplete("corrupt: no DCP .metadata recorded")
    for name, size in sizes.items():
        try:
            actual = (path / name).stat().st_size
        except FileNotFoundError:
            raise Incomplete(f"corrupt: {name} is missing") from None
        except OSError as e:
            raise Unreadable(f"{name}: {e.strerror or e}") from e
        if actual != size:
            raise Incomplete(f"corrupt: {name} has {actual} bytes, expected {size}")
    return marker


def _rates(lrs: list[float]) -> str:
    """One rate, or the groups' rates when they differ."""
    return f"{lrs[0]:g}" if len(set(lrs)) == 1 else str([float(f"{lr:g}") for lr in lrs])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


class CheckpointManager:
    """``save(step)``, ``load() -> bool`` and keep-last-K for one job's checkpoint folder.

    All ranks call every method (DCP is collective); rank 0 alone lists, commits, purges and
    logs. With no folder configured every method is a no-op and ``load`` returns False.
    """

    def __init__(
        self,
        folder: Path | None,
        info: DistInfo,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: LRScheduler,
        train_state: TrainState,
        *,
        strategy: str,
        interval_steps: int,
        interval_seconds: float,
        keep: int,
        async_save: bool,
        metrics: TrainMetrics | None = None,
        data_identity: dict[str, Any] | None = None,
        allow_dataset_change: bool = False,
        hf_config: dict[str, Any] | None = None,
        hyperparameters: dict[str, Any] | None = None,
    ):
        self.folder, self.info = folder, info
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.train_state = train_state
        self.strategy = strategy
        self.interval_steps, self.interval_seconds, self.keep = (
            interval_steps,
            interval_seconds,
            keep,
        )
        self.async_save = async_save
        self.metrics = metrics
        self.data_identity = data_identity  # dataset_identity() of the training data
        self.allow_dataset_change = allow_dataset_change
        self.hf_config = hf_config  # recorded in each marker, for an export (export.py)
        self.hyperparameters = hyperparameters  # recorded in each marker, compared on a resume
        self.round = ""
        self.last_step: int | None = None
        self.blocked_seconds = 0.0
        """Wall time this process spent inside ``save()``: the training it held up."""
        self.last_time: float | None = None
        self._last_save_started = time.monotonic()
        self._pending: _Pending | None = None
        self._applied = False  # whether a load attempt reached the live model
        self.states = state_dicts(model, optimizer)
        self.staging_bytes: int | None = None  # this rank's async staging buffers, once known
        cuda = info.device.type == "cuda"
        # One stager for the whole run: it keeps its (pinned, on GPU) host buffers between
        # saves, so only the first save pays for allocating them.
        self._stager = (
            DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            )
            if folder is not None and async_save
            else None
        )

    @classmethod
    def for_run(
        cls,
        run_env: RunEnv,
        spec: TrainerSpec,
        info: DistInfo,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: LRScheduler,
        train_state: TrainState,
        metrics: TrainMetrics | None = None,
        dataset: Dataset | None = None,
        hf_config: dict[str, Any] | None = None,
    ) -> "CheckpointManager":
        """The manager the pod's environment and the spec ask for."""
        return cls(
            run_env.checkpoint_dir,
            info,
            model,
            optimizer,
            lr_scheduler,
            train_state,
            strategy=spec.strategy,
            interval_steps=run_env.checkpoint_interval_steps,
            interval_seconds=run_env.checkpoint_interval_seconds,
            keep=run_env.checkpoint_keep,
            async_save=run_env.checkpoint_mode == "async",
            metrics=metrics,
            data_identity=dataset_identity(dataset) if dataset is not None else None,
            allow_dataset_change=spec.allow_dataset_change,
            hf_config=hf_config,
            hyperparameters=hyperparameters(spec),
        )

    # --- start-up -----------------------------------------------------------------------

    def claim(self) -> None:
        """Become the folder's owner for this rendezvous round and clear failed saves."""
        if self.folder is None:
            return
        ids = [uuid.uuid4().hex[:12] if self.info.is_main else ""]
        dist.broadcast_object_list(ids, src=0, group=self.info.control_group)
        self.round = ids[0]
        if not self.info.is_main:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            self.folder / OWNER,
            {
                "round": self.round,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "worldSize": self.info.world_size,
                "since": rfc3339(time.time()),
            },
        )
        for leftover in sorted(self.folder.glob(f"{TMP_PREFIX}*")):
            log.warning("removing partial checkpoint %s left by an earlier run", leftover)
            shutil.rmtree(leftover, ignore_errors=True)

    def _candidates(self) -> list[Candidate]:
        """Rank 0: committed checkpoints that look intact, newest first; warns about the rest."""
        assert self.folder is not None
        out = []
        for step, path in step_folders(self.folder):
            try:
                out.append(Candidate(step, path, validate(path)))
            except ValueError as e:
                log.warning("skipping checkpoint %s: %s", path, e)
        return out

    def load(self) -> bool:
        """Resume from the newest loadable checkpoint; False when there is none.

        Each attempt loads into fresh buffers and only then into the model and optimizer, so
        a checkpoint that fails half-way (a truncated shard, say) leaves nothing behind and
        the next older one is tried.
        """
        if self.folder is None:
            return False
        listing = [self._candidates() if self.info.is_main else None]
        dist.broadcast_object_list(listing, src=0, group=self.info.control_group)
        candidates: list[Candidate] = listing[0] or []
        partly_applied = False
        for cand in candidates:
            self._check_dataset(cand)
            started = time.monotonic()
            self._applied = False
            error = ""
            try:
                self._load_from(cand.path)
            except Exception as e:
                error = str(e).splitlines()[0] if str(e) else type(e).__name__
                log.warning("cannot load checkpoint %s: %s", cand.path, error)
            # Loading can fail on one rank only (after DCP's collective part): agree, so that
            # every rank resumes from the same checkpoint or none does.
            flags = torch.tensor([int(bool(error)), int(self._applied)], dtype=torch.int32)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.info.control_group)
            if flags[0]:
                partly_applied |= bool(flags[1])
                if self.info.is_main:
                    log.warning(
                        "skipping checkpoint %s: it cannot be loaded on every rank", cand.path
                    )
                continue
            seconds = time.monotonic() - started
            self.last_step = cand.step
            self.last_time = cand.marker.get("time")
            if self.metrics is not None:
                self.metrics.checkpoint_load.set(seconds)
                self.metrics.last_checkpoint_step.set(cand.step)
                self.metrics.last_checkpoint_time.set(self.last_time or 0)
            tensor = cand.marker.get("tensor", 1)
            log.info(
                "resumed from %s (written at world size %s with %s%s) in %.2fs",
                cand.path,
                cand.marker.get("worldSize"),
                cand.marker.get("strategy"),
                f" × tensor {tensor}" if tensor > 1 else "",
                seconds,
            )
            changed = changed_hyperparameters(
                cand.marker.get(HYPERPARAMETERS) or {}, self.hyperparameters or {}
            )
            if changed and self.info.is_main:
                log.warning(
                    "the spec's hyper-parameters differ from the checkpoint's, training goes on "
                    "with the spec's: %s",
                    ", ".join(changed),
                )
            return True
        if partly_applied:
            raise RuntimeError(
                "a checkpoint was applied on some ranks and failed on others, and no older "
                "one loads: refusing to train on weights that differ between ranks"
            )
        if candidates:
            if self.info.is_main:
                log.warning("no checkpoint could be loaded; starting from scratch")
            self.states.discard_targets()
        return False

    def count_resume(self, saved: int) -> int:
        """This round's number among the rounds that resumed: one more than the tally beside
        the checkpoints or the loaded checkpoint's own count, whichever is higher (a folder
        copied without its tally still counts on)."""
        counts = [0]
        assert self.folder is not None
        tally = self.folder / RESUMES
        if self.info.is_main:
            try:
                before = int(json.loads(tally.read_text())["resumes"])
            except (OSError, ValueError, KeyError, TypeError):
                before = 0
            counts[0] = max(before, saved) + 1
        dist.broadcast_object_list(counts, src=0, group=self.info.control_group)
        if self.info.is_main:
            try:  # a counter must not cost the round: a full volume fails the next save anyway
                write_json_atomic(tally, {"resumes": counts[0], "since": rfc3339(time.time())})
            except OSError as error:
                log.warning("cannot keep the resume count in %s: %s", tally, error)
        return int(counts[0])

    def _check_dataset(self, cand: Candidate) -> None:
        """Refuse (permanently) to resume onto other training data unless the spec allows it:
        the sample order depends on the data, so the run would silently go another way."""
        saved = cand.marker.get("dataset")
        if saved is None or self.data_identity is None or saved == self.data_identity:
            return
        if self.allow_dataset_change:
            if self.info.is_main:
                log.warning(
                    "resuming %s on other data (allowDatasetChange): trained on %s, now %s",
                    cand.path,
                    describe_dataset(saved),
                    describe_dataset(self.data_identity),
                )
            return
        raise ConfigError(
            f"checkpoint {cand.path} was trained on {describe_dataset(saved)}, but the data now "
            f"is {describe_dataset(self.data_identity)}: point dataPath at the data the job was "
            "trained on, or set allowDatasetChange: true to go on training with the new data "
            "(the samples that follow are then those of the new data)"
        )

    def _load_from(self, path: Path) -> None:
        saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        model_sd, optim_state = self.states.targets(saved)
        state: dict[str, Any] = {
            MODEL: model_sd,
            OPTIMIZER: {"state": optim_state},
            LR_SCHEDULER: self.lr_scheduler.state_dict(),
            TRAIN_STATE: {  # a key a checkpoint of an older version lacks keeps its default
                key: value
                for key, value in TrainState().state_dict().items()
                if f"{TRAIN_STATE}.{key}" in saved
            },
        }
        rng_key = f"rank{self.info.rank}"
        if f"{RNG}.{rng_key}.cpu" in saved:  # absent for a rank the writing world did not have
            state[RNG] = {rng_key: _rng_state(self.info.device)}
        dcp.load(state, checkpoint_id=path, process_group=self.info.checkpoint_group)
        # Hyper-parameters come from the current spec, not the checkpoint: only the state
        # tensors are loaded, with the optimizer's own param groups.
        optim_sd = self.states.checked(state[OPTIMIZER]["state"])
        self._applied = True  # from here on the live model and optimizer change
        self.states.apply(state[MODEL], optim_sd)
        self._load_schedule(state[LR_SCHEDULER])
        self.train_state.load_state_dict(state[TRAIN_STATE])
        if RNG in state:
            torch.set_rng_state(state[RNG][rng_key]["cpu"])
            if "cuda" in state[RNG][rng_key]:
                torch.cuda.set_rng_state(state[RNG][rng_key]["cuda"], self.info.device)

    def _load_schedule(self, saved: dict[str, Any]) -> None:
        """The schedule's position from the checkpoint, everything else from the spec.

        A scheduler's state holds the learning rate it was built with (``base_lrs``) and the
        rate of its step (``_last_lr``, the base times the schedule's multiplier), both of
        which would outlive a change of ``learningRate``, ``warmupSteps``, ``steps`` or
        ``lrSchedule`` in the spec; so the spec's base is kept and the rate of the step the
        checkpoint reached computed again by the spec's schedule. An unchanged spec computes
        the saved rate exactly (the same product), so it resumes bit for bit."""
        spec_lrs = [float(lr) for lr in self.lr_scheduler.base_lrs]
        saved_lrs = [float(lr) for lr in saved.get("base_lrs", spec_lrs)]
        if saved_lrs != spec_lrs and self.info.is_main:
            log.warning(
                "learningRate %s differs from the checkpoint's %s: training goes on at the "
                "spec's from step %d",
                _rates(spec_lrs),
                _rates(saved_lrs),
                saved["last_epoch"],
            )
        self.lr_scheduler.load_state_dict({**saved, "base_lrs": spec_lrs})
        scheduler = self.lr_scheduler
        if isinstance(scheduler, LambdaLR):
            scheduler._last_lr = [
                base * multiplier(scheduler.last_epoch)
                for base, multiplier in zip(spec_lrs, scheduler.lr_lambdas, strict=True)
            ]
        for group, lr in zip(self.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
            group["lr"] = lr

    # --- saving -------------------------------------------------------------------------

    def _model_optim_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """This rank's part of the model and optimizer state: its share of what is replicated."""
        model_sd, optim_sd = self.states.save()
        if self.info.world_size == 1:
            return model_sd, optim_sd
        return self.states.replicated_share(
            model_sd, optim_sd, self.info.rank, self.info.world_size
        )

    def due(self, step: int) -> bool:
        """Whether the interval calls for a checkpoint after ``step`` (rank 0's view)."""
        if self.folder is None or step == self.last_step:
            return False
        if self.interval_steps and step % self.interval_steps == 0:
            return True
        elapsed = time.monotonic() - self._last_save_started
        return bool(self.interval_seconds) and elapsed >= self.interval_seconds

    def save(self, step: int, *, blocking: bool = False) -> None:
        """Checkpoint the current state as ``step``; ``blocking`` waits until it is committed.

        Everything spent in here — waiting for the previous save, staging, a synchronous write
        and its commit — is added to ``blocked_seconds``, the goodput's ``checkpoint`` share.
        """
        if self.folder is None:
            return
        entered = time.monotonic()
        try:
            self._save(step, blocking)
        finally:
            self.blocked_seconds += time.monotonic() - entered

    def save_on_stop(self, step: int) -> None:
        """The emergency checkpoint before stopping (SIGTERM): at most one write, so that it
        fits the grace period however the stop falls.

        A save still in flight is finished and committed, and nothing more is written: if it
        is of an older step, the steps since — those trained while it was being written — are
        trained again after the restart. With none in flight (or if it failed), the current
        step is written synchronously.

        The ranks decide together. Each polls its share of an async save on its own, so at
        the stop one rank may already have committed the save another is still writing; a
        rank that then wrote the current step alone would wait for ever in the save's
        collectives (or fail when the others exit). Whether a save is in flight is rank 0's
        view: it commits only once every rank's share is written, so a save it has
        committed is done everywhere, however late another rank's poll would notice.
        """
        if self.folder is None:
            return
        entered = time.monotonic()
        try:
            in_flight = self._pending.step if self._pending is not None else None
            self.wait()
            failed = in_flight is not None and self.last_step != in_flight
            committing = in_flight is not None and self.info.is_main
            flags = torch.tensor([int(committing), int(failed)], dtype=torch.int32)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.info.control_group)
            if flags[0] and not flags[1]:
                if self.last_step != step and self.info.is_main:
                    log.warning(
                        "stopping at step %d with the checkpoint of step %s, which was being "
                        "written: %d steps will be trained again after the restart",
                        step,
                        self.last_step,
                        step - (self.last_step or 0),
                    )
                return
            self._save(step, blocking=True)
        finally:
            self.blocked_seconds += time.monotonic() - entered

    def _save(self, step: int, blocking: bool) -> None:
        if self._pending is not None and self._pending.step == step:
            if blocking:
                self.wait()
            return
        self.wait()  # one save in flight at a time
        if step == self.last_step:
            return
        started = time.monotonic()
        self._last_save_started = started
        assert self.folder is not None  # save() returns early without one
        tmp = self.folder / f"{TMP_PREFIX}{STEP_PREFIX}{step}-{self.round}"
        model_sd, optim_sd = self._model_optim_state()
        state = {
            MODEL: model_sd,
            OPTIMIZER: optim_sd,
            LR_SCHEDULER: self.lr_scheduler.state_dict(),
            TRAIN_STATE: self.train_state.state_dict(),
            RNG: {f"rank{self.info.rank}": _rng_state(self.info.device)},
        }
        writer = dcp.FileSystemWriter(tmp, thread_count=2)
        group = self.info.checkpoint_group
        if self.async_save and not blocking:
            self._report_staging(state)
            future = dcp.async_save(
                state, storage_writer=writer, process_group=group, async_stager=self._stager
            )
            assert isinstance(future, Future)
        else:
            dcp.save(state, storage_writer=writer, process_group=group)
            future = Future()
            future.set_result(None)
        self._pending = _Pending(step, tmp, future, started, time.monotonic() - started)
        if blocking or not self.async_save:
            self.wait()

    def _report_staging(self, state: dict[str, Any]) -> None:
        """Once: the host memory the async staging buffers hold (kept between saves)."""
        if self.staging_bytes is not None:
            return
        self.staging_bytes = tensor_bytes(state)
        if self.metrics is not None:
            self.metrics.checkpoint_staging.set(self.staging_bytes)
        largest = torch.tensor([self.staging_bytes], dtype=torch.int64)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self.info.control_group)
        if self.info.is_main:
            log.info(
                "async checkpoints stage %.2f MiB of host memory per rank (the largest share; "
                "rank 0: %.2f MiB), kept between saves",
                int(largest) / 2**20,
                self.staging_bytes / 2**20,
            )

    def poll(self) -> None:
        """Commit a finished background save; cheap, call it every step."""
        if self._pending is not None and self._pending.future.done():
            self._finish(self._pending)

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed."""
        if self._pending is not None:
            self._finish(self._pending)

    def _finish(self, pending: _Pending) -> None:
        self._pending = None
        try:
            pending.future.result()
        except Exception as e:
            log.error("checkpoint of step %d failed, training goes on: %s", pending.step, e)
            if self.info.is_main:
                shutil.rmtree(pending.folder, ignore_errors=True)
            return
        duration = time.monotonic() - pending.started
        now = time.time()
        if self.info.is_main:
            self._commit(pending, now)
            log.info(
                "checkpoint step-%d committed: %.2fs in total, training blocked %.3fs",
                pending.step,
                duration,
                pending.blocking,
            )
        self.last_step, self.last_time = pending.step, now
        if self.metrics is not None:
            self.metrics.checkpoint_save.observe(duration)
            self.metrics.checkpoint_blocking.observe(pending.blocking)
            self.metrics.last_checkpoint_step.set(pending.step)
            self.metrics.last_checkpoint_time.set(now)

    def _commit(self, pending: _Pending, now: float) -> None:
        """Rank 0: marker, fence check, rename into place, purge old checkpoints."""
        assert self.folder is not None
        try:
            owner = json.loads((self.folder / OWNER).read_text()).get("round")
        except (OSError, ValueError):
            owner = None
        if owner != self.round:
            shutil.rmtree(pending.folder, ignore_errors=True)
            raise FencedError(
                f"{self.folder} is owned by rendezvous round {owner}, not this process's "
                f"round {self.round}: a newer trainer has taken over, not committing step "
                f"{pending.step}"
            )
        files = {p.name: p.stat().st_size for p in pending.folder.iterdir() if p.is_file()}
        marker = {
            "step": pending.step,
            "worldSize": self.info.world_size,
            "strategy": self.strategy,
            "tensor": self.info.tensor_size,
            "round": self.round,
            "time": now,
            "written": rfc3339(now),
            "dataset": self.data_identity,
            **({HF_CONFIG: self.hf_config} if self.hf_config is not None else {}),
            **({HYPERPARAMETERS: self.hyperparameters} if self.hyperparameters else {}),
            "files": files,
        }
        with open(pending.folder / MARKER, "w") as f:
            json.dump(marker, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        hold_if_armed(ChaosPhase.COMMITTING_CHECKPOINT)
        final = self.folder / f"{STEP_PREFIX}{pending.step}"
        if final.exists():  # an older, unusable copy of the same step (it was skipped on load)
            stale = self.folder / f"{TMP_PREFIX}replaced-{final.name}-{self.round}"
            os.rename(final, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.rename(pending.folder, final)
        _fsync_dir(self.folder)
        self._purge(pending.step)

    def _purge(self, step: int) -> None:
        """Rank 0: keep the newest ``keep`` checkpoints that validate, at or below ``step``.

        Only valid ones count, so a corrupt folder never pushes a good checkpoint out; a
        folder read and found incomplete at or below ``step`` is deleted (it can never load),
        one the volume would not let us read is kept and judged again at the next save.
        Folders above ``step`` belong to a timeline this run did not resume from (say, one
        that failed to load on some rank): they are neither counted nor deleted.
        """
        assert self.folder is not None
        kept = 0
        for folder_step, path in step_folders(self.folder):
            if folder_step > step:
                continue
            try:
                validate(path)
            except Unreadable as e:
                log.warning("cannot read checkpoint %s now (%s): keeping it", path, e)
                continue
            except Incomplete as e:
                log.warning("deleting unusable checkpoint %s: %s", path, e)
                shutil.rmtree(path, ignore_errors=True)
                continue
            kept += 1
            if kept > self.keep:
                shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        """Finish the save in flight and release the staging buffers."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
