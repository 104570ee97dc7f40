"""The same trainer on a GPU: NCCL, bf16, FSDP2, compile, and throughput figures (tokens/s and
MFU, written down in docs/trainer.md) for GPT-2 small and a 1B Llama under DDP, FSDP2 and
tensor parallelism × FSDP2, on one GPU and on all of them, held to floors on Hopper GPUs.
Skipped without CUDA; ``bench/gpu_check.sh`` runs them on a lent machine."""

import re
import time
from dataclasses import dataclass
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


def test_step_time_is_the_gpu_time() -> None:
    """CUDA events see the kernels' time, which the host clock misses while it only enqueues."""
    from torchkube.trainer.timing import step_timer

    torch.cuda._sleep(1000)  # the CUDA context and the kernel's first launch, outside the timing
    torch.cuda.synchronize()
    timer = step_timer(torch.device("cuda", 0))
    timer.start()
    host = time.monotonic()
    torch.cuda._sleep(200_000_000)  # ≈ 0.1 s of GPU time on current GPUs, enqueued at once
    timer.stop()
    host = time.monotonic() - host
    [gpu] = timer.finished(wait=True)
    assert gpu > 10 * host


HOPPER_FLOORS = {"gpt2 ddp mfu": 0.35, "gpt2 fsdp / ddp": 0.90, "llama-1b fsdp mfu": 0.40}
"""Floors on one GPU of the Hopper class (H100, H200), bf16 + compile, MFU by the trainer's own
count (docs/metrics.md), set by the issue that asked for them. FSDP2 + compile is host-bound at
GPT-2 small's size, so "within 10 %" of DDP fails on a GPU until that gap is closed; where each
stands is the GPU record's (docs/trainer.md#measured-throughput-on-a-gpu)."""


def hopper() -> str | None:
    """Why the floors do not hold here, or None on a Hopper GPU."""
    name = torch.cuda.get_device_name(0)
    if torch.cuda.get_device_capability(0) == (9, 0) and ("H100" in name or "H200" in name):
        return None
    return f"the floors are set for Hopper GPUs (H100, H200); this is {name}"


@dataclass
class Throughput:
    tokens_per_second: float
    mfu: float
    line: str


def train_on_gpus(
    model: str, strategy: str, nproc: int, tensor: int, token_data: Path, tmp_path: Path
) -> Throughput:
    """40 steps of GPT-2 small or a Llama 3.2 1B shape at their real vocabularies, bf16 +
    compile; the trainer's own figures over the last 20."""
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
    where = tmp_path / f"{model}-{strategy}-{nproc}-{tensor}"
    where.mkdir()
    runner = Torchrun(where)
    try:
        launch = runner.start(
            nproc, [*args, "--checkpoint-interval-steps=0"], checkpoint_dir=where / "ckpt"
        )
        assert launch.wait(900) == 0, launch.output()[-4000:]
    finally:
        runner.close()
    line = [line for line in launch.output().splitlines() if "tok/s" in line][-1]
    print(f"{model} {strategy} tensor {tensor} on {nproc} GPU(s): {line}")
    mfu = re.search(r"mfu ([0-9.]+)%", line)
    assert mfu, f"no MFU in the trainer's log line: {line}"
    tokens = read_progress(where / "ckpt")["tokensPerSecond"]
    return Throughput(tokens, float(mfu.group(1)) / 100, line)


def test_gpt2_small_on_one_gpu(token_data: Path, tmp_path: Path) -> None:
    """DDP (the plain module at world size 1) and FSDP2 at its MFU floor and within 10 %."""
    if reason := hopper():
        pytest.skip(reason)
    ddp = train_on_gpus("gpt2", "ddp", 1, 1, token_data, tmp_path)
    fsdp = train_on_gpus("gpt2", "fsdp", 1, 1, token_data, tmp_path)
    assert ddp.mfu >= HOPPER_FLOORS["gpt2 ddp mfu"], ddp.line
    ratio = fsdp.tokens_per_second / ddp.tokens_per_second
    assert ratio >= HOPPER_FLOORS["gpt2 fsdp / ddp"], f"FSDP2 at {ratio:.2f}× DDP: {fsdp.line}"


def test_llama_1b_fsdp_on_one_gpu(token_data: Path, tmp_path: Path) -> None:
    if reason := hopper():
        pytest.skip(reason)
    llama = train_on_gpus("llama-1b", "fsdp", 1, 1, token_data, tmp_path)
    assert llama.mfu >= HOPPER_FLOORS["llama-1b fsdp mfu"], llama.line


@pytest.mark.parametrize(
    ("model", "strategy", "tensor"),
    [("gpt2", "ddp", 1), ("gpt2", "fsdp", 1), ("llama-1b", "fsdp", 1), ("llama-1b", "fsdp", 0)],
)
def test_throughput_on_all_gpus(
    model: str, strategy: str, tensor: int, token_data: Path, tmp_path: Path
) -> None:
    """tokens/s and MFU on every GPU of the machine (tensor 0: tensor parallel over up to 8),
    for docs/trainer.md's table: ``pytest tests/trainer/test_gpu.py -k all_gpus -s``."""
    count = torch.cuda.device_count()
    if count < 2:
        pytest.skip("the same as on one GPU: this machine has one")
    result = train_on_gpus(model, strategy, count, tensor or min(count, 8), token_data, tmp_path)
    assert result.tokens_per_second > 0
