"""Real torchrun, 2 and 3 processes, gloo on CPU: every world size trains the same job, and
ZeRO-1 resumes at any of them.

The job: ZeRO-1, global batch 8, micro batch 2, ``seqLen`` 128 — at that length ZeRO's greedy
partition leaves a rank without any parameter of the no-decay group, which DCP's
``set_state_dict`` cannot load. 3 does not divide 8, so at 3 processes the ranks hold 3, 3 and
2 sequences of every step.

- 2 and 3 processes from scratch log the same losses and eval losses, step for step;
- each resumes its own step-10 checkpoint and ends where it did uninterrupted (bit for bit at 2
  processes, to rounding at 3);
- 3 processes resume the 2-process step-10 (ZeRO state resharded) and read the same next
  samples: their losses are those of the 2-process run;
- each rank draws from its own random stream; async checkpoints stage one share per rank.
"""

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from trainer_harness import (
    Torchrun,
    assert_bitwise_equal,
    checkpoint_mib,
    checkpoint_state,
    checkpoint_tensors,
    logged_losses,
    read_progress,
    spec_args,
    staged_mib,
)

pytestmark = pytest.mark.slow

STEPS = 20
START_TIMEOUT = 180  # torch imports take long on a busy 2-core machine
LOSS_TOLERANCE = 2e-4  # the progress line prints 4 decimals; sums in another order differ ~1e-7


def recipe(data: Path) -> list[str]:
    job = {
        "strategy": "zero1",
        "seqLen": 128,
        "microBatchSize": 2,
        "globalBatchSize": 8,
        "steps": STEPS,
        "logIntervalSteps": 1,
        "evalIntervalSteps": 10,
        "evalDataPath": str(data / "val.bin"),
        "evalBatches": 3,
    }
    return [*spec_args(data, **job), "--checkpoint-interval-steps=10"]


@dataclass
class Run:
    """One torchrun launch, ended: its exit code, its agent's output, its checkpoint folder."""

    code: int
    log: str
    ckpt: Path

    def finished(self) -> "Run":
        assert self.code == 0, self.log[-4000:]
        record = read_progress(self.ckpt)
        assert record["finished"] and record["step"] == STEPS, record
        return self


def launch(torchrun: Torchrun, nproc: int, data: Path, ckpt: Path, name: str) -> Run:
    started = torchrun.start(nproc, recipe(data), checkpoint_dir=ckpt, name=name)
    code = started.wait(START_TIMEOUT + 120)
    return Run(code, started.output(), ckpt)


@pytest.fixture(scope="module")
def from_scratch(token_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Run]:
    """The job at 2 and at 3 processes, each uninterrupted (ended, not necessarily well)."""
    folder = tmp_path_factory.mktemp("from-scratch")
    runner = Torchrun(folder)
    try:
        return {n: launch(runner, n, token_data, folder / f"w{n}", f"w{n}") for n in (2, 3)}
    finally:
        runner.close()


def resume(torchrun: Torchrun, run: Run, nproc: int, data: Path, folder: Path) -> Run:
    """``nproc`` processes started on a copy of ``run``'s step-10 checkpoint."""
    ckpt = folder / "ckpt"
    shutil.copytree(run.ckpt / "step-10", ckpt / "step-10")
    return launch(torchrun, nproc, data, ckpt, f"resume-w{nproc}")


def assert_same_losses(ours: dict[int, float], theirs: dict[int, float]) -> None:
    for step, loss in ours.items():
        assert loss == pytest.approx(theirs[step], abs=LOSS_TOLERANCE), f"step {step}"


