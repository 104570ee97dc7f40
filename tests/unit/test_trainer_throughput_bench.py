"""bench/trainer_throughput's statistics and its recorded command (nothing is timed here)."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ lives beside torchkube/

from bench.common import Results
from bench.trainer_throughput import (
    Speed,
    command,
    flops_per_token,
    median_interval,
    nanogpt_revision,
    nanogpt_trial,
    parse_args,
    record_nanogpt,
)


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


def test_nanogpt_runs_as_a_third_contender_only_for_the_model_it_has(tmp_path: Path) -> None:
    (tmp_path / "bench.py").write_text("")
    args = parse_args(["--gpu", "--nanogpt", str(tmp_path)])
    assert f"--nanogpt {tmp_path}" in command(args)
    with pytest.raises(SystemExit):
        parse_args(["--gpu", "--model", "llama-1b", "--nanogpt", str(tmp_path)])
    with pytest.raises(SystemExit):
        parse_args(["--gpu", "--nanogpt", str(tmp_path / "elsewhere")])


def test_nanogpt_speed_is_read_from_its_own_line(tmp_path: Path) -> None:
    """bench.py prints per-iteration time over its 20 timed iterations; the flags it is given
    are ours (configurator.py's --key=value), so the batch and sequence are the trainer's."""
    (tmp_path / "bench.py").write_text(
        "import sys\n"
        "assert sys.argv[1:] == ['--batch_size=16', '--block_size=1024', "
        "'--real_data=False', '--compile=True'], sys.argv\n"
        "print('19/20 loss: 10.9')\n"
        "print('time per iteration: 34.3900ms, MFU: 58.32%')\n"
    )
    args = parse_args(["--gpu", "--nanogpt", str(tmp_path)])
    assert nanogpt_trial(args) == pytest.approx(16 * 1024 / 0.03439)
    (tmp_path / "bench.py").write_text("raise SystemExit('no GPU')\n")
    with pytest.raises(RuntimeError, match="no GPU"):
        nanogpt_trial(args)


def test_trainer_against_nanogpt_is_paired_trial_by_trial() -> None:
    args = parse_args(["--gpu"])
    results = Results("trainer_throughput_gpu", "x")
    trainer = [(Speed(w, w), Speed(1.0, 1.0), 0.5, 0.5) for w in (460e3, 470e3, 480e3)]
    nanogpt = [(400e3, 0.4), (500e3, 0.6), (480e3, 0.5)]
    record_nanogpt(results, args, trainer, nanogpt, peak=1e15, fpt=8.55e8)
    by_name = {f.name: f for f in results.figures}
    assert by_name["nanoGPT bench.py"].values == [400e3, 500e3, 480e3]
    ratio = by_name["gpt2 ddp + compile: trainer ÷ nanoGPT bench.py (wall time)"]
    assert ratio.values == pytest.approx([1.15, 0.94, 1.0])
    assert ratio.loads == [0.5, 0.6, 0.5]
    assert by_name["nanoGPT bench.py MFU"].values[0] == pytest.approx(100 * 8.55e8 * 400e3 / 1e15)


def test_nanogpt_revision_is_its_own_never_the_repository_around_it(tmp_path: Path) -> None:
    """Copied files inside this repository (.nanogpt/) carry a REVISION file; git there
    would answer with torchkube's own commit."""
    copied = Path(__file__).resolve().parents[2] / "bench"
    assert nanogpt_revision(copied) == "unknown"
    (tmp_path / "REVISION").write_text("3adf61e1\n")
    assert nanogpt_revision(tmp_path) == "3adf61e1"


def test_kernel_time_counts_each_kernel_once() -> None:
    """An op's row and a user annotation's span (FSDP's, the profiler step's) carry the time
    of the kernels under them; only the device's own events are summed."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from bench.profile_step import kernel_time

    def event(device: DeviceType, micros: float, annotation: bool = False) -> SimpleNamespace:
        return SimpleNamespace(
            device_type=device, self_device_time_total=micros, is_user_annotation=annotation
        )

    events = [
        event(DeviceType.CPU, 100.0),  # aten::mm, its kernels' time
        event(DeviceType.CUDA, 100.0),  # the kernel itself
        event(DeviceType.CUDA, 400.0, annotation=True),  # ProfilerStep* on the device
        event(DeviceType.CUDA, 30.0),
    ]
    assert kernel_time(events) == 130.0
