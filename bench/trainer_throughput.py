"""Trainer throughput: tokens/s of the built-in trainer against a plain nanoGPT-style loop over
the same model, measured in the same run with the same number of threads.

Run on CPU (what this machine has): ``python -m bench.trainer_throughput`` (≈ 9 min on 2
cores; the command this writes into the results lists every flag). Many short pairs rather
than a few long ones: on a shared machine a pair's two trials then mostly see the same load.
On one GPU: ``python -m bench.trainer_throughput --gpu`` — GPT-2 small (124M, with GPT-2's
vocabulary), bf16, sequence 1024, the trainer with DDP and FSDP2 at world size 1, each with and
without ``torch.compile``, MFU against the device's dense bf16 peak (``flops.peak_flops``);
``--model llama-1b`` (any Llama-family preset) for a Llama. One process only: several GPUs are
measured by ``tests/trainer/test_gpu.py::test_throughput_on_all_gpus``. ``bench/gpu_check.sh``
runs this and the GPU tests on a lent machine. ``--nanogpt DIR`` (a checkout of nanoGPT) adds
nanoGPT's own, unmodified ``bench.py`` as a third contender in every trial, in a process of its
own at our batch and sequence (random data, compiled, bf16), first in odd trials and last in
even ones: the peer as its users run it, beside the trainer's DDP + compile.

**The trainer** runs in this process exactly as a pod's single worker would
(``torchkube.trainer.train.run`` with the built-in workload of the preset: its data order, step
agreement, metrics, progress reporting, gradient clipping, LR schedule), without checkpoints
(their cost is ``bench.checkpoint_cost``'s).

**The reference** is what a user writes by hand after nanoGPT's ``train.py`` at world size 1:
the same model class and shape (the preset's GPT or Llama, vocabulary padded alike), AdamW with
nanoGPT's two groups, the same LR schedule and gradient clipping, random windows of the same
token file fetched like nanoGPT's ``get_batch`` (the next batch while the current one
computes), ``loss.item()`` at log steps; no DDP and no other wrapper (``torch.compile`` of the
whole model and its loss when asked, as nanoGPT compiles its model, whose forward returns the
loss). It is our own code, so the overhead figure is the
trainer against the plain work and nothing else.

Pairs alternate who goes first, (trainer, reference), (reference, trainer), …, so a drift in
the machine's load favours neither. A trial's throughput is the median over its windows of
``--log-every`` steps after the warm-up (the trainer's log records carry their creation time;
the reference reads the clock after the same sync), so a moment in which another process
takes the shared cores does not decide the comparison. **Ratio** = trainer tokens/s ÷
reference tokens/s, pair by pair; reported as the median with a distribution-free 95 %
confidence interval of the median (:func:`median_interval`). **MFU** = FLOPs per token
(6·N + 12·L·H·Q·T, the trainer's formula) × tokens/s ÷ peak; on CPU the peak is this
machine's fp32 GEMM rate measured during the run (best of several large matmuls), so MFU is
"of what a matmul reaches here".
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Figure, Results, Target, load_average, log

TARGET_RATIO = 1.0  # the trainer at least as fast as the plain loop (issue #16)
TARGET_OVERHEAD = 3.0  # percent slower than the plain loop, at most (perf-targets.md §2)
TARGET_H100_MFU = 45.0  # percent, GPT-2 small bf16 + compile on one H100
CONFIDENCE = 0.95


@dataclass
class Variant:
    strategy: str
    compile: bool

    @property
    def label(self) -> str:
        return f"{self.strategy}{' + compile' if self.compile else ''}"


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: order statistics ``k`` and
    ``n + 1 − k``, with ``k`` the largest rank such that a Binomial(n, ½) count falls below
    it with probability at most (1 − confidence) / 2. No assumption about how the trial
    values are spread, which on a shared machine they are not, normally."""
    n = len(values)
    tail = (1 - confidence) / 2
    below, k = 0.0, 0
    while below + math.comb(n, k) / 2**n <= tail:
        below += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        raise ValueError(f"{n} values are too few for a {confidence:.0%} interval of the median")
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


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
            "vocabSize": args.vocab_size,
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


