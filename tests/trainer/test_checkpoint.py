"""CheckpointManager in one process (world size 1, gloo): exact round trips, async snapshots,
atomic commits, skipping partial/corrupt folders, keep-last-K, fencing, cross-strategy loads.
Multi-process resharding is covered by test_torchrun.py."""

import errno
import json
import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.optim.lr_scheduler import LambdaLR

from torchkube.api.trainer import TrainerSpec
from torchkube.trainer.checkpoint import (
    MARKER,
    OWNER,
    CheckpointManager,
    FencedError,
    TrainState,
    hyperparameters,
)
from torchkube.trainer.distributed import DistInfo
from torchkube.trainer.model import GPT, PRESETS, cross_entropy_loss
from torchkube.trainer.parallel import build_optimizer, lr_lambda, parallelize


@dataclass
class Trainer:
    """One trainer's worth of state, small enough to build per test."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    state: TrainState
    ckpt: CheckpointManager

    def train(self, steps: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            idx = torch.randint(0, 64, (2, 17), generator=gen)
            cross_entropy_loss(self.model(idx[:, :-1]), idx[:, 1:]).backward()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
            self.state.step += 1
            self.state.consumed_samples += 2

    def full_model(self) -> dict[str, torch.Tensor]:
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        return {k: v.detach().clone() for k, v in sd.items() if isinstance(v, torch.Tensor)}

    def optimizer_state(self) -> dict[str, torch.Tensor]:
        inner = getattr(self.optimizer, "optim", self.optimizer)
        return {
            f"{i}.{k}": v.clone() for i, s in enumerate(inner.state.values()) for k, v in s.items()
        }


def make_trainer(
    info: DistInfo,
    folder: Path | None,
    strategy: str = "ddp",
    *,
    keep: int = 3,
    interval_steps: int = 10,
    interval_seconds: float = 0.0,
    async_save: bool = True,
    activation_checkpointing: str = "none",
    learning_rate: float = 6e-4,
    **spec_fields: Any,
) -> Trainer:
    spec = TrainerSpec(
        model="tiny",
        device="cpu",
        seq_len=16,
        steps=100,
        learning_rate=learning_rate,
        strategy=strategy,
        activation_checkpointing=activation_checkpointing,  # type: ignore[arg-type]
        **{"warmup_steps": 10, **spec_fields},
    )
    torch.manual_seed(0)
    gpt = GPT(replace(PRESETS["tiny"], vocab_size=64, block_size=16))
    model = parallelize(gpt, spec, info, list(gpt.h))
    optimizer = build_optimizer(model, spec, info)
    scheduler = LambdaLR(optimizer, lr_lambda(spec))
    state = TrainState()
    ckpt = CheckpointManager(
        folder,
        info,
        model,
        optimizer,
        scheduler,
        state,
        strategy=strategy,
        interval_steps=interval_steps,
        interval_seconds=interval_seconds,
        keep=keep,
        async_save=async_save,
        hyperparameters=hyperparameters(spec),
    )
    ckpt.claim()
    return Trainer(model, optimizer, scheduler, state, ckpt)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_round_trip_is_exact(info: DistInfo, tmp_path: Path) -> None:
    trainer = make_trainer(info, tmp_path)
    trainer.train(7)
    trainer.ckpt.save(trainer.state.step)
    trainer.ckpt.wait()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-7"]
    marker = json.loads((tmp_path / "step-7" / MARKER).read_text())
    assert marker["step"] == 7 and marker["worldSize"] == 1 and ".metadata" in marker["files"]

    fresh = make_trainer(info, tmp_path)
    assert fresh.ckpt.load()
    assert_same(fresh.full_model(), trainer.full_model())
    assert_same(fresh.optimizer_state(), trainer.optimizer_state())
    assert fresh.state == trainer.state
    assert fresh.scheduler.last_epoch == 7
    assert [g["lr"] for g in fresh.optimizer.param_groups] == [
        g["lr"] for g in trainer.optimizer.param_groups
    ]
    # ... and both continue identically
    trainer.train(3, seed=1)
    fresh.train(3, seed=1)
    assert_same(fresh.full_model(), trainer.full_model())


def test_a_resume_trains_at_the_specs_learning_rate(
    info: DistInfo, tmp_path: Path, trainer_log: pytest.LogCaptureFixture
) -> None:
    """The spec is the truth for hyper-parameters: the schedule goes on from the checkpoint's
    step, scaled to the spec's learning rate, and the log says what changed."""
    trainer = make_trainer(info, tmp_path, learning_rate=6e-4)
    trainer.train(12)
    trainer.ckpt.save(trainer.state.step, blocking=True)
    fresh = make_trainer(info, tmp_path, learning_rate=3e-4)
    assert fresh.ckpt.load() and fresh.scheduler.last_epoch == 12
    assert fresh.scheduler.base_lrs == [3e-4, 3e-4]
    assert [g["lr"] for g in fresh.optimizer.param_groups] == pytest.approx(
        [g["lr"] / 2 for g in trainer.optimizer.param_groups], rel=1e-12
    )
    fresh.train(1)
    trainer.train(1)
    assert fresh.scheduler.get_last_lr() == pytest.approx(
        [lr / 2 for lr in trainer.scheduler.get_last_lr()], rel=1e-12
    )
    assert "learningRate 0.0003 differs from the checkpoint's 0.0006" in trainer_log.text


