"""The same trainer on a GPU: NCCL, bf16, FSDP2, compile, and throughput figures (tokens/s and
MFU, written down in docs/trainer.md) for GPT-2 small and a 1B Llama under DDP, FSDP2 and
tensor parallelism × FSDP2, on one GPU and on all of them. Skipped without CUDA."""

import time
from pathlib import Path

import pytest
import torch
from trainer_harness import Torchrun, read_progress, spec_args

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GPU = {"device": "cuda", "precision": "bf16", "deterministic": False}


def test_nccl_bf16_ddp_then_fsdp_resume(
    token_data: Path, tmp_path: Path, torchrun: Torchrun
) -> None:
    ckpt = tmp_path / "ckpt"
    for strategy, steps in (("ddp", 40), ("fsdp", 60)):
        args = [
            *spec_args(token_data, strategy=strategy, steps=steps, **GPU),
            "--checkpoint-interval-steps=20",
        ]
        launch = torchrun.start(1, args, checkpoint_dir=ckpt, name=strategy)
        assert launch.wait(600) == 0, launch.output()[-4000:]
        assert "device cuda" in launch.output()
    record = read_progress(ckpt)
    assert record["finished"] and record["step"] == 60 and record["loss"] < 3.0
    assert "written at world size 1 with ddp" in launch.output()


def test_gpt2_small_throughput(token_data: Path, tmp_path: Path, torchrun: Torchrun) -> None:
    """GPT-2 124M (vocab 50304, T = 1024), bf16, torch.compile, one GPU."""
    args = spec_args(
        token_data,
        model="gpt2",
        vocabSize=50304,
        seqLen=1024,
        microBatchSize=16,
        globalBatchSize=16,
        steps=60,
        warmupSteps=10,
        logIntervalSteps=20,
        compile=True,
        learningRate=6e-4,
        lrSchedule="cosine",
        **GPU,
    )
    launch = torchrun.start(
        1, [*args, "--checkpoint-interval-steps=0"], checkpoint_dir=tmp_path / "ckpt", name="gpt2"
    )
    assert launch.wait(900) == 0, launch.output()[-4000:]
    lines = [line for line in launch.output().splitlines() if "tok/s" in line]
    print("\n".join(lines[-2:]))  # the figure for docs/trainer.md
    assert read_progress(tmp_path / "ckpt")["tokensPerSecond"] > 10_000


def test_step_time_is_the_gpu_time() -> None:
    """CUDA events see the kernels' time, which the host clock misses while it only enqueues."""
    from torchkube.trainer.timing import step_timer

    timer = step_timer(torch.device("cuda", 0))
    timer.start()
    host = time.monotonic()
    torch.cuda._sleep(200_000_000)  # ≈ 0.1 s of GPU time on current GPUs, enqueued at once
    timer.stop()
    host = time.monotonic() - host
    [gpu] = timer.finished(wait=True)
    assert gpu > 10 * host


@pytest.mark.parametrize(
    ("model", "strategy", "tensor", "gpus"),
    [
        ("gpt2", "ddp", 1, "one"),
        ("gpt2", "fsdp", 1, "one"),
        ("gpt2", "ddp", 1, "all"),
        ("gpt2", "fsdp", 1, "all"),
        ("llama-1b", "ddp", 1, "one"),
        ("llama-1b", "fsdp", 1, "one"),
        ("llama-1b", "fsdp", 1, "all"),
        ("llama-1b", "fsdp", "all", "all"),
    ],
)
def test_throughput_by_parallelism(
    model: str, strategy: str, tensor: int | str, gpus: str, token_data: Path, tmp_path: Path
) -> None:
    """tokens/s and MFU of GPT-2 small and a Llama 3.2 1B shape (their real vocabularies),
    bf16 + compile, on one GPU and on all of them (tensor parallel over up to 8), for
    docs/trainer.md's table: ``pytest tests/trainer/test_gpu.py -k throughput_by -s``."""
    count = torch.cuda.device_count()
    if gpus == "all" and count < 2:
        pytest.skip("the same as on one GPU: this machine has one")
    nproc = count if gpus == "all" else 1
    tensor = min(nproc, 8) if tensor == "all" else int(tensor)
    llama = model.startswith("llama")
    micro = 4 if llama else 16
    args = spec_args(
        token_data,
        model=model,
        vocabSize=128256 if llama else 50304,
        strategy=strategy,
        **{"parallelism.tensor": tensor},
        seqLen=2048 if llama else 1024,
        microBatchSize=micro,
        globalBatchSize=micro * (nproc // tensor),
        steps=40,
        warmupSteps=10,
        logIntervalSteps=20,
        compile=True,
        learningRate=3e-4,
        lrSchedule="cosine",
        **GPU,
    )
    runner = Torchrun(tmp_path)
    try:
        launch = runner.start(
            nproc, [*args, "--checkpoint-interval-steps=0"], checkpoint_dir=tmp_path / "ckpt"
        )
        assert launch.wait(900) == 0, launch.output()[-4000:]
    finally:
        runner.close()
    line = [line for line in launch.output().splitlines() if "tok/s" in line][-1]
    print(f"{model} {strategy} tensor {tensor} on {nproc} GPU(s): {line}")
    assert read_progress(tmp_path / "ckpt")["tokensPerSecond"] > 0 and "mfu n/a" not in line