def test_every_world_size_trains_on_the_same_global_batch(from_scratch: dict[int, Run]) -> None:
    two, three = from_scratch[2].finished(), from_scratch[3].finished()
    assert "2 ranks hold 3 sequences and 1 rank holds 2, in 2 micro-steps" in three.log
    losses = logged_losses(two.log)
    assert sorted(losses) == list(range(1, STEPS + 1)) == sorted(logged_losses(three.log))
    assert_same_losses(logged_losses(three.log), losses)
    final = read_progress(three.ckpt)["loss"]
    assert final == pytest.approx(read_progress(two.ckpt)["loss"], rel=1e-4)
    # the evaluation set is the same samples at every world size
    evals = logged_losses(two.log, "eval loss")
    assert sorted(evals) == [10, STEPS] == sorted(logged_losses(three.log, "eval loss"))
    assert_same_losses(logged_losses(three.log, "eval loss"), evals)
    assert checkpoint_tensors(three.ckpt / f"step-{STEPS}")["train.consumed_samples"] == 8 * STEPS


@pytest.mark.parametrize("nproc", [2, 3])
def test_zero1_resumes_its_own_checkpoint(
    from_scratch: dict[int, Run], nproc: int, token_data: Path, tmp_path: Path, torchrun: Torchrun
) -> None:
    """Bit for bit at 2 processes. From 3 on, gloo's ring all-reduce adds each gradient element
    in an order set by its offset in DDP's bucket, and DDP re-orders its bucket after the first
    step of every start, so the resumed run matches to rounding."""
    run = from_scratch[nproc].finished()
    resumed = resume(torchrun, run, nproc, token_data, tmp_path).finished()
    assert f"step-10 (written at world size {nproc} with zero1)" in resumed.log
    losses = logged_losses(resumed.log)
    assert sorted(losses) == list(range(11, STEPS + 1))
    assert_same_losses(losses, logged_losses(run.log))
    ours, theirs = read_progress(resumed.ckpt)["loss"], read_progress(run.ckpt)["loss"]
    if nproc == 2:
        assert ours == theirs
        assert_bitwise_equal(
            checkpoint_tensors(resumed.ckpt / f"step-{STEPS}"),
            checkpoint_tensors(run.ckpt / f"step-{STEPS}"),
        )
    else:
        assert ours == pytest.approx(theirs, rel=1e-5)


def test_three_processes_resume_a_two_process_zero1_checkpoint(
    from_scratch: dict[int, Run], token_data: Path, tmp_path: Path, torchrun: Torchrun
) -> None:
    two = from_scratch[2].finished()
    resumed = resume(torchrun, two, 3, token_data, tmp_path).finished()
    assert "step-10 (written at world size 2 with zero1)" in resumed.log
    assert "world size changed 2 → 3" in resumed.log
    losses = logged_losses(resumed.log)
    assert sorted(losses) == list(range(11, STEPS + 1))
    assert_same_losses(losses, logged_losses(two.log))  # the same samples, step for step
    final = checkpoint_state(resumed.ckpt / f"step-{STEPS}")
    assert final["train"]["consumed_samples"] == 8 * STEPS
    # every parameter's Adam state came through the resharding: none restarted at step 10
    assert {float(s["step"]) for s in final["optim"]["state"].values()} == {float(STEPS)}


def test_ranks_draw_from_their_own_random_streams(from_scratch: dict[int, Run]) -> None:
    """Seeded with seed + rank (as nanoGPT does): dropout masks differ between ranks."""
    rng = checkpoint_state(from_scratch[3].finished().ckpt / f"step-{STEPS}")["rng"]
    streams = [rng[f"rank{r}"]["cpu"] for r in range(3)]
    assert not any(torch.equal(streams[a], streams[b]) for a, b in ((0, 1), (0, 2), (1, 2)))


def test_async_checkpoints_stage_only_each_ranks_share(from_scratch: dict[int, Run]) -> None:
    """ZeRO-1's replicated parameters are staged by one rank each, like its optimizer state."""
    for nproc, run in from_scratch.items():
        share = checkpoint_mib(run.finished().ckpt / "step-10") / nproc
        assert staged_mib(run.log) <= 1.2 * share, f"{nproc} processes"
