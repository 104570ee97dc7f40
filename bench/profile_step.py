"""Where a trainer step's time goes: ``torch.profiler`` over a few steady steps of the trainer
exactly as ``bench.trainer_throughput`` runs it (one process, no checkpoints), for a variant
that falls behind its plain loop.

``python -m bench.profile_step --gpu --strategy fsdp --compile`` prints the step's wall time,
the device's busy share of it (kernels' time ÷ wall: well under 1 means the host leaves the GPU
waiting), and the ops that take the most host time and the most device time. A diagnosis, not
a benchmark: it writes no record. ``--trace FILE`` keeps the Chrome trace as well.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench.trainer_throughput import StepTimes, Variant, make_spec, run_trainer
from bench.trainer_throughput import parse_args as throughput_args


def kernel_time(events: Any) -> float:
    """Microseconds the device spent in kernels: its own events only, as the profiler's table
    totals them (an op's row and a user annotation's span repeat their kernels' time)."""
    from torch.autograd import DeviceType

    return float(
        sum(
            e.self_device_time_total
            for e in events
            if e.device_type == DeviceType.CUDA and not e.is_user_annotation
        )
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_step", description=__doc__)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--model", default=None)
    parser.add_argument("--strategy", default="fsdp", choices=["ddp", "fsdp", "zero1"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--wait", type=int, default=20, help="steps before profiling")
    parser.add_argument("--active", type=int, default=8, help="steps profiled")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--trace", type=Path, default=None, help="write the Chrome trace here")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    from torch.profiler import ProfilerActivity, profile, schedule

    bench = throughput_args(
        [
            *(["--gpu"] if args.gpu else []),
            *(["--model", args.model] if args.model else []),
            *["--log-every", "1", "--warmup", str(args.wait), "--steps", str(args.active + 4)],
        ]
    )
    spec = make_spec(bench, Variant(args.strategy, args.compile), bench.warmup + bench.steps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.gpu else [])
    warmup = 2
    with profile(
        activities=activities,
        schedule=schedule(wait=args.wait - warmup, warmup=warmup, active=args.active, repeat=1),
    ) as profiler:
        steps = StepTimes(on_step=profiler.step)  # the trainer logs every step here
        run_trainer(spec, steps, "profile")
    times = {step: created for step, created, _ in steps.steps}
    wall = (times[args.wait + args.active] - times[args.wait]) / args.active
    events = profiler.key_averages()
    device_us = kernel_time(events) / args.active
    label = f"{spec.model} {Variant(args.strategy, args.compile).label}"
    print(f"{label}: {wall * 1e3:.1f} ms a step (wall), {spec.tokens_per_step / wall:,.0f} tok/s")
    if args.gpu:
        print(
            f"kernels {device_us / 1e3:.1f} ms a step: {device_us / 1e6 / wall:.0%} of the "
            "profiled wall time (the profiler slows the host, so the share unprofiled is higher)"
        )
    for sort, what in (("self_cpu_time_total", "host"), ("self_device_time_total", "device")):
        if what == "host" or args.gpu:
            print(f"\nmost {what} time ({args.active} steps):")
            print(events.table(sort_by=sort, row_limit=args.rows, max_name_column_width=70))
    if args.trace:
        profiler.export_chrome_trace(str(args.trace))


if __name__ == "__main__":
    main()
