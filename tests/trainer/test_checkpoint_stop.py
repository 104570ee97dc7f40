"""The emergency checkpoint at a stop is decided by all ranks together (two processes, gloo).

Each rank polls its share of an async save on its own, so when SIGTERM lands one rank may have
committed the save another still holds as in flight. Deciding alone, the first wrote the
current step while the second did not, and the first then failed in the save's collectives
when the second exited (seen in a clean-clone run of
tests/local/test_run.py::test_sigterm_stops_the_whole_tree_after_an_emergency_checkpoint)."""

import subprocess
import sys
import textwrap
from pathlib import Path

from trainer_harness import free_port, worker_env

RANK = textwrap.dedent(
    """
    import sys
    from dataclasses import replace
    from pathlib import Path

    import torch
    from torch.optim.lr_scheduler import LambdaLR

    from torchkube.api.trainer import TrainerSpec
    from torchkube.trainer import distributed
    from torchkube.trainer.checkpoint import CheckpointManager, TrainState
    from torchkube.trainer.model import GPT, PRESETS, cross_entropy_loss
    from torchkube.trainer.parallel import build_optimizer, lr_lambda, parallelize

    folder = Path(sys.argv[1])
    spec = TrainerSpec(model="tiny", device="cpu", seq_len=16, steps=100, warmup_steps=10,
                       collective_timeout_seconds=30)
    info = distributed.setup(spec)
    torch.manual_seed(0)
    gpt = GPT(replace(PRESETS["tiny"], vocab_size=64, block_size=16))
    model = parallelize(gpt, spec, info, list(gpt.h))
    optimizer = build_optimizer(model, spec, info)
    scheduler = LambdaLR(optimizer, lr_lambda(spec))
    state = TrainState()
    ckpt = CheckpointManager(folder, info, model, optimizer, scheduler, state, strategy="ddp",
                             interval_steps=1, interval_seconds=0.0, keep=3, async_save=True)
    ckpt.claim()

    def step():
        idx = torch.randint(0, 64, (2, 17))
        cross_entropy_loss(model(idx[:, :-1]), idx[:, 1:]).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        state.step += 1

    step()
    ckpt.save(1)  # async
    if info.rank == 0:
        ckpt.wait()  # rank 0 has committed it; rank 1 still holds it as in flight
    step()
    ckpt.save_on_stop(2)
    print(f"rank {info.rank}: last checkpoint step {ckpt.last_step}", flush=True)
    ckpt.close()
    distributed.teardown()
    """
)


def test_ranks_agree_on_the_emergency_checkpoint_when_one_has_committed_the_save(
    tmp_path: Path,
) -> None:
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(tmp_path / "ckpt")],
            env=worker_env(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE="2",
                LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
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
    for rank, output in enumerate(outputs):
        assert f"rank {rank}: last checkpoint step 1" in output, output
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-1"]
