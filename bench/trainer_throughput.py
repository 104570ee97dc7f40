"""Trainer throughput: tokens/s and MFU of the built-in trainer vs a bare PyTorch loop, same run.

Run on CPU (what this machine has): ``python -m bench.trainer_throughput`` (≈ 6 min).
Run on one GPU: ``python -m bench.trainer_throughput --gpu`` — GPT-2 small (124M), bf16,
sequence 1024, DDP and FSDP2, each with and without ``torch.compile`` (per block), MFU
against the device's dense bf16 peak (``torchkube.trainer.metrics.peak_flops``).

The trainer runs in this process exactly as a pod's single worker would
(``torchkube.trainer.train.run`` with the built-in GPT workload: its data order, step
agreement, metrics, progress reporting, gradient clipping, LR schedule), without checkpoints
(their cost is ``bench.checkpoint_cost``'s). The bare loop is what a user would write by hand
for the same work: the same model class and initialisation, the same data, AdamW with the
same groups, clipping and schedule, the same parallel wrapper (DDP or FSDP2 at world size
1, compiled blocks when asked), and the same host syncs (a ``loss.item()`` at each log
step). Trials alternate (trainer, bare), (bare, trainer), … so the machine's load drifts over both.

Throughput is counted from the end of the warm-up step to the end of the last step (the
trainer's log records carry their creation time; the bare loop reads ``perf_counter`` after
the same sync). **Overhead** is 1 − (trainer tokens/s ÷ bare tokens/s), taken pair by pair,
median over pairs. **MFU** = FLOPs per token (6·N + 12·L·H·Q·T, the trainer's formula) ×
tokens/s ÷ peak; on CPU the peak is this machine's fp32 GEMM rate measured at start (best of
several large matmuls, so MFU is "of what a matmul reaches here", not of a datasheet figure).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.common import Figure, Results, Target, load_average, log

TARGET_OVERHEAD = 3.0  # percent slower than the bare loop, at most
TARGET_H100_MFU = 45.0  # percent, GPT-2 small bf16 + compile on one H100


@dataclass
class Variant:
    strategy: str
    compile: bool

    @property
    def label(self) -> str:
        return f"{self.strategy}{' + compile' if self.compile else ''}"


def measure_gemm_peak(repeats: int = 5, n: int = 2048) -> float:
    """fp32 FLOP/s of a large square matmul on this machine (best of ``repeats``)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - started) / 4)
    return 2 * n**3 / best


def make_spec(args: argparse.Namespace, variant: Variant, steps: int) -> Any:
    from torchkube.api.trainer import TrainerSpec

    return TrainerSpec.model_validate(
        {
            "model": args.model,
            "device": args.device,
            "precision": args.precision,
            "strategy": variant.strategy,
            "compile": variant.compile,
            "microBatchSize": args.micro_batch,
            "globalBatchSize": args.micro_batch,
            "seqLen": args.seq_len,
            "steps": steps,
            "warmupSteps": min(10, steps),
            "logIntervalSteps": args.log_every,
        }
    )


