"""bench/trainer_throughput's statistics and its recorded command (nothing is timed here)."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ lives beside torchkube/

from bench.trainer_throughput import command, flops_per_token, median_interval, parse_args


def coverage(n: int, low_rank: int) -> float:
    """P(order statistics low_rank and n + 1 − low_rank enclose the median), exactly."""
    inside = sum(math.comb(n, j) for j in range(low_rank, n - low_rank + 1))
    return inside / 2**n


@pytest.mark.parametrize("n", [6, 8, 12, 16, 25])
def test_median_interval_is_the_narrowest_with_95_percent_coverage(n: int) -> None:
    values = [float(v) for v in range(100, 100 + n)]
    low, high = median_interval(list(reversed(values)))
    k = values.index(low) + 1
    assert high == values[n - k]
    assert coverage(n, k) >= 0.95 > coverage(n, k + 1)


def test_median_interval_needs_six_values() -> None:
    with pytest.raises(ValueError, match="too few"):
        median_interval([1.0, 2.0, 3.0, 4.0, 5.0])


def test_recorded_command_spells_out_every_setting() -> None:
    args = parse_args(["--trials", "14"])
    assert command(args) == (
        "python -m bench.trainer_throughput --model small --seq-len 128 --micro-batch 4 "
        f"--steps 20 --warmup 5 --log-every 5 --trials 14 --threads {args.threads} "
        "--strategies ddp --compile off"
    )
    assert parse_args(command(args).split()[3:]) == args


@pytest.mark.parametrize("model", ["small", "llama-small"])
def test_flops_per_token_come_from_the_presets_model(model: str) -> None:
    """GPT and Llama presets alike, counted by the model the trainer builds."""
    args = parse_args(["--model", model])
    assert flops_per_token(args) > 6 * 10e6  # both are ~10 M parameters and more


def test_the_gpu_figures_are_for_gpt2_small_with_gpt2s_vocabulary() -> None:
    """MFU on the GPU is quoted for GPT-2 small, so its head multiplies into GPT-2's vocabulary
    (the bundled corpus is bytes): FLOPs per token by nanoGPT's convention, 6·N + 12·L·H·Q·T
    with N the parameters less the position embedding (nanoGPT prints 123.69M for this model,
    the tied token embedding counted once, as the head's matmul)."""
    args = parse_args(["--gpu"])
    assert args.vocab_size == 50304
    assert flops_per_token(args) == 6 * 123_689_472 + 12 * 12 * 12 * 64 * 1024
    assert "--vocab-size 50304" in command(args)
    assert parse_args(["--gpu", "--model", "llama-1b"]).vocab_size == 128256
