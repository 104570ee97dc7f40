"""``failurePolicy.recovery: live`` against ``restart``, on this machine's CPU (``torchkube run``).

The same job (examples/live-recovery.yaml: two workers, one process each, tiny GPT, gloo):

* steady state, no failure: each mode's seconds per step from step ``--from-step`` to the
  end (start-up left out: restart mode's rendezvous waits for both agents, live mode starts
  with the first group), alternating the modes trial by trial so a change of load hits both —
  live mode's per-step quorum, commit vote and all-reduce outside the backward pass against
  DDP's overlapped buckets;
* one SIGKILL of worker 1 at ``--kill-at``: for live, the survivor's longest step after its
  first (its progress record's ``live.longestStepSeconds``) and the attempts it discarded; for
  restart, the time from the kill until training passed the step it stopped at, and the steps
  computed twice (the kill step less the checkpoint resumed from).

Writes bench/results/live_recovery.json, with the failure rate above which live mode's
steady cost is repaid. Not a test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import ROOT, Figure, Results, Target, load_average, log
from torchkube.api import TrainingJob
from torchkube.elastic.lighthouse import HEARTBEAT_TIMEOUT_MS
from torchkube.local.runner import Chaos, LocalRun

EXAMPLE = ROOT / "examples" / "live-recovery.yaml"
MODES = ("restart", "live")


def job(recovery: str, steps: int) -> TrainingJob:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["failurePolicy"]["recovery"] = recovery
    manifest["spec"]["trainer"]["steps"] = steps
    return TrainingJob.model_validate(manifest)


def run_once(recovery: str, steps: int, kill_at: int | None, from_step: int) -> dict[str, Any]:
    """One local run; what it measured."""
    chaos = Chaos(at_steps=[kill_at], worker=1) if kill_at is not None else Chaos()
    with tempfile.TemporaryDirectory(prefix="live-bench-") as folder:
        run = LocalRun(job(recovery, steps), Path(folder), chaos=chaos, out=io.StringIO())
        load = load_average()
        began = time.monotonic()
        seen: list[tuple[float, int]] = []  # (when, step) each time the record's step moved

        def watch(_line: str) -> None:
            report = run.progress()
            if report is not None and (not seen or report.step != seen[-1][1]):
                seen.append((time.monotonic(), report.step))

        summary = run.run(on_progress=watch)
        wall = time.monotonic() - began
        record = run.progress()
    assert summary.succeeded, summary.render()
    out: dict[str, Any] = {"recovery": recovery, "wall_seconds": round(wall, 2), "load": load}
    start = next(((t, s) for t, s in seen if s >= from_step), None)
    if start is not None and seen[-1][1] > start[1]:
        out["seconds_per_step"] = round((seen[-1][0] - start[0]) / (seen[-1][1] - start[1]), 4)
    if kill_at is None:
        return out
    failure = summary.failures[0]
    out["killed_at_step"] = failure.step
    out["kill_to_next_step_seconds"] = round(failure.lost_seconds or float("nan"), 2)
    if recovery == "live":
        live = record.live if record is not None else None
        out["survivor_longest_step_seconds"] = live.longest_step_seconds if live else None
        out["discarded_attempts"] = live.discarded_steps if live else None
        out["steps_computed_twice"] = 0
    else:
        out["resumed_from"] = failure.checkpoint_step or 0
        out["steps_computed_twice"] = failure.step - out["resumed_from"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.live_recovery", description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--trials", type=int, default=3, help="steady-state runs per mode")
    parser.add_argument("--kill-at", type=int, default=60)
    parser.add_argument("--from-step", type=int, default=50, help="steady state from here")
    args = parser.parse_args(argv)
    results = Results("live_recovery", "python -m bench.live_recovery", config=vars(args))
    per_step = {mode: results.figure(f"{mode}: steady seconds per step", "s") for mode in MODES}
    cost = results.figure(
        "live steady-state cost (pairs)", "%", target=Target(3.0, text="≤ 3 % slower")
    )
    for trial in range(args.trials):
        order = MODES if trial % 2 == 0 else MODES[::-1]
        pair = {}
        for mode in order:
            log(f"steady state, trial {trial + 1}: {mode}")
            found = run_once(mode, args.steps, None, args.from_step)
            pair[mode] = found["seconds_per_step"]
            per_step[mode].add(pair[mode], found["load"])
        cost.add(100 * (pair["live"] / pair["restart"] - 1))
    kills = {}
    for mode in MODES:
        log(f"SIGKILL of worker 1 at step {args.kill_at}: {mode}")
        kills[mode] = run_once(mode, args.steps, args.kill_at, args.from_step)
    live_step = per_step["live"].stats
    detection = HEARTBEAT_TIMEOUT_MS / 1000
    bound = 2 * (live_step.median if live_step else 0.0) + detection
    for mode in MODES:
        results.figure(f"{mode}: kill → next step", "s").add(
            kills[mode]["kill_to_next_step_seconds"], kills[mode]["load"]
        )
    results.figure(
        "live: the survivor's longest step",
        "s",
        target=Target(bound, text=f"≤ 2 × a step + {detection:.0f} s detection"),
    ).add(kills["live"]["survivor_longest_step_seconds"], kills["live"]["load"])
    for mode in MODES:
        results.figure(
            f"{mode}: steps computed twice",
            "steps",
            target=Target(0) if mode == "live" else None,
        ).add(kills[mode]["steps_computed_twice"], kills[mode]["load"])
    results.extra = {"kills": kills}
    results.notes += [
        f"examples/live-recovery.yaml, {args.steps} steps, checkpoint every 100 steps; the "
        f"restart run resumed from step {kills['restart'].get('resumed_from', 0)}.",
        break_even(per_step, kills),
    ]
    results.write()


def break_even(per_step: dict[str, Figure], kills: dict[str, dict[str, Any]]) -> str:
    """The failure rate above which live mode's steady cost is repaid by its cheaper losses."""
    restart, live = per_step["restart"].stats, per_step["live"].stats
    if restart is None or live is None:
        return "break-even: not measured"
    cost = live.median / restart.median - 1
    lost_restart = (
        kills["restart"]["kill_to_next_step_seconds"]
        + kills["restart"]["steps_computed_twice"] * restart.median
    )
    saved = lost_restart - kills["live"]["kill_to_next_step_seconds"]
    if cost <= 0:
        return (
            f"break-even: live was not slower in steady state here ({cost:+.1%}), so it wins at "
            f"any failure rate; each loss cost restart {lost_restart:.1f} s of training time "
            f"and live {kills['live']['kill_to_next_step_seconds']:.1f} s"
        )
    per_hour = saved / (cost * 3600)
    return (
        f"break-even: live costs {cost:.1%} of every hour and saves {saved:.1f} s per loss, so "
        f"it wins above {per_hour:.2f} losses per hour (one every {60 / per_hour:.0f} min)"
        if per_hour > 0
        else "break-even: live saved nothing per loss here"
    )


if __name__ == "__main__":
    main()
