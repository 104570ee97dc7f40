"""Sustained failures under live recovery, as torchft's own published test measures them.

torchft's test (the PyTorch blog post "Fault Tolerant Llama: training with 2000 synthetic
failures every ~15 seconds and no checkpoints on Crusoe L40S", June 2025,
https://pytorch.org/blog/fault-tolerant-llama-training-with-2000-synthetic-failures-every-15-seconds-and-no-checkpoints-on-crusoe-l40s/:
300 L40S GPUs in 30 replica groups, about 11 s a step) killed a replica group every 60 s
(one loss per ≈ 5.5 steps: 82.3 % of steps committed, 81.2 % training efficiency) and every 15 s
(one per ≈ 1.4 steps: 30.2 %). Here, on this machine's CPU, ``torchkube run`` of
examples/live-recovery.yaml with ``--groups`` replica groups (pods), three ways per trial, in
rotated order, each trial with its own seed:

* **undisturbed**: no loss, the reference for the efficiency and the final loss's spread;
* **one loss per 5.5 steps** and **one per 1.4 steps**: a Poisson process of losses
  (exponential gaps of that many undisturbed steps; ``Chaos.poisson_seed``), each taking
  whatever the victim was doing — a group at random among those of the last quorum (its pod's
  whole tree SIGKILLed, as a node loss; a replacement started since the writer's last report
  is still starting, not that quorum's group: ``kill_candidates``) or, one loss in
  ``--lighthouse-share``, the Lighthouse; the lost pod started again at once, as torchft's
  test restarts its groups, then importing torch and joining from a live peer like any
  replacement;
* **one loss per 1.4 steps with hot spares**: the same, with ``SPARES`` groups standing by
  (``replicas.spares``: started, model built, outside the quorum), one of which takes a lost
  group's place at the next quorum while the lost slot's replacement starts and stands by in
  its turn.

A CPU step of the tiny model takes milliseconds, so every full micro-batch is stretched to
``--micro-batch-seconds`` (``Chaos.compute_seconds``, standing for an accelerator's compute;
a step in proportion to the sequences it computes):
with every group a step is ``step_seconds`` (4 s by default), at least 4× the failure
detection (the Lighthouse's heartbeat timeout, scaled down with the step from its 2 s to
``--heartbeat-timeout-ms``); fewer groups share the same global batch, so a step of seven of
eight groups takes 8/7 as long, as it would on GPUs. Eight groups by default: each loss takes
an eighth of the job's capacity until its replacement has started (torchft's test: a 30th);
with four, a loss of the last groups trained before any replacement is back starts the job
over from its checkpoint, which a 2-core machine's 10 s replacement start makes the common
case at one loss per 1.4 steps. Losses land mid-step in proportion, during a replacement's
start and its copy of the state, during the writer group's checkpoint saves, and on the
Lighthouse.

Per run, read from its logs (:mod:`bench.timeline`) and ``torchkube run``'s own list of the
faults it injected, never from a pace:

- *steps committed*: of every step attempt a group made (torchft's commit vote, ``true`` or
  ``false``, in each group's log), the share committed;
- *training efficiency*: the undisturbed run's seconds per step (its first step to its last)
  ÷ this run's (same trial, same seed);
- *goodput*: the time spent training steps that were kept ÷ the wall time (start-up included);
- *steps finished among the survivors*: the steps whose vote a lost group broke that the
  survivors' next quorum committed with the gradients already computed (``live: step N
  committed among``, distinct steps);
- *steps computed twice*, and *starts from a checkpoint*: the groups that began from the
  newest checkpoint because no live peer was ahead (``live: no live peer ahead; resumed from``
  in their logs) — every group lost at once, or, as each undisturbed run here shows once, a
  group whose first quorum held no group past step 0 while a checkpoint already existed (not
  traced further);
- *unrecoverable*: a run that failed; a run still short of its steps at ``--cap-minutes`` is
  stopped there and counted apart (it was still training);
- each fault by what its victim was doing: the Lighthouse, a group before its first committed
  step (starting, joining, copying the state), or a training group.

Not a test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import timeline
from bench.common import (
    RESULTS_DIR,
    ROOT,
    Results,
    Target,
    command_line,
    fmt,
    load_average,
    log,
    repo_path,
    rotated,
)
from torchkube.api import TrainingJob
from torchkube.local.display import LIGHTHOUSE
from torchkube.local.runner import Chaos, LocalRun

EXAMPLE = ROOT / "examples" / "live-recovery.yaml"
UNDISTURBED = "undisturbed"
SPARES = 2


@dataclass(frozen=True)
class Way:
    """How a run is disturbed: a loss every ``rate`` undisturbed steps on average (None: no
    loss), with ``spares`` hot spares standing by."""

    name: str
    key: str
    """Its name on the command line (``--ways``)."""
    rate: float | None
    spares: int = 0


WAYS = (
    Way(UNDISTURBED, UNDISTURBED, None),
    Way("one loss per 5.5 steps", "5.5", 5.5),
    Way("one loss per 1.4 steps", "1.4", 1.4),
    Way(f"one loss per 1.4 steps, {SPARES} hot spares", "1.4-spares", 1.4, SPARES),
)
BY_NAME = {way.name: way for way in WAYS}
BY_KEY = {way.key: way for way in WAYS}


def chosen(keys: Sequence[str] | None) -> tuple[Way, ...]:
    """The ways ``--ways`` names (all of them by default), the undisturbed one always: it is
    every other way's reference."""
    if keys is None:
        return WAYS
    wanted = {UNDISTURBED, *keys}
    return tuple(way for way in WAYS if way.key in wanted)