class StepTimes(logging.Handler):
    """Collects the trainer's "step N/M" log records with their creation times; ``on_step``
    runs at each (``bench.profile_step`` advances its profiler's schedule with it)."""

    def __init__(self, on_step: Callable[[], None] | None = None) -> None:
        super().__init__(logging.INFO)
        self.steps: list[tuple[int, float, float]] = []
        self.on_step = on_step

    def emit(self, record: logging.LogRecord) -> None:
        # emit() runs in the training thread right after the record is made, so the
        # process's CPU time read here belongs to the same instant as record.created.
        message = record.getMessage()
        if message.startswith("step ") and "/" in message.split()[1]:
            step = int(message.split()[1].split("/")[0])
            self.steps.append((step, record.created, time.process_time()))
            if self.on_step is not None:
                self.on_step()


@dataclass
class Speed:
    """Tokens per wall-clock second, and per CPU second of this process (all its threads).

    The second is far less sensitive to other processes on a shared machine: it counts the
    work done per token, which is what an overhead is.
    """

    wall: float
    cpu: float


def throughput(points: list[tuple[int, float, float]], warmup: int, tokens_per_step: int) -> Speed:
    """Median speed over the windows between consecutive logged steps from ``warmup`` on.

    The median of the windows rather than their total: on a shared machine another process
    may take the cores for a moment, and that moment should not decide a 3 % comparison.
    """
    after = [p for p in points if p[0] >= warmup]
    if len(after) < 2:
        raise ValueError(f"need two logged steps after warm-up step {warmup}, got {after}")
    wall, cpu = [], []
    for (s0, t0, c0), (s1, t1, c1) in itertools.pairwise(after):
        tokens = (s1 - s0) * tokens_per_step
        wall.append(tokens / (t1 - t0))
        cpu.append(tokens / max(c1 - c0, 1e-9))
    return Speed(statistics.median(wall), statistics.median(cpu))


def run_trainer(spec: Any, times: StepTimes, job_name: str) -> None:
    """The built-in trainer in this process as a pod's single worker runs it (no
    checkpoints), ``times`` listening to its log."""
    from torchkube.trainer.loader import RunEnv
    from torchkube.trainer.train import run

    trainer_log = logging.getLogger("torchkube.trainer")
    trainer_log.addHandler(times)
    try:
        code = run(spec, RunEnv(job_name=job_name, checkpoint_dir=None, metrics_port=0))
    finally:
        trainer_log.removeHandler(times)
    if code != 0:
        raise RuntimeError(f"the trainer exited with {code}")


def trainer_trial(args: argparse.Namespace, variant: Variant) -> Speed:
    """Speed of the built-in trainer (one process, no checkpoints)."""
    spec = make_spec(args, variant, args.warmup + args.steps)
    times = StepTimes()
    run_trainer(spec, times, "bench")
    return throughput(times.steps, args.warmup, spec.tokens_per_step)


