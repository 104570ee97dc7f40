"""The training loop in this process (world size 1): progress, an emergency checkpoint on
SIGTERM that resumes bitwise, a user's own workload, and errors that end in exit code 3."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.utils.data import Dataset
from trainer_harness import assert_bitwise_equal, checkpoint_tensors, spec_args

from torchkube.api.contract import ExitCode
from torchkube.api.trainer import TrainerSpec
from torchkube.trainer import RunEnv, Workload, gpt_workload, load_config, run
from torchkube.trainer.llama import PRESETS as LLAMA_PRESETS
from torchkube.trainer.llama import Llama
from torchkube.trainer.weights import save_pretrained


def run_tiny(data: Path, ckpt: Path, workload: Workload | None = None, **overrides: object) -> int:
    spec, _ = load_config(spec_args(data, **overrides), {})
    return run(spec, RunEnv(checkpoint_dir=ckpt, checkpoint_interval_steps=10), workload)


def progress(ckpt: Path) -> dict:
    return json.loads((ckpt / "progress.json").read_text())


def test_trains_and_reports_progress(token_data: Path, tmp_path: Path) -> None:
    assert (
        run_tiny(
            token_data,
            tmp_path,
            steps=30,
            evalIntervalSteps=15,
            evalDataPath=token_data / "val.bin",
        )
        == ExitCode.OK
    )
    record = progress(tmp_path)
    assert record["finished"] is True and record["step"] == record["totalSteps"] == 30
    assert record["loss"] < 3.5  # from ln(320) ≈ 5.8 at initialisation
    assert record["lastCheckpointStep"] == 30 and record["worldSize"] == 1
    assert record["tokensPerSecond"] > 0 and record["resumes"] == 0
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-10", "step-20", "step-30"]
    # a finished job that starts again (a pod restarted after the last checkpoint) does
    # nothing, stays finished, and still reports the loss it finished with
    assert run_tiny(token_data, tmp_path, steps=30) == ExitCode.OK
    again = progress(tmp_path)
    assert again["finished"] is True and again["resumes"] == 1
    assert again["loss"] == record["loss"]


def at_micro_step(micro_step: int, act: Callable[[], None]) -> Workload:
    """The built-in workload, calling ``act`` in this process's ``micro_step``-th forward
    pass (4 micro-steps per step at world size 1)."""
    base = gpt_workload()
    calls = {"n": 0}

    def loss_then_act(model: nn.Module, batch: object) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == micro_step:
            act()
        return base.loss_fn(model, batch)

    return Workload(**{**base.__dict__, "loss_fn": loss_then_act})


def sigterm_during_step(step: int) -> Workload:
    """The built-in workload, with a SIGTERM to this process during ``step``."""
    return at_micro_step(step * 4, lambda: os.kill(os.getpid(), signal.SIGTERM))


def crash_at_micro_step(micro_step: int) -> Workload:
    """The built-in workload, raising in this process's ``micro_step``-th forward pass."""

    def crash() -> None:
        raise RuntimeError("a worker lost mid-step")

    return at_micro_step(micro_step, crash)


def test_every_round_that_resumed_is_counted(token_data: Path, tmp_path: Path) -> None:
    """A round that resumed from step-10 and failed before its next save leaves step-10 the
    newest checkpoint, whose own count says 0 resumes: the next round is the second resume."""
    assert run_tiny(token_data, tmp_path, steps=10) == ExitCode.OK
    assert run_tiny(token_data, tmp_path, crash_at_micro_step(2 * 4), steps=20) != ExitCode.OK
    assert progress(tmp_path)["resumes"] == 1 and progress(tmp_path)["step"] < 20
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-10"]
    assert run_tiny(token_data, tmp_path, steps=20) == ExitCode.OK
    assert progress(tmp_path)["resumes"] == 2 and progress(tmp_path)["step"] == 20


@pytest.fixture
def reference(token_data: Path, tmp_path: Path) -> Path:
    """An uninterrupted 25-step run with dropout (so random streams matter to a resume)."""
    folder = tmp_path / "reference"
    assert run_tiny(token_data, folder, steps=25, dropout=0.1) == ExitCode.OK
    return folder


def assert_resumes_to(reference: Path, token_data: Path, interrupted: Path) -> None:
    assert run_tiny(token_data, interrupted, steps=25, dropout=0.1) == ExitCode.OK
    assert progress(interrupted)["loss"] == progress(reference)["loss"]
    assert_bitwise_equal(
        checkpoint_tensors(interrupted / "step-25"), checkpoint_tensors(reference / "step-25")
    )


def test_sigterm_checkpoints_and_resumes_bitwise(
    reference: Path, token_data: Path, tmp_path: Path
) -> None:
    """SIGTERM during step 13 → a world of one stops right after it (several ranks agree on
    it in the next step) → step-13 is written, once → exit 143; the resumed run ends bit for
    bit where an uninterrupted one does, dropout included."""
    interrupted = tmp_path / "interrupted"
    code = run_tiny(token_data, interrupted, sigterm_during_step(13), steps=25, dropout=0.1)
    assert code == 128 + signal.SIGTERM
    assert sorted(p.name for p in interrupted.glob("step-*")) == ["step-10", "step-13"]
    assert progress(interrupted)["finished"] is False
    assert_resumes_to(reference, token_data, interrupted)