TORCHFT = {5.5: (82.3, 81.2), 1.4: (30.2, None)}
"""torchft's published figures at each rate: (% of steps committed, % training efficiency)."""
LIGHTHOUSE_FAULT, STARTING_FAULT, TRAINING_FAULT = (
    "the Lighthouse",
    "a group before its first committed step (start, join, state copy)",
    "a training group (mid-step, between steps, or saving)",
)
NO_PEER = "live: no live peer ahead; resumed from"
FINISHED = re.compile(r"live: step (\d+) committed among \d+ replica groups? without computing")
"""A step whose vote a lost group broke, committed by the survivors' next quorum."""


def job(args: argparse.Namespace, seed: int, spares: int = 0) -> TrainingJob:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    spec = manifest["spec"]
    spec["replicas"] = {"min": 1, "max": args.groups, "spares": spares}
    spec["checkpoint"]["intervalSteps"] = args.checkpoint_interval
    # a loss is expected every few steps: only a group lost again before committing a step
    # counts (the crash-loop rule), and here the chaos, not the group, decides that
    spec["failurePolicy"]["maxRestarts"] = 100000
    trainer = spec["trainer"]
    trainer |= {"steps": args.steps, "seed": seed, "logIntervalSteps": 1}
    trainer |= {"globalBatchSize": args.global_batch, "warmupSteps": 5}
    return TrainingJob.model_validate(manifest)


def classify(
    fault_at: float, victim_log: str | None, events: Sequence[timeline.Event], since: float
) -> str:
    """What the victim was doing: a worker with no commit in its log since it was last
    started (``since``: its previous loss, or the launch) had not trained yet."""
    if victim_log is None:
        return LIGHTHOUSE_FAULT
    committed = any(
        e.log == victim_log and e.kind == "commit" and since <= e.at <= fault_at for e in events
    )
    return TRAINING_FAULT if committed else STARTING_FAULT


def step_seconds(args: argparse.Namespace) -> float:
    """A step's stretched length with every group: its micro-batches per group times each."""
    return args.micro_batch_seconds * args.global_batch / (args.groups * args.micro_batch)