def test_a_resume_follows_the_specs_schedule_from_its_first_step(
    info: DistInfo, tmp_path: Path, trainer_log: pytest.LogCaptureFixture
) -> None:
    """A schedule changed in the spec (warm-up, decay length) is the one the resumed run
    trains its next step at, and the log names every hyper-parameter that changed."""
    trainer = make_trainer(info, tmp_path, warmup_steps=20)
    trainer.train(12)
    trainer.ckpt.save(trainer.state.step, blocking=True)
    fresh = make_trainer(info, tmp_path, warmup_steps=4, weight_decay=0.05)
    assert fresh.ckpt.load() and fresh.scheduler.last_epoch == 12
    at = lr_lambda(TrainerSpec(steps=100, warmup_steps=4, learning_rate=6e-4))(12)
    assert [g["lr"] for g in fresh.optimizer.param_groups] == [6e-4 * at, 6e-4 * at]
    assert "warmupSteps 20 → 4, weightDecay 0.1 → 0.05" in trainer_log.text


def test_async_save_is_a_snapshot_of_its_step(info: DistInfo, tmp_path: Path) -> None:
    trainer = make_trainer(info, tmp_path)
    trainer.train(5)
    at_save = trainer.full_model()
    trainer.ckpt.save(5)  # returns after staging; the write goes on in the background
    trainer.train(5, seed=2)  # keeps changing the parameters in place meanwhile
    trainer.ckpt.wait()
    fresh = make_trainer(info, tmp_path)
    assert fresh.ckpt.load() and fresh.state.step == 5
    assert_same(fresh.full_model(), at_save)


def test_partial_and_corrupt_checkpoints_are_skipped_by_name(
    info: DistInfo, tmp_path: Path, trainer_log: pytest.LogCaptureFixture
) -> None:
    trainer = make_trainer(info, tmp_path, async_save=False)
    for _ in range(3):
        trainer.train(2)
        trainer.ckpt.save(trainer.state.step)
    (tmp_path / "step-6" / MARKER).unlink()  # a save that never finished
    shard = next((tmp_path / "step-4").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-10])  # a truncated file
    shutil.copytree(tmp_path / "step-2", tmp_path / f".tmp-step-8-{'x' * 12}")  # in flight

    fresh = make_trainer(info, tmp_path)  # claim() clears the abandoned temp folder
    assert fresh.ckpt.load() and fresh.state.step == 2
    text = trainer_log.text
    assert f"removing partial checkpoint {tmp_path}/.tmp-step-8-" in text
    assert f"skipping checkpoint {tmp_path}/step-6: partial: no completion marker" in text
    assert f"skipping checkpoint {tmp_path}/step-4: corrupt: {shard.name} has" in text
    assert not list(tmp_path.glob(".tmp-*"))