class _StepTimes(logging.Handler):
    """Collects the trainer's "step N/M" log records with their creation times."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.steps: list[tuple[int, float, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        # emit() runs in the training thread right after the record is made, so the
        # process's CPU time read here belongs to the same instant as record.created.
        message = record.getMessage()
        if message.startswith("step ") and "/" in message.split()[1]:
            step = int(message.split()[1].split("/")[0])
            self.steps.append((step, record.created, time.process_time()))


@dataclass
class Speed:
    """Tokens per wall-clock second, and per CPU second of this process (all its threads).

    The second is far less sensitive to other processes on a shared machine: it counts the
    work done per token, which is what an overhead is.
    """

    wall: float
    cpu: float


def throughput(points: list[tuple[int, float, float]], warmup: int, tokens_per_step: int) -> Speed:
    """Speed between the first logged step ≥ ``warmup`` and the last logged step."""
    after = [p for p in points if p[0] >= warmup]
    if len(after) < 2:
        raise ValueError(f"need two logged steps after warm-up step {warmup}, got {after}")
    (s0, t0, c0), (s1, t1, c1) = after[0], after[-1]
    tokens = (s1 - s0) * tokens_per_step
    return Speed(tokens / (t1 - t0), tokens / max(c1 - c0, 1e-9))


def trainer_trial(args: argparse.Namespace, variant: Variant) -> Speed:
    """Speed of the built-in trainer (one process, no checkpoints)."""
    from torchkube.trainer.config import RunEnv
    from torchkube.trainer.train import run

    spec = make_spec(args, variant, args.warmup + args.steps)
    handler = _StepTimes()
    trainer_log = logging.getLogger("torchkube.trainer")
    trainer_log.addHandler(handler)
    try:
        code = run(spec, RunEnv(job_name="bench", checkpoint_dir=None, metrics_port=0))
    finally:
        trainer_log.removeHandler(handler)
    if code != 0:
        raise RuntimeError(f"the trainer exited with {code}")
    return throughput(handler.steps, args.warmup, spec.tokens_per_step)


@contextlib.contextmanager
def one_process_group(device: Any) -> Iterator[None]:
    """A world of one, as DDP/FSDP need even on a single device."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def bare_trial(args: argparse.Namespace, variant: Variant) -> Speed:
    """Speed of a hand-written loop over the same model, data and recipe."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.lr_scheduler import LambdaLR
    from torch.utils.data import default_collate

    from torchkube.trainer.data import TokenDataset
    from torchkube.trainer.model import GPT, cross_entropy_loss
    from torchkube.trainer.parallel import lr_lambda
    from torchkube.trainer.workload import data_paths, gpt_config

    spec = make_spec(args, variant, args.warmup + args.steps)
    cuda = spec.device == "cuda" or (spec.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    bf16 = spec.precision == "bf16" or (spec.precision == "auto" and cuda)
    if not spec.deterministic:
        torch.set_float32_matmul_precision("high")
    dataset = TokenDataset(data_paths(spec)[0], spec.seq_len)
    with one_process_group(device):
        torch.manual_seed(spec.seed)
        with torch.device(device):
            model = GPT(gpt_config(spec))
        if variant.compile:
            for block in model.h:
                block.compile()
        fsdp = variant.strategy == "fsdp"
        if fsdp:
            mp = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16 if bf16 else torch.float32, reduce_dtype=torch.float32
            )
            for i, block in enumerate(model.h):
                fully_shard(block, mp_policy=mp, reshard_after_forward=i < len(model.h) - 1)
            fully_shard(model, mp_policy=mp)
            net: torch.nn.Module = model
        else:
            net = DistributedDataParallel(
                model, device_ids=[0] if cuda else None, gradient_as_bucket_view=True
            )
        params = [p for p in net.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            [
                {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
            ],
            lr=spec.learning_rate,
            betas=(spec.beta1, spec.beta2),
            eps=1e-8,
            fused=cuda,
        )
        scheduler = LambdaLR(optimizer, lr_lambda(spec))  # the recipe, a pure function
        generator = torch.Generator().manual_seed(spec.seed)
        autocast = (
            torch.autocast(device.type, dtype=torch.bfloat16)
            if bf16 and not fsdp
            else contextlib.nullcontext()
        )
        points: list[tuple[int, float, float]] = []
        for step in range(1, spec.steps + 1):
            index = torch.randint(len(dataset), (spec.micro_batch_size,), generator=generator)
            x, y = default_collate([dataset[int(i)] for i in index])
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast:
                loss = cross_entropy_loss(net(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), spec.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if step % spec.log_interval_steps == 0:
                loss.item()  # the same host sync the trainer makes to log
                points.append((step, time.time(), time.process_time()))
    return throughput(points, args.warmup, spec.tokens_per_step)


def flops_per_token(args: argparse.Namespace) -> float:
    import torch

    from torchkube.trainer.model import GPT
    from torchkube.trainer.workload import gpt_config

    spec = make_spec(args, Variant("ddp", False), 10)
    with torch.device("meta"):
        return float(GPT(gpt_config(spec)).flops_per_token(spec.seq_len))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer_throughput", description=__doc__)
    parser.add_argument("--gpu", action="store_true", help="GPT-2 small, bf16, DDP/FSDP2 ± compile")
    parser.add_argument("--model", default=None, help="preset (default small, gpt2 with --gpu)")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per trial")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per trial")
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--trials", type=int, default=8, help="pairs (trainer, bare) per variant")
    parser.add_argument("--strategies", default=None, help="comma list (ddp,fsdp)")
    parser.add_argument("--compile", choices=["off", "on", "both"], default=None)
    args = parser.parse_args(argv)
    gpu = args.gpu
    args.device = "cuda" if gpu else "cpu"
    args.precision = "bf16" if gpu else "fp32"
    args.model = args.model or ("gpt2" if gpu else "small")
    args.seq_len = args.seq_len or (1024 if gpu else 128)
    args.micro_batch = args.micro_batch or (16 if gpu else 4)
    args.steps = args.steps or (50 if gpu else 40)
    args.warmup = args.warmup or (15 if gpu else 5)
    args.strategies = args.strategies or ("ddp,fsdp" if gpu else "ddp")
    args.compile = args.compile or ("both" if gpu else "off")
    if args.warmup % args.log_every or args.steps % args.log_every:
        parser.error(
            "--warmup and --steps must be multiples of --log-every (timed from one "
            "logged step to another)"
        )

    import torch

    name = "trainer_throughput_gpu" if gpu else "trainer_throughput"
    results = Results(
        name,
        "python -m bench.trainer_throughput" + (" --gpu" if gpu else ""),
        config=dict(vars(args)),
    )
    results.machine["torch_threads"] = torch.get_num_threads()
    if gpu:
        from torchkube.trainer.metrics import peak_flops

        device_name = torch.cuda.get_device_name(0)
        peaks = [peak_flops(device_name, "bf16") or 0.0]
        results.machine["gpu"] = device_name
        peak_text = f"{device_name} dense bf16 peak"
    else:
        # Re-measured before every pair: other users lower it, so the best one is the
        # closest to what this machine's cores can do.
        peaks = [measure_gemm_peak()]
        peak_text = "the best fp32 GEMM rate measured on this machine during the run"
    os.environ["TORCHKUBE_PEAK_FLOPS"] = str(peaks[0] or "")
    fpt = flops_per_token(args)
    results.extra["flops_per_token"] = fpt
    log(f"peak {peaks[0]:.3g} FLOP/s ({peak_text}); {fpt:.3g} FLOPs/token")

    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    variants = [Variant(s, c) for s in args.strategies.split(",") for c in compiles]
    speeds: dict[str, list[tuple[Speed, Speed, float, float]]] = {}
    for trial in range(args.trials):
        for variant in variants:  # interleaved: load drifts over every variant alike
            if not gpu and trial:
                peaks.append(measure_gemm_peak())
            # Alternate who goes first, so a drift in load favours neither.
            if trial % 2 == 0:
                ours, load_ours = trainer_trial(args, variant), load_average()
                bare, load_bare = bare_trial(args, variant), load_average()
            else:
                bare, load_bare = bare_trial(args, variant), load_average()
                ours, load_ours = trainer_trial(args, variant), load_average()
            speeds.setdefault(variant.label, []).append((ours, bare, load_ours, load_bare))
            log(
                f"{variant.label} pair {trial + 1}: trainer {ours.wall:,.0f} tok/s "
                f"({ours.cpu:,.0f}/CPU-s), bare {bare.wall:,.0f} tok/s ({bare.cpu:,.0f}/CPU-s), "
                f"overhead {100 * (1 - ours.wall / bare.wall):+.1f} % wall, "
                f"{100 * (1 - ours.cpu / bare.cpu):+.1f} % CPU"
            )
    peak = max(peaks)
    results.extra["peak_flops"] = peak
    results.extra["peak_flops_measured"] = peaks
    for variant in variants:
        prefix = f"{args.model} {variant.label}"
        trainer_fig = results.figure(f"{prefix}: trainer", "tok/s")
        bare_fig = results.figure(f"{prefix}: bare loop", "tok/s")
        overhead = results.figure(
            f"{prefix}: trainer overhead (wall time)", "%", target=Target(TARGET_OVERHEAD)
        )
        cpu_overhead = results.figure(f"{prefix}: trainer overhead (CPU time)", "%")
        mfu_target = Target(TARGET_H100_MFU, "min") if gpu and variant.compile else None
        mfu: Figure = results.figure(f"{prefix}: trainer MFU", "%", target=mfu_target)
        bare_mfu = results.figure(f"{prefix}: bare-loop MFU", "%")
        for ours, bare, load_ours, load_bare in speeds[variant.label]:
            load = max(load_ours, load_bare)
            trainer_fig.add(ours.wall, load_ours)
            bare_fig.add(bare.wall, load_bare)
            overhead.add(100 * (1 - ours.wall / bare.wall), load)
            cpu_overhead.add(100 * (1 - ours.cpu / bare.cpu), load)
            if peak:
                mfu.add(100 * fpt * ours.wall / peak, load_ours)
                bare_mfu.add(100 * fpt * bare.wall / peak, load_bare)
    results.notes += [
        f"{args.model} preset, sequence {args.seq_len}, micro batch {args.micro_batch}, "
        f"{args.precision}, {args.steps} timed steps after {args.warmup} warm-up steps per trial",
        f"MFU against {peak_text}: {peak or 0:.3g} FLOP/s; {fpt:.3g} FLOPs per token",
        "overhead: 1 − trainer ÷ bare tokens/s per (trainer, bare) pair, median over pairs; "
        "negative means the trainer was faster in that pair (noise); the CPU-time variant "
        "divides tokens by this process's CPU seconds instead of wall seconds, which other "
        "processes on the machine disturb far less",
    ]
    results.write()


if __name__ == "__main__":
    main()
