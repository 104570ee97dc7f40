"""Peak host memory per rank of FSDP2 training with gradient accumulation, on CPU.

Run: ``python -m bench.trainer_memory`` (≈ 4 min on 2 cores). Two ranks under torchrun (gloo,
one thread each) train the ``small`` preset (6 layers × 384) with FSDP2, micro batch 4,
accumulation 4, sequence 128, in two variants, alternating, in the same run:

- **reduce-scatter every micro-step**: the trainer as it is (``parallel.gradient_sync``);
- **gradient sync off until the last micro-step**: the trainer's behaviour before issue #16,
  reproduced here by replacing ``gradient_sync`` with the old one, which called
  ``set_requires_gradient_sync(False)`` on non-final micro-steps, so FSDP2 kept a full
  unsharded gradient on every rank until the last one.

Each rank reports its peak resident memory (``VmHWM``) at the end. glibc is told to serve
every allocation over 64 KiB with its own mapping (``MALLOC_MMAP_THRESHOLD_``), so freed
tensors go back to the system and the peak follows the live tensors instead of the
allocator's caching; everything else a rank holds (torch itself, the model, AdamW's state,
activations) is the same in both variants, so the difference is the gradients'.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import ROOT, Results, load_average, log

VARIANTS = {
    "every": "reduce-scatter every micro-step",
    "last": "gradient sync off until the last micro-step (before)",
}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


@contextlib.contextmanager
def _sync_only_on_the_last_micro_step(model: Any, enabled: bool) -> Iterator[None]:
    """``parallel.gradient_sync`` as it was before issue #16 (FSDP2 branch)."""
    model.set_requires_gradient_sync(enabled)
    yield


def worker(args: argparse.Namespace) -> None:
    """One rank: train, then write this rank's memory figures to ``args.out``."""
    from torchkube.api.trainer import TrainerSpec
    from torchkube.trainer import train
    from torchkube.trainer.loader import RunEnv

    if args.variant == "last":
        train.gradient_sync = _sync_only_on_the_last_micro_step
    spec = TrainerSpec.model_validate(
        {
            "model": "small",
            "device": "cpu",
            "strategy": "fsdp",
            "seqLen": args.seq_len,
            "microBatchSize": args.micro_batch,
            "globalBatchSize": args.micro_batch * args.accumulation * args.ranks,
            "steps": args.steps,
            "warmupSteps": 1,
            "logIntervalSteps": args.steps,
        }
    )
    code = train.run(spec, RunEnv(job_name="bench", checkpoint_dir=None))
    if code != 0:
        raise SystemExit(code)
    rank = int(os.environ["RANK"])
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps({"peak_kib": _status_kib("VmHWM")}))


def trial(args: argparse.Namespace, variant: str) -> list[dict[str, int]]:
    """One torchrun launch of ``args.ranks`` ranks; each rank's figures."""
    with tempfile.TemporaryDirectory(prefix="torchkube-bench-memory-") as out:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "MALLOC_MMAP_THRESHOLD_": "65536",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        }
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.ranks}",
            "-m",
            "bench.trainer_memory",
            "--worker",
            f"--variant={variant}",
            f"--out={out}",
            *flags(args),
        ]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(args.ranks)]


def flags(args: argparse.Namespace) -> list[str]:
    return [
        f"--ranks={args.ranks}",
        f"--micro-batch={args.micro_batch}",
        f"--accumulation={args.accumulation}",
        f"--seq-len={args.seq_len}",
        f"--steps={args.steps}",
    ]


def gradient_mib() -> float:
    """A full fp32 gradient of the ``small`` preset (vocabulary 320, as on the sample data)."""
    from dataclasses import replace

    import torch

    from torchkube.trainer.model import GPT, PRESETS

    with torch.device("meta"):
        model = GPT(replace(PRESETS["small"], vocab_size=320, block_size=128))
    return sum(p.numel() for p in model.parameters()) * 4 / 2**20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer_memory", description=__doc__)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--trials", type=int, default=3, help="launches per variant")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return

    command = " ".join(["python -m bench.trainer_memory", *flags(args), f"--trials={args.trials}"])
    results = Results("trainer_memory", command, config=dict(vars(args)))
    peaks = {
        v: results.figure(f"FSDP2, {text}: peak RSS per rank", "MiB")
        for v, text in VARIANTS.items()
    }
    for number in range(args.trials):
        for variant in VARIANTS if number % 2 == 0 else reversed(VARIANTS):
            ranks = trial(args, variant)
            load = load_average()
            for rank in ranks:
                peaks[variant].add(rank["peak_kib"] / 1024, load)
            log(f"{variant} trial {number + 1}: peaks {[r['peak_kib'] // 1024 for r in ranks]} MiB")
    full = gradient_mib()
    results.notes += [
        f"small preset (6 layers × 384, vocabulary 320), sequence {args.seq_len}, micro batch "
        f"{args.micro_batch} × accumulation {args.accumulation} × {args.ranks} ranks, fp32, "
        f"CPU, gloo, one thread per rank, {args.steps} steps per launch; every rank of every "
        "launch is one value",
        f"a full fp32 gradient of this model is {full:.1f} MiB; FSDP2's sharded gradient "
        f"{full / args.ranks:.1f} MiB per rank",
        "MALLOC_MMAP_THRESHOLD_=65536: allocations over 64 KiB are mapped and unmapped on their "
        "own, so the peak follows the live tensors",
    ]
    results.write()


if __name__ == "__main__":
    main()