def test_unreadable_checkpoint_falls_back_to_an_older_one(
    info: DistInfo, tmp_path: Path, trainer_log: pytest.LogCaptureFixture
) -> None:
    trainer = make_trainer(info, tmp_path, async_save=False)
    trainer.train(2)
    trainer.ckpt.save(2)
    trainer.train(2)
    trainer.ckpt.save(4)
    meta = tmp_path / "step-4" / ".metadata"
    meta.write_bytes(b"\0" * meta.stat().st_size)  # right size, garbage content
    fresh = make_trainer(info, tmp_path)
    assert fresh.ckpt.load() and fresh.state.step == 2
    assert f"skipping checkpoint {tmp_path}/step-4: it cannot be loaded" in trainer_log.text


def test_keeps_the_last_k(info: DistInfo, tmp_path: Path) -> None:
    trainer = make_trainer(info, tmp_path, keep=2)
    for _ in range(4):
        trainer.train(1)
        trainer.ckpt.save(trainer.state.step)
    trainer.ckpt.wait()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-3", "step-4"]
    assert trainer.ckpt.due(10) and not trainer.ckpt.due(11) and not trainer.ckpt.due(4)


def test_retention_counts_only_valid_checkpoints_up_to_the_current_step(
    info: DistInfo, tmp_path: Path, trainer_log: pytest.LogCaptureFixture
) -> None:
    """A corrupt folder never takes the place of a valid checkpoint, and one of a step beyond
    the current one (another timeline, e.g. one that failed to load) is not ours to judge."""
    trainer = make_trainer(info, tmp_path, keep=2, async_save=False)
    for _ in range(2):
        trainer.train(2)
        trainer.ckpt.save(trainer.state.step)
    for corrupt in ("step-5", "step-9"):
        shutil.copytree(tmp_path / "step-4", tmp_path / corrupt)
        shard = next((tmp_path / corrupt).glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:-10])
    trainer.train(2)
    trainer.ckpt.save(6)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-4", "step-6", "step-9"]
    assert f"deleting unusable checkpoint {tmp_path}/step-5: corrupt" in trainer_log.text
    fresh = make_trainer(info, tmp_path)
    assert fresh.ckpt.load() and fresh.state.step == 6


@pytest.mark.parametrize("flaky_file", [MARKER, ".distcp"])
def test_retention_deletes_only_what_it_read_and_found_incomplete(
    info: DistInfo,
    tmp_path: Path,
    trainer_log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    flaky_file: str,
) -> None:
    """A flaky volume (an I/O error on stat or read inside step-4) is not an incomplete
    checkpoint: it is neither deleted nor counted, and the next pass judges it again."""
    trainer = make_trainer(info, tmp_path, keep=2, async_save=False)
    for _ in range(2):
        trainer.train(2)
        trainer.ckpt.save(trainer.state.step)

    def flaky(real: Any) -> Any:
        def call(self: Path, *args: object, **kwargs: object) -> object:
            if self.parent.name == "step-4" and self.name.endswith(flaky_file):
                raise OSError(errno.EIO, "Input/output error", str(self))
            return real(self, *args, **kwargs)

        return call

    with monkeypatch.context() as patch:
        patch.setattr(Path, "stat", flaky(Path.stat))
        patch.setattr(Path, "read_text", flaky(Path.read_text))
        trainer.train(2)
        trainer.ckpt.save(trainer.state.step)
        assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-2", "step-4", "step-6"]
    assert f"cannot read checkpoint {tmp_path}/step-4" in trainer_log.text
    assert "deleting" not in trainer_log.text
    trainer.train(2)
    trainer.ckpt.save(trainer.state.step)  # readable again: counted, and the oldest goes
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-6", "step-8"]


