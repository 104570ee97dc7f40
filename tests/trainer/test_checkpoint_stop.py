"""The emergency checkpoint at a stop is decided by all ranks together (two processes, gloo).

Each rank polls its share of an async save on its own, so when SIGTERM lands one rank may have
committed the save another still holds as in flight. Deciding alone, the first would write
the current step while the second did not, and would then fail in the save's collectives when
the second exited. Rank 0 commits, and only once every rank's share is written: its view says
whether a write is still under way (finish it, write nothing more) or done (write the step
the stop came at, however late the other rank's poll would notice)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from trainer_harness import worker_env

from torchkube.local.ports import free_port

HERE = Path(__file__).parent

RANK = textwrap.dedent(
    """
    import os
    import sys
    from pathlib import Path

    from test_checkpoint import make_trainer

    from torchkube.api.trainer import TrainerSpec
    from torchkube.trainer import distributed

    info = distributed.setup(TrainerSpec(device="cpu", collective_timeout_seconds=30))
    trainer = make_trainer(info, Path(sys.argv[1]))
    trainer.train(1)
    trainer.ckpt.save(1)  # async
    if info.rank == int(sys.argv[2]):
        trainer.ckpt.wait()  # this rank is done with it; the other still holds it as in flight
    trainer.train(1)
    trainer.ckpt.save_on_stop(2)
    print(f"rank {info.rank}: last checkpoint step {trainer.ckpt.last_step}", flush=True)
    trainer.ckpt.close()
    distributed.teardown()
    os._exit(0)  # torch's native threads may abort the interpreter's finalisation (SIGABRT)
    """
)


@pytest.mark.parametrize(
    ("done_on_rank", "written"),
    [
        pytest.param(0, ["step-1", "step-2"], id="committed: the stop's step is written"),
        pytest.param(1, ["step-1"], id="rank 0 still in flight: it is finished, nothing more"),
    ],
)
def test_ranks_agree_on_the_emergency_checkpoint_when_one_is_done_with_the_save(
    done_on_rank: int, written: list[str], tmp_path: Path
) -> None:
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(tmp_path / "ckpt"), str(done_on_rank)],
            env=worker_env(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE="2",
                LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                # the trainer comes from the in-process tests' own builder
                PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output
    last = written[-1].removeprefix("step-")
    for rank, output in enumerate(outputs):
        assert f"rank {rank}: last checkpoint step {last}" in output, output
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == written