def run_once(args: argparse.Namespace, way: Way, seed: int) -> dict[str, Any]:
    rate = way.rate
    step = step_seconds(args)
    chaos = (
        Chaos()
        if rate is None
        else Chaos(
            every_seconds=rate * step,
            poisson_seed=seed,
            lighthouse_share=args.lighthouse_share,
        )
    )
    chaos.compute_seconds = args.micro_batch_seconds
    with tempfile.TemporaryDirectory(prefix="live-sustained-") as folder:
        run = LocalRun(
            job(args, seed, way.spares),
            Path(folder),
            chaos=chaos,
            out=io.StringIO(),
            heartbeat_timeout_ms=args.heartbeat_timeout_ms,
        )
        launched = time.time()
        offset = launched - time.monotonic()
        cap = threading.Timer(args.cap_minutes * 60, run.stop)
        cap.start()
        try:
            summary = run.run()
        finally:
            cap.cancel()
        load = load_average()
        logs = sorted(run.log_dir.glob("worker-*.log"))
        seen = timeline.Timeline.of(logs)
        texts = [path.read_text() for path in logs]
        whole_job = sum(text.count(NO_PEER) for text in texts)
        finished = {int(step) for text in texts for step in FINISHED.findall(text)}
    found = timeline.figures(seen, launched)
    commits = sum(1 for e in seen.events if e.kind == "commit")
    discards = sum(1 for e in seen.events if e.kind == "discard")
    windows = seen.windows
    faults: Counter[str] = Counter()
    last_loss: dict[int, float] = {}
    for fault in (f for f in run.failures if f.reason == "killed (chaos)"):
        at = fault.at + offset
        victim = None if fault.worker == LIGHTHOUSE else f"worker-{fault.worker}.log"
        faults[classify(at, victim, seen.events, last_loss.get(fault.worker, launched))] += 1
        last_loss[fault.worker] = at
    return {
        "way": way.name,
        "seed": seed,
        "succeeded": summary.succeeded,
        "capped": not summary.succeeded and run.stopped_by_caller,
        "message": summary.message,
        "steps": summary.steps,
        "faults": sum(faults.values()),
        "faults_by_victim": dict(faults),
        "commits": commits,
        "discards": discards,
        "committed_share": commits / (commits + discards) if commits + discards else None,
        "first_to_last_step_seconds": (
            max(w.ended for w in windows) - min(w.began for w in windows) if windows else None
        ),
        "goodput": found.goodput if found else None,
        "steps_computed_twice": found.steps_computed_twice if found else None,
        "steps_finished_among_survivors": len(finished),
        "whole_job_restarts": whole_job,
        "final_loss": summary.loss,
        "wall_seconds": summary.wall_seconds,
        "restarts": summary.restarts,
        "load": load,
    }


def measure(
    args: argparse.Namespace, after_each: Callable[[list[dict[str, Any]]], None]
) -> list[dict[str, Any]]:
    """Every way ``args.trials`` times in rotated order; ``after_each`` gets the runs so far
    after every run, so a session cut short keeps what it measured."""
    trials: list[dict[str, Any]] = []
    for trial in range(args.trials):
        for position, way in enumerate(rotated(chosen(args.ways), trial), start=1):
            log(f"trial {trial + 1}, {way.name}")
            found = run_once(args, way, seed=args.seed + trial)
            found |= {"trial": trial + 1, "position": position}
            log(
                f"  {found['faults']} faults, committed {fmt_share(found['committed_share'])}, "
                f"{outcome(found)}"
            )
            trials.append(found)
            after_each(trials)
    return trials


