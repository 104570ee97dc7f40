"""The live-recovery trainer as one replica group against a real torchft Lighthouse: it
trains, writes the progress record with its live state and checkpoints to the volume, and a
whole-job restart (no live peer ahead) resumes from that volume. The two-group cases (a loss,
a join from a live peer) run in tests/local/test_live_recovery.py."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchkube.api.contract import Env, ExitCode
from torchkube.api.trainer import TrainerSpec
from torchkube.trainer.loader import RunEnv
from torchkube.trainer.train import run

pytestmark = pytest.mark.slow


@pytest.fixture
def lighthouse(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100)
    monkeypatch.setenv(Env.RECOVERY, "live")
    monkeypatch.setenv(Env.LIGHTHOUSE, server.address())
    monkeypatch.setenv(Env.REPLICA_INDEX, "0")
    try:
        yield server.address()
    finally:
        server.shutdown()


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
    lighthouse: str, tmp_path: Path, trainer_log: pytest.LogCaptureFixture
) -> None:
    run_env = RunEnv(job_name="live", checkpoint_dir=tmp_path, checkpoint_interval_steps=3)
    assert run(spec(6), run_env) == ExitCode.OK
    first = json.loads((tmp_path / "progress.json").read_text())
    assert first["step"] == 6 and first["finished"], first
    assert first["live"]["replicaGroups"] == 1 and first["live"]["gradAccumSteps"] == 2, first
    assert first["lastCheckpointStep"] == 6 and (tmp_path / "step-6").is_dir()
    assert "live: replica group live-0, rank 0 of 1 replica group" in trainer_log.text

    assert run(spec(9), run_env) == ExitCode.OK
    second = json.loads((tmp_path / "progress.json").read_text())
    assert second["step"] == 9 and second["finished"], second
    assert "no live peer ahead; resumed from the checkpoint of step 6" in trainer_log.text


def test_what_live_mode_does_not_do_yet_is_refused_not_skipped(
    lighthouse: str, tmp_path: Path
) -> None:
    run_env = RunEnv(job_name="live", checkpoint_dir=tmp_path)
    refused = spec(2).model_copy(update={"eval_interval_steps": 1, "tensorboard": True})
    assert run(refused, run_env) == ExitCode.CONFIG_ERROR
    error = json.loads((tmp_path / "progress.json").read_text())["error"]
    assert "does not support evalIntervalSteps 1, tensorboard yet" in error, error
