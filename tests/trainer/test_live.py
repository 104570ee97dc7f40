"""The live-recovery trainer as one replica group against a real torchft Lighthouse: it
trains, writes the progress record with its live state and checkpoints to the volume, and a
whole-job restart (no live peer ahead) resumes from that volume. The two-group cases (a loss,
a join from a live peer) run in tests/local/test_live_recovery.py."""

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_tensorboard import scalars
from trainer_harness import spec_args

from torchkube.api.contract import ExitCode
from torchkube.api.trainer import TrainerSpec
from torchkube.trainer.llama import PRESETS, Llama
from torchkube.trainer.loader import LiveEnv, RunEnv, load_config
from torchkube.trainer.tensorboard import FOLDER
from torchkube.trainer.train import run
from torchkube.trainer.weights import save_pretrained

pytestmark = pytest.mark.slow


@pytest.fixture
def lighthouse() -> Iterator[LiveEnv]:
    """A real torchft Lighthouse, and replica group 0's side of the contract with it."""
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100)
    try:
        yield LiveEnv(lighthouse=server.address(), slot=0)
    finally:
        server.shutdown()


def live_run(folder: Path, lighthouse: LiveEnv, **run_env: object) -> RunEnv:
    return RunEnv(
        job_name="live", checkpoint_dir=folder, recovery="live", live=lighthouse, **run_env
    )  # type: ignore[arg-type]


def spec(steps: int) -> TrainerSpec:
    return TrainerSpec(
        model="tiny",
        device="cpu",
        steps=steps,
        micro_batch_size=2,
        global_batch_size=4,
        seq_len=32,
        warmup_steps=1,
        log_interval_steps=1,
    )


def test_one_group_trains_checkpoints_and_resumes_from_the_volume(
    lighthouse: LiveEnv, tmp_path: Path, trainer_log: pytest.LogCaptureFixture
) -> None:
    run_env = live_run(tmp_path, lighthouse, checkpoint_interval_steps=3)
    assert run(spec(6), run_env) == ExitCode.OK
    first = json.loads((tmp_path / "progress.json").read_text())
    assert first["step"] == 6 and first["finished"], first
    assert first["live"]["replicaGroups"] == 1 and first["live"]["gradAccumSteps"] == 2, first
    assert first["lastCheckpointStep"] == 6 and (tmp_path / "step-6").is_dir()
    assert "live: replica group live-00000, rank 0 of 1 replica group" in trainer_log.text

    assert run(spec(9), run_env) == ExitCode.OK
    second = json.loads((tmp_path / "progress.json").read_text())
    assert second["step"] == 9 and second["finished"], second
    assert "no live peer ahead; resumed from the checkpoint of step 6" in trainer_log.text


def test_a_live_group_starts_from_weights_path_as_restart_mode_does(
    lighthouse: LiveEnv, token_data: Path, tmp_path: Path
) -> None:
    """A model whose output head is scaled ×200 starts at a loss far above a random one's:
    the first step's loss says which weights the group started from."""
    folder = tmp_path / "weights"
    torch.manual_seed(1)
    model = Llama(replace(PRESETS["mistral-tiny"], vocab_size=320))
    with torch.no_grad():
        model.lm_head.weight.mul_(200)
    save_pretrained(model, folder)
    args = spec_args(
        token_data, model="mistral-tiny", weightsPath=str(folder), steps=1, warmupSteps=0
    )
    spec, _ = load_config([*args, "--logIntervalSteps=1"], {})
    first_loss = {}
    for recovery, run_env in (
        ("live", live_run(tmp_path / "live", lighthouse)),
        ("restart", RunEnv(job_name="restart", checkpoint_dir=tmp_path / "restart")),
    ):
        assert run(spec, run_env) == ExitCode.OK
        progress = json.loads((run_env.checkpoint_dir / "progress.json").read_text())  # type: ignore[operator]
        first_loss[recovery] = progress["loss"]
    assert first_loss["restart"] > 50, first_loss  # ln(320) ≈ 5.8 from random weights
    assert first_loss["live"] == pytest.approx(first_loss["restart"], rel=1e-4), first_loss


def test_eval_tensorboard_and_export_work_in_live_mode_as_in_restart_mode(
    lighthouse: LiveEnv, token_data: Path, tmp_path: Path, trainer_log: pytest.LogCaptureFixture
) -> None:
    """One loop for both modes: what restart mode does at its steps, live mode does too —
    evaluation, the writer group's TensorBoard scalars, the final Hugging Face export."""
    job = {
        "model": "mistral-tiny",
        "steps": 4,
        "warmupSteps": 0,
        "evalIntervalSteps": 2,
        "evalDataPath": str(token_data / "val.bin"),
        "tensorboard": True,
        "exportFormat": "hf",
        "logIntervalSteps": 2,
    }
    spec, _ = load_config(spec_args(token_data, **job), {})
    folder = tmp_path / "ckpt"
    assert run(spec, live_run(folder, lighthouse)) == ExitCode.OK
    assert trainer_log.text.count("| eval loss") == 2, trainer_log.text
    board = scalars(folder / FOLDER)
    assert sorted(board["train/loss"]) == [2, 4] and sorted(board["eval/loss"]) == [2, 4], board
    assert (folder / "hf-step-4" / "config.json").is_file()