def fmt_share(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def per_step(run: dict[str, Any]) -> float | None:
    """Seconds from the first step to the last one reached, per step (a capped run's too)."""
    took, steps = run["first_to_last_step_seconds"], run["steps"]
    return took / steps if took and steps else None


def outcome(run: dict[str, Any]) -> str:
    if run["succeeded"]:
        return "finished"
    if run["capped"]:
        return f"capped at step {run['steps']}"
    return f"failed: {run['message']}"


def figures(results: Results, trials: list[dict[str, Any]], cap_minutes: float, steps: int) -> None:
    reference = {
        t["trial"]: per_step(t) for t in trials if t["way"] == UNDISTURBED and t["succeeded"]
    }
    for way in (w.name for w in WAYS if any(t["way"] == w.name for t in trials)):
        rate = BY_NAME[way].rate
        runs = [t for t in trials if t["way"] == way]
        committed_target = efficiency_target = None
        if rate is not None:
            share, efficiency = TORCHFT[rate]
            committed_target = Target(share, "min", f"> torchft's {share} %")
            if efficiency is not None:
                efficiency_target = Target(efficiency, "min", f"> torchft's {efficiency} %")
        committed = results.figure(
            f"{way}: steps committed (commit votes, runs that finished)",
            "%",
            target=committed_target,
        )
        efficient = results.figure(
            f"{way}: training efficiency (undisturbed seconds per step ÷ this run's)",
            "%",
            target=efficiency_target,
        )
        goodput = results.figure(f"{way}: goodput (kept training ÷ wall)", "%")
        final = results.figure(f"{way}: final loss (finished runs)", "")
        for run in runs:
            # a run stopped at the cap voted on the few attempts its groups lived to finish
            if run["committed_share"] is not None and run["succeeded"]:
                committed.add(100 * run["committed_share"], run["load"])
            base, took = reference.get(run["trial"]), per_step(run)
            if base and took:
                efficient.add(100 * base / took, run["load"])
            if run["goodput"] is not None:
                goodput.add(100 * run["goodput"], run["load"])
            if run["final_loss"] is not None and run["succeeded"]:
                final.add(run["final_loss"], run["load"])
        if rate is not None:
            injected = sum(run["faults"] for run in runs)
            failed = results.figure(
                f"{way}: runs failed (unrecoverable; 1 a run), of {len(runs)} with {injected} "
                "faults",
                "",
                target=Target(0, text="0 in every run", every=True),
            )
            capped = results.figure(
                f"{way}: runs short of their steps at the {cap_minutes:g}-minute cap (1 a run)",
                "",
            )
            for run in runs:
                failed.add(int(not run["succeeded"] and not run["capped"]), run["load"])
                capped.add(int(run["capped"]), run["load"])
            reached = results.figure(f"{way}: steps reached, of {steps}", "")
            for run in runs:
                reached.add(run["steps"], run["load"])


def tables(results: Results, trials: list[dict[str, Any]]) -> None:
    rows = []
    for t in trials:
        rows.append(
            [
                str(t["trial"]),
                t["way"],
                str(t["seed"]),
                str(t["faults"]),
                fmt_share(t["committed_share"]),
                fmt_share(t["goodput"]),
                str(t["steps_computed_twice"]),
                str(t.get("steps_finished_among_survivors", "–")),
                str(t["whole_job_restarts"]),
                "–" if t["final_loss"] is None else f"{t['final_loss']:.4f}",
                outcome(t),
                fmt(t["wall_seconds"], "s"),
                f"{t['load']:.1f}",
            ]
        )
    results.tables["every run, in the order run"] = (
        [
            "trial",
            "way",
            "seed",
            "faults",
            "steps committed",
            "goodput",
            "steps computed twice",
            "steps finished among the survivors",
            "starts from a checkpoint",
            "final loss",
            "outcome",
            "wall",
            "load",
        ],
        rows,
    )
    by_victim: Counter[str] = Counter()
    for t in trials:
        by_victim.update(t["faults_by_victim"])
    total = sum(by_victim.values())
    results.tables["the faults injected, by what their victim was doing"] = (
        ["victim", "faults"],
        [
            [victim, str(by_victim[victim])]
            for victim in (LIGHTHOUSE_FAULT, STARTING_FAULT, TRAINING_FAULT)
        ]
        + [["all", str(total)]],
    )
    losses = [t["final_loss"] for t in trials if t["way"] == UNDISTURBED and t["succeeded"]]
    if losses:
        low, high = min(losses), max(losses)
        inside = [t for t in trials if t["way"] != UNDISTURBED and t["final_loss"] is not None]
        within = sum(1 for t in inside if low <= t["final_loss"] <= high)
        results.extra["final_loss_spread"] = [low, high]
        results.notes.append(
            f"final loss: the undisturbed runs (one per seed) ended between {low:.4f} and "
            f"{high:.4f}; {within} of the {len(inside)} disturbed runs ended inside that spread."
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.live_sustained", description=__doc__)
    parser.add_argument("--trials", type=int, default=3, help="runs per way, each its own seed")
    parser.add_argument("--steps", type=int, default=50, help="steps of every run")
    parser.add_argument("--groups", type=int, default=8, help="replica groups (pods)")
    parser.add_argument("--global-batch", type=int, default=96, help="sequences per step")
    parser.add_argument("--micro-batch", type=int, default=4, help="the example's micro-batch")
    parser.add_argument(
        "--micro-batch-seconds",
        type=float,
        default=4 / 3,
        help="each full micro-batch's stretched compute: with 8 groups of 96 sequences, 3 "
        "micro-batches a step",
    )
    parser.add_argument(
        "--heartbeat-timeout-ms",
        type=int,
        default=1000,
        help="the Lighthouse's failure detection: at most a quarter of a step",
    )
    parser.add_argument("--checkpoint-interval", type=int, default=20)
    parser.add_argument("--lighthouse-share", type=float, default=0.1)
    parser.add_argument(
        "--cap-minutes",
        type=float,
        default=14.0,
        help="a run still short of its steps then is stopped (SIGTERM, as a deletion) and "
        "recorded as not finished within the cap, apart from a run that failed",
    )
    parser.add_argument("--seed", type=int, default=1, help="the first trial's seed")
    parser.add_argument(
        "--ways",
        type=lambda text: text.split(","),
        default=None,
        help=f"only these ways (of {', '.join(BY_KEY)}; comma-separated), beside the "
        "undisturbed one, their reference",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the record goes")
    parser.add_argument(
        "--from-record",
        type=Path,
        default=None,
        help="run nothing: sum the runs of this record again (its settings, machine and runs "
        "kept) into its figures, tables and notes",
    )
    args = parser.parse_args(argv)
    if args.ways is not None and (unknown := set(args.ways) - set(BY_KEY)):
        parser.error(f"unknown ways {sorted(unknown)}; use {', '.join(BY_KEY)}")
    if args.from_record is not None:
        rederive(args.from_record, args.out)
        return
    config = {k: repo_path(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    command = command_line("bench.live_sustained", argv)

    def write(trials: list[dict[str, Any]]) -> None:
        results = Results("live_sustained", command, config=dict(config))
        summarise(results, trials, args)
        results.write(args.out)

    measure(args, write)


def rederive(record: Path, out: Path) -> None:
    """The figures, tables and notes summed again from the runs a record holds (its command,
    settings, machine and runs kept): how they are summed may change, the runs may not."""
    body = json.loads(record.read_text())
    settings = argparse.Namespace(**body["config"])
    results = Results(body["benchmark"], body["command"], config=body["config"])
    results.machine = body["machine"]
    summarise(results, body["extra"]["trials"], settings)
    results.notes.append(
        "summed again from the runs above by `python -m bench.live_sustained --from-record` "
        "(the machine's load average at the end is that moment's, each run's is its own)."
    )
    results.write(out)


def summarise(results: Results, trials: list[dict[str, Any]], args: argparse.Namespace) -> None:
    step = step_seconds(args)
    results.config["step_seconds_all_groups"] = round(step, 3)
    results.extra["trials"] = trials
    figures(results, trials, args.cap_minutes, args.steps)
    tables(results, trials)
    results.notes[:0] = [
        f"{args.groups} replica groups of one process (tiny GPT, gloo), {args.steps} steps of "
        f"{args.global_batch} sequences, each full micro-batch of {args.micro_batch} stretched "
        f"to {args.micro_batch_seconds:.2f} s, a step in proportion to its sequences: "
        f"{step:.1f} s with every group, longer with fewer; the Lighthouse's heartbeat "
        f"timeout {args.heartbeat_timeout_ms} ms; a checkpoint every {args.checkpoint_interval} "
        "steps; the Poisson losses' mean gap is the rate × "
        f"{step:.1f} s; {100 * args.lighthouse_share:.0f} % of them hit the Lighthouse; a lost "
        "pod started again at once; the victims are the last quorum's groups (not a "
        f"replacement still starting); the hot spares' way adds {SPARES} standby groups.",
        "torchft's figures (30 groups of 10 L40S, ≈ 11 s a step): a loss every 60 s, 82.3 % "
        "of steps committed and 81.2 % training efficiency; every 15 s, 30.2 % committed. "
        f"With {args.groups} groups here, each loss takes 1/{args.groups} of the job's "
        "capacity until its replacement has started (torch imported on a 2-core machine, "
        "about 10 s) — a 30th there.",
    ]


if __name__ == "__main__":
    main()
