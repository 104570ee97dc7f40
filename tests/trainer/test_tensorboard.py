"""TensorBoard scalars written by the trainer itself, read back by TensorBoard's own event
reader (the oracle, a test-only dependency): the progress line's numbers at its steps, a
resumed run continuing the same series, and checksums TensorBoard accepts."""

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from trainer_harness import logged_losses, spec_args

from torchkube.api.contract import ExitCode
from torchkube.trainer import RunEnv, load_config, run
from torchkube.trainer.tensorboard import FOLDER, EventWriter, crc32c


def scalars(folder: Path) -> dict[str, dict[int, float]]:
    """Tag → step → value, as TensorBoard reads the folder (every event file in it)."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: {event.step: event.value for event in events.Scalars(tag)}
        for tag in events.Tags()["scalars"]
    }


def test_crc32c_is_castagnolis() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value


def test_the_progress_lines_numbers_are_tensorboard_scalars(
    token_data: Path, tmp_path: Path, trainer_log: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "ckpt"

    def train(steps: int) -> str:
        trainer_log.clear()
        job = {
            "steps": steps,
            "tensorboard": True,
            "evalIntervalSteps": 5,
            "evalDataPath": str(token_data / "val.bin"),
        }
        spec, _ = load_config(spec_args(token_data, **job), {})
        assert run(spec, RunEnv(checkpoint_dir=ckpt, checkpoint_interval_steps=5)) == ExitCode.OK
        return "\n".join(f"torchkube: {message}" for message in trainer_log.messages)

    first = logged_losses(train(10))
    resumed = logged_losses(train(15))  # from step 10: a second event file, one series
    board = scalars(ckpt / FOLDER)
    assert len(list((ckpt / FOLDER).glob("events.out.tfevents.*"))) == 2
    assert sorted(board["train/loss"]) == [5, 10, 15]
    for step, loss in {**first, **resumed}.items():
        assert board["train/loss"][step] == pytest.approx(loss, abs=5e-5)
    assert board["train/learning_rate"][15] == pytest.approx(3e-3)  # constant after warm-up
    assert all(value > 0 for value in board["train/tokens_per_second"].values())
    assert all(value > 0 for value in board["train/grad_norm"].values())
    assert sorted(board["eval/loss"]) == [5, 10, 15]
    assert "train/mfu" not in board  # no peak FLOP/s known for a CPU: the log says n/a too


def test_two_runs_of_one_process_write_a_file_each(tmp_path: Path) -> None:
    """A local runner or a test trains twice in one process, often within one second."""
    first, second = EventWriter(tmp_path), EventWriter(tmp_path)
    first.close()
    second.close()
    assert first.path != second.path


def test_steps_logged_past_the_checkpoint_a_run_resumed_from_are_dropped(tmp_path: Path) -> None:
    """A run logged steps 1–10 and crashed after its checkpoint at step 5; the resumed run
    computes 6–10 again. TensorBoard shows the resumed run's values, once each."""
    crashed = EventWriter(tmp_path)
    for step in range(1, 11):
        crashed.scalars(step, {"train/loss": 10.0 - step})
    crashed.close()
    resumed = EventWriter(tmp_path)
    resumed.resumed(5)
    for step in range(6, 11):
        resumed.scalars(step, {"train/loss": 100.0 + step})
    resumed.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    logged = [(event.step, event.value) for event in events.Scalars("train/loss")]
    assert logged == [(s, 10.0 - s) for s in range(1, 6)] + [(s, 100.0 + s) for s in range(6, 11)]