def reference_trial(args: argparse.Namespace, variant: Variant) -> Speed:
    """Speed of the plain nanoGPT-style loop over the same model, data and recipe."""
    import numpy as np
    import torch

    from torchkube.trainer.model import cross_entropy_loss
    from torchkube.trainer.parallel import lr_lambda
    from torchkube.trainer.tokens import HEADER_BYTES, read_header, resolve_token_files
    from torchkube.trainer.workload import builtin_workload, data_paths

    spec = make_spec(args, variant, args.warmup + args.steps)
    cuda = args.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    torch.set_float32_matmul_precision("high")  # as the trainer does without deterministic
    info = read_header(resolve_token_files(data_paths(spec)[0])[0])
    data = np.memmap(info.path, dtype=info.dtype, mode="r", offset=HEADER_BYTES)
    batch, seq = spec.micro_batch_size, spec.seq_len
    generator = torch.Generator().manual_seed(spec.seed)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(data) - seq - 1, (batch,), generator=generator).tolist()
        x = torch.stack([torch.from_numpy(data[i : i + seq].astype(np.int64)) for i in starts])
        y = torch.stack(
            [torch.from_numpy(data[i + 1 : i + 1 + seq].astype(np.int64)) for i in starts]
        )
        if cuda:
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(
                device, non_blocking=True
            )
        return x, y

    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = builtin_workload(spec).build_model(spec)  # the preset's GPT or Llama

    def forward_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cross_entropy_loss(model(x), y)

    # nanoGPT computes its loss inside its model's forward, so compiling the model compiles both
    step_loss = torch.compile(forward_loss) if variant.compile else forward_loss
    params = [p for p in model.parameters() if p.requires_grad]
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
    lr_at = lr_lambda(spec)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if args.precision == "bf16"
        else contextlib.nullcontext()
    )
    points: list[tuple[int, float, float]] = []
    x, y = get_batch()
    for step in range(1, spec.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = spec.learning_rate * lr_at(step - 1)
        with autocast:
            loss = step_loss(x, y)
        x, y = get_batch()  # fetched while the device computes, as nanoGPT does
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % spec.log_interval_steps == 0:
            loss.item()  # the same host sync the trainer makes to log
            points.append((step, time.time(), time.process_time()))
    return throughput(points, args.warmup, spec.tokens_per_step)


NANOGPT_TIMING = re.compile(r"time per iteration: ([0-9.]+)ms")
NANOGPT_SECONDS = 300


def nanogpt_trial(args: argparse.Namespace) -> float:
    """Tokens/s of nanoGPT's own ``bench.py`` at our batch and sequence: its 20 timed
    iterations after 10 of burn-in, random data, ``torch.compile``, bf16 autocast (its
    defaults on a GPU with bf16), one process of its own, as a user runs it."""
    completed = subprocess.run(
        [
            sys.executable,
            "bench.py",
            f"--batch_size={args.micro_batch}",
            f"--block_size={args.seq_len}",
            "--real_data=False",
            "--compile=True",
        ],
        cwd=args.nanogpt,
        capture_output=True,
        text=True,
        timeout=NANOGPT_SECONDS,
        check=False,
    )
    found = NANOGPT_TIMING.search(completed.stdout)
    if completed.returncode or not found:
        tail = (completed.stdout + completed.stderr)[-2000:]
        raise RuntimeError(f"nanoGPT's bench.py exited with {completed.returncode}: {tail}")
    return args.micro_batch * args.seq_len / (float(found.group(1)) / 1e3)


def nanogpt_revision(directory: Path) -> str:
    """The nanoGPT commit measured: the ``REVISION`` file beside its ``bench.py`` where only the
    files were copied (``bench/gpu_wheels.sh``: a lent machine has no git), else ``git
    rev-parse`` of the folder when it is a checkout's root (never of a repository around it)."""
    revision = directory / "REVISION"
    if revision.exists():
        return revision.read_text().strip()
    found = subprocess.run(
        ["git", "-C", str(directory), "rev-parse", "--show-toplevel", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    top, _, commit = found.stdout.strip().partition("\n")
    if found.returncode == 0 and commit and Path(top).resolve() == directory.resolve():
        return commit
    return "unknown"


def flops_per_token(args: argparse.Namespace) -> float:
    import torch

    from torchkube.trainer.workload import builtin_workload

    spec = make_spec(args, Variant("ddp", False), 10)
    workload = builtin_workload(spec)
    with torch.device("meta"):
        return float(workload.flops_per_token(workload.build_model(spec), spec) or 0.0)


def command(args: argparse.Namespace) -> str:
    """The command that reproduces this run, every flag spelled out."""
    flags = [
        f"--model {args.model}",
        *([f"--vocab-size {args.vocab_size}"] if args.vocab_size else []),
        f"--seq-len {args.seq_len}",
        f"--micro-batch {args.micro_batch}",
        f"--steps {args.steps}",
        f"--warmup {args.warmup}",
        f"--log-every {args.log_every}",
        f"--trials {args.trials}",
        f"--threads {args.threads}",
        f"--strategies {args.strategies}",
        f"--compile {args.compile}",
        *([f"--nanogpt {args.nanogpt}"] if args.nanogpt else []),
    ]
    return " ".join(
        ["python -m bench.trainer_throughput", *(["--gpu"] if args.gpu else []), *flags]
    )


PUBLISHED_VOCABULARIES = {"gpt2": 50304, "llama": 128256, "mistral": 32768}
"""By preset name prefix: GPT-2's 50257, Llama 3's and Mistral v0.3's vocabularies, padded to a
multiple of 64 as the trainer pads them."""


def published_vocabulary(model: str) -> int | None:
    """The vocabulary of the published model a preset is shaped after: the head's matmul is a
    sizeable share of a small model's FLOPs, so a GPU figure for "GPT-2 small" is measured with
    GPT-2's vocabulary, not the bundled corpus's bytes."""
    return next((v for p, v in PUBLISHED_VOCABULARIES.items() if model.startswith(p)), None)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer_throughput", description=__doc__)
    parser.add_argument("--gpu", action="store_true", help="GPT-2 small, bf16, DDP/FSDP2 ± compile")
    parser.add_argument(
        "--model", default=None, help="GPT or Llama preset (default small, gpt2 with --gpu)"
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="the model's vocabulary (default with --gpu: the preset's published one, "
        "GPT-2's 50304 or Llama 3's 128256; else the data's)",
    )
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per trial")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per trial")
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--trials", type=int, default=40, help="(trainer, reference) pairs")
    parser.add_argument(
        "--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads, both"
    )
    parser.add_argument("--strategies", default=None, help="comma list (ddp,fsdp)")
    parser.add_argument("--compile", choices=["off", "on", "both"], default=None)
    parser.add_argument(
        "--nanogpt",
        type=Path,
        default=None,
        help="a checkout of nanoGPT: its bench.py as a third contender (with --gpu, gpt2)",
    )
    args = parser.parse_args(argv)
    gpu = args.gpu
    args.device = "cuda" if gpu else "cpu"
    args.precision = "bf16" if gpu else "fp32"
    args.model = args.model or ("gpt2" if gpu else "small")
    if gpu and args.vocab_size is None:
        args.vocab_size = published_vocabulary(args.model)
    args.seq_len = args.seq_len or (1024 if gpu else 128)
    args.micro_batch = args.micro_batch or (16 if gpu else 4)
    args.steps = args.steps or (50 if gpu else 20)
    args.warmup = args.warmup or (15 if gpu else 5)
    args.strategies = args.strategies or ("ddp,fsdp" if gpu else "ddp")
    args.compile = args.compile or ("both" if gpu else "off")
    if args.warmup % args.log_every or args.steps % args.log_every:
        parser.error(
            "--warmup and --steps must be multiples of --log-every (timed from one "
            "logged step to another)"
        )
    if args.nanogpt and not (gpu and args.model == "gpt2" and args.vocab_size == 50304):
        parser.error("--nanogpt measures nanoGPT's GPT-2 small: it needs --gpu and --model gpt2")
    if args.nanogpt and not (args.nanogpt / "bench.py").exists():
        parser.error(f"--nanogpt {args.nanogpt}: no bench.py there")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    gpu = args.gpu

    import torch

    torch.set_num_threads(args.threads)
    name = "trainer_throughput_gpu" if gpu else "trainer_throughput"
    results = Results(name, command(args), config=dict(vars(args)))
    results.machine["torch_threads"] = torch.get_num_threads()
    if gpu:
        from torchkube.trainer.flops import peak_flops

        device_name = torch.cuda.get_device_name(0)
        peaks = [peak_flops(device_name, "bf16") or 0.0]
        results.machine["gpu"] = device_name
        peak_text = f"{device_name} dense bf16 peak"
    else:
        # Re-measured before every pair: other users lower it, so the best one is the
        # closest to what this machine's cores can do.
        peaks = [measure_gemm_peak()]
        peak_text = "the best fp32 GEMM rate measured on this machine during the run"
    results.extra["peak_flops_measured"] = peaks
    os.environ["TORCHKUBE_PEAK_FLOPS"] = str(peaks[0] or "")
    fpt = flops_per_token(args)
    results.extra["flops_per_token"] = fpt
    log(f"peak {peaks[0]:.3g} FLOP/s ({peak_text}); {fpt:.3g} FLOPs/token")

    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    variants = [Variant(s, c) for s in args.strategies.split(",") for c in compiles]
    speeds: dict[str, list[tuple[Speed, Speed, float, float]]] = {}
    nanogpt: list[tuple[float, float]] = []
    if args.nanogpt:
        results.extra["nanogpt_revision"] = nanogpt_revision(args.nanogpt)
    for trial in range(args.trials):
        if args.nanogpt and trial % 2:
            nanogpt.append((nanogpt_trial(args), load_average()))
        for variant in variants:  # interleaved: load drifts over every variant alike
            if not gpu and trial:
                peaks.append(measure_gemm_peak())
            if trial % 2 == 0:
                ours, load_ours = trainer_trial(args, variant), load_average()
                ref, load_ref = reference_trial(args, variant), load_average()
            else:
                ref, load_ref = reference_trial(args, variant), load_average()
                ours, load_ours = trainer_trial(args, variant), load_average()
            speeds.setdefault(variant.label, []).append((ours, ref, load_ours, load_ref))
            log(
                f"{variant.label} pair {trial + 1}: trainer {ours.wall:,.0f} tok/s "
                f"({ours.cpu:,.0f}/CPU-s), reference {ref.wall:,.0f} tok/s "
                f"({ref.cpu:,.0f}/CPU-s), ratio {ours.wall / ref.wall:.3f} wall, "
                f"{ours.cpu / ref.cpu:.3f} CPU"
            )
        if args.nanogpt and trial % 2 == 0:
            nanogpt.append((nanogpt_trial(args), load_average()))
        if args.nanogpt:
            log(f"trial {trial + 1}: nanoGPT's bench.py {nanogpt[-1][0]:,.0f} tok/s")
        # Written after every trial: a run cut short by its time limit keeps what it measured.
        write_record(results, args, variants, speeds, nanogpt, max(peaks), peak_text, fpt)


def write_record(
    results: Results,
    args: argparse.Namespace,
    variants: list[Variant],
    speeds: dict[str, list[tuple[Speed, Speed, float, float]]],
    nanogpt: list[tuple[float, float]],
    peak: float,
    peak_text: str,
    fpt: float,
) -> None:
    """The record of the trials so far (its figures rebuilt from all of them)."""
    results.figures, results.notes = [], []
    results.extra["peak_flops"] = peak
    for variant in variants:
        record(results, args, variant, speeds[variant.label], peak, fpt, args.gpu)
    compiled_ddp = speeds.get(Variant("ddp", True).label)
    if nanogpt and compiled_ddp:
        record_nanogpt(results, args, compiled_ddp, nanogpt, peak, fpt)
    trials = len(next(iter(speeds.values())))
    results.notes += [
        f"{args.model} preset, sequence {args.seq_len}, micro batch {args.micro_batch}, "
        f"{args.precision}, world size 1, {args.threads} torch threads for both, {args.steps} "
        f"timed steps after {args.warmup} warm-up steps per trial, {trials} pairs",
        f"MFU against {peak_text}: {peak or 0:.3g} FLOP/s; {fpt:.3g} FLOPs per token",
        "ratio: trainer ÷ reference tokens/s per pair, median over pairs; the interval is a "
        f"distribution-free {CONFIDENCE:.0%} confidence interval of the median (order "
        "statistics); the CPU-time ratio divides tokens by this process's CPU seconds "
        "instead of wall seconds, which other processes on the machine disturb far less",
        "reference: a plain nanoGPT-style loop over the same GPT (see bench/trainer_throughput.py)",
    ]
    if nanogpt:
        results.notes.append(
            f"nanoGPT: its unmodified bench.py at commit {results.extra['nanogpt_revision']} "
            f"(batch {args.micro_batch} × {args.seq_len}, random data, compile, bf16, "
            "its loss.item() every iteration), one run per trial in a process of its own, "
            "first in odd trials and last in even ones; the trainer ÷ nanoGPT ratio pairs "
            "each run with the same trial's DDP + compile trainer"
        )
    results.write()


def record_nanogpt(
    results: Results,
    args: argparse.Namespace,
    compiled_ddp: list[tuple[Speed, Speed, float, float]],
    nanogpt: list[tuple[float, float]],
    peak: float,
    fpt: float,
) -> None:
    """nanoGPT's figures, and the trainer's DDP + compile against them trial by trial."""
    prefix = f"{args.model} ddp + compile"
    theirs = results.figure("nanoGPT bench.py", "tok/s")
    mfu = results.figure("nanoGPT bench.py MFU", "%")
    ratio = results.figure(
        f"{prefix}: trainer ÷ nanoGPT bench.py (wall time)", "x", target=Target(TARGET_RATIO, "min")
    )
    for (speed, load), (ours, _, load_ours, _) in zip(nanogpt, compiled_ddp, strict=False):
        theirs.add(speed, load)
        if peak:
            mfu.add(100 * fpt * speed / peak, load)
        ratio.add(ours.wall / speed, max(load, load_ours))


def record(
    results: Results,
    args: argparse.Namespace,
    variant: Variant,
    pairs: list[tuple[Speed, Speed, float, float]],
    peak: float,
    fpt: float,
    gpu: bool,
) -> None:
    """One variant's figures: both speeds, the ratios with their interval, MFU."""
    prefix = f"{args.model} {variant.label}"
    wall = [ours.wall / ref.wall for ours, ref, _, _ in pairs]
    cpu = [ours.cpu / ref.cpu for ours, ref, _, _ in pairs]
    trainer_fig = results.figure(f"{prefix}: trainer", "tok/s")
    ref_fig = results.figure(f"{prefix}: plain loop", "tok/s")
    ratio = results.figure(
        f"{prefix}: trainer ÷ plain loop (wall time)", "x", target=Target(TARGET_RATIO, "min")
    )
    cpu_ratio = results.figure(f"{prefix}: trainer ÷ plain loop (CPU time)", "x")
    overhead = results.figure(
        f"{prefix}: trainer overhead (wall time)", "%", target=Target(TARGET_OVERHEAD)
    )
    mfu_target = Target(TARGET_H100_MFU, "min") if gpu and variant.compile else None
    mfu: Figure = results.figure(f"{prefix}: trainer MFU", "%", target=mfu_target)
    ref_mfu = results.figure(f"{prefix}: plain-loop MFU", "%")
    for (ours, ref, load_ours, load_ref), w, c in zip(pairs, wall, cpu, strict=True):
        load = max(load_ours, load_ref)
        trainer_fig.add(ours.wall, load_ours)
        ref_fig.add(ref.wall, load_ref)
        ratio.add(w, load)
        cpu_ratio.add(c, load)
        overhead.add(100 * (1 - w), load)
        if peak:
            mfu.add(100 * fpt * ours.wall / peak, load_ours)
            ref_mfu.add(100 * fpt * ref.wall / peak, load_ref)
    for figure, values in ((ratio, wall), (cpu_ratio, cpu)):
        with contextlib.suppress(ValueError):  # too few pairs: no interval, said by its absence
            low, high = median_interval(values)
            figure.note = f"{CONFIDENCE:.0%} CI of the median {low:.3f}–{high:.3f}"
            results.extra[f"{figure.name} interval"] = [low, high]


if __name__ == "__main__":
    main()