def test_sigterm_during_an_async_save_commits_it_and_writes_nothing_more(
    reference: Path, token_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grace period must hold one checkpoint write, not two: when the stop comes while
    step 10's async save is still being written, that save is committed and the process stops;
    step 11 is trained again after the restart."""
    writes = []
    write_data = FileSystemWriter.write_data

    def slow_write(self: FileSystemWriter, *args: object, **kwargs: object) -> object:
        writes.append(self.path.name)
        time.sleep(1.0)  # a slow volume: the write outlasts the next step
        return write_data(self, *args, **kwargs)

    monkeypatch.setattr(FileSystemWriter, "write_data", slow_write)
    interrupted = tmp_path / "interrupted"
    code = run_tiny(token_data, interrupted, sigterm_during_step(11), steps=25, dropout=0.1)
    assert code == 128 + signal.SIGTERM
    assert len(writes) == 1 and sorted(p.name for p in interrupted.glob("step-*")) == ["step-10"]
    record = progress(interrupted)
    assert (record["step"], record["lastCheckpointStep"], record["finished"]) == (11, 10, False)
    monkeypatch.undo()
    assert_resumes_to(reference, token_data, interrupted)


def test_resuming_onto_other_data_is_refused_unless_asked(token_data: Path, tmp_path: Path) -> None:
    """The checkpoint names the files it was trained on and their sizes; other data would
    silently change the sample order, so that takes allowDatasetChange."""
    assert run_tiny(token_data, tmp_path, steps=10) == ExitCode.OK
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.bin").write_bytes((token_data / "val.bin").read_bytes())
    assert run_tiny(other, tmp_path, steps=20) == ExitCode.CONFIG_ERROR
    error = progress(tmp_path)["error"]
    assert f"checkpoint {tmp_path}/step-10 was trained on train.bin" in error
    assert "set allowDatasetChange: true" in error
    assert run_tiny(other, tmp_path, steps=20, allowDatasetChange=True) == ExitCode.OK
    assert progress(tmp_path)["step"] == 20 and progress(tmp_path)["resumes"] == 1


class Regression(Dataset):
    """y = 3x − 1 with noise: a user's own data, nothing to do with tokens."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(512, 1, generator=gen)
        self.y = 3 * self.x - 1 + 0.01 * torch.randn(512, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def test_custom_model_dataset_and_loss(tmp_path: Path) -> None:
    def mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    workload = Workload(
        build_model=lambda spec: nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1)),
        train_dataset=lambda spec: Regression(),
        loss_fn=mse,
    )
    spec = TrainerSpec(
        device="cpu",
        steps=60,
        warmup_steps=0,
        micro_batch_size=16,
        global_batch_size=32,
        learning_rate=0.02,
        weight_decay=0.0,
        lr_schedule="constant",
        log_interval_steps=20,
    )
    assert run(spec, RunEnv(checkpoint_dir=tmp_path), workload) == ExitCode.OK
    assert progress(tmp_path)["loss"] < 0.2  # from ≈ 10 (the variance of y)
    assert (tmp_path / "step-60").is_dir()


def test_runtime_config_error_is_exit_3(token_data: Path, tmp_path: Path) -> None:
    # HSDP shard groups of 2 cannot be formed from one process: known only at run time
    code = run_tiny(token_data, tmp_path, steps=5, strategy="hsdp", hsdpShardSize=2)
    assert code == ExitCode.CONFIG_ERROR
    assert "hsdpShardSize (2) must divide the world size (1)" in progress(tmp_path)["error"]


def trainer_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchkube.trainer", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--data-path=/nonexistent/train.bin"],
            "dataPath: token file /nonexistent/train.bin does not exist",
        ),
        (
            ["--checkpoint-dir=/proc/version/ckpt"],
            "checkpoint directory /proc/version/ckpt is not writable",
        ),
        (
            ["--global-batch-size=10", "--micro-batch-size=4"],
            "globalBatchSize (10) must be a multiple of microBatchSize (4)",
        ),
        (["--strategy=pipeline"], "strategy: Input should be 'ddp', 'zero1', 'fsdp' or 'hsdp'"),
    ],
)
def test_bad_input_is_one_line_and_exit_3(
    token_data: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    data = [f"--data-path={token_data / 'train.bin'}"] if "--data-path" not in args[0] else []
    done = trainer_cli(*data, *args, "--warmup-steps=0", "--steps=5")
    assert done.returncode == ExitCode.CONFIG_ERROR
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert done.stderr.startswith("torchkube-trainer: error: ")


def test_the_trainer_refuses_weights_of_another_shape_with_exit_3(
    tmp_path: Path, token_data: Path
) -> None:
    """config.json says one shape, the tensors another: found when the tensors are read."""
    folder = tmp_path / "weights"
    torch.manual_seed(1)
    save_pretrained(Llama(replace(LLAMA_PRESETS["mistral-tiny"], vocab_size=320)), folder)
    config = (folder / "config.json").read_text()
    (folder / "config.json").write_text(config.replace("128", "256"))  # intermediate_size
    spec, _ = load_config(
        spec_args(
            token_data, model="mistral-tiny", weightsPath=str(folder), steps=2, warmupSteps=0
        ),
        {},
    )
    assert run(spec, RunEnv(checkpoint_dir=tmp_path / "ckpt")) == ExitCode.CONFIG_ERROR
    error = (tmp_path / "ckpt" / "progress.json").read_text()
    assert "weightsPath:" in error and "mlp.gate_proj.weight is [128, 64]" in error