def test_stop_commits_the_save_in_flight_of_the_same_step(
    info: DistInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop right after an async save of the same step commits that save: one write."""
    writes = []
    write_data = FileSystemWriter.write_data

    def counted(self: FileSystemWriter, *args: object, **kwargs: object) -> object:
        writes.append(self.path.name)
        return write_data(self, *args, **kwargs)

    monkeypatch.setattr(FileSystemWriter, "write_data", counted)
    trainer = make_trainer(info, tmp_path)
    trainer.train(3)
    trainer.ckpt.save(3)
    trainer.ckpt.save_on_stop(3)
    assert len(writes) == 1 and sorted(p.name for p in tmp_path.glob("step-*")) == ["step-3"]
    trainer.train(1)
    trainer.ckpt.save_on_stop(4)  # nothing in flight: the current step, written once
    assert len(writes) == 2 and trainer.ckpt.last_step == 4


def test_time_based_interval(info: DistInfo, tmp_path: Path) -> None:
    # A minute, and the clock wound forward by hand: a real wait of a fraction of a second
    # can be outlasted by staging a save on a loaded machine.
    trainer = make_trainer(info, tmp_path, interval_steps=0, interval_seconds=60)
    assert not trainer.ckpt.due(1)
    trainer.ckpt._last_save_started -= 61
    assert trainer.ckpt.due(1)
    trainer.train(1)
    trainer.ckpt.save(1)  # restarts the clock
    assert not trainer.ckpt.due(2)


def test_stale_process_is_fenced_off(info: DistInfo, tmp_path: Path) -> None:
    stale = make_trainer(info, tmp_path, async_save=False)
    newer = make_trainer(info, tmp_path)  # a later rendezvous round claims the folder
    assert json.loads((tmp_path / OWNER).read_text())["round"] == newer.ckpt.round
    stale.train(1)
    with pytest.raises(FencedError, match="a newer trainer has taken over"):
        stale.ckpt.save(1)
    assert not list(tmp_path.glob("step-*")) and not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize(("saved_by", "loaded_by"), [("ddp", "fsdp"), ("zero1", "ddp")])
def test_strategies_share_one_format(
    info: DistInfo, tmp_path: Path, saved_by: str, loaded_by: str
) -> None:
    trainer = make_trainer(info, tmp_path, strategy=saved_by, async_save=False)
    trainer.train(3)
    trainer.ckpt.save(3)
    other = make_trainer(info, tmp_path, strategy=loaded_by)
    assert other.ckpt.load()
    assert_same(other.full_model(), trainer.full_model())
    trainer.train(2, seed=5)
    other.train(2, seed=5)
    for k, v in trainer.full_model().items():
        torch.testing.assert_close(other.full_model()[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("strategy", "saved_with", "loaded_with"),
    [("fsdp", "full", "none"), ("ddp", "none", "selective")],
)
def test_activation_checkpointing_leaves_checkpoints_and_numbers_alone(
    info: DistInfo, tmp_path: Path, strategy: str, saved_with: str, loaded_with: str
) -> None:
    """The recomputation wrapper is not part of any parameter's name in a checkpoint, and
    recomputing gives the very numbers that were kept."""
    trainer = make_trainer(
        info, tmp_path, strategy, async_save=False, activation_checkpointing=saved_with
    )
    trainer.train(3)
    trainer.ckpt.save(3)
    other = make_trainer(info, tmp_path, strategy, activation_checkpointing=loaded_with)
    assert other.ckpt.load()
    assert_same(other.full_model(), trainer.full_model())
    trainer.train(2, seed=5)
    other.train(2, seed=5)
    assert_same(other.full_model(), trainer.full_model())


def test_disabled_without_a_folder(info: DistInfo) -> None:
    trainer = make_trainer(info, None)
    trainer.train(1)
    trainer.ckpt.save(1)
    assert not trainer.ckpt.load() and not trainer.ckpt.due(10) and trainer.ckpt.last_step is None


def test_no_warnings_on_first_start(
    info: DistInfo, tmp_path: Path, trainer_log: pytest.LogCaptureFixture
) -> None:
    assert not make_trainer(info, tmp_path).ckpt.load()
    assert not [r for r in trainer_log.records if r.levelno >= logging.WARNING]
