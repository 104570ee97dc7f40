"""One worker's training process SIGKILLed mid-run, three ways, on this machine's CPU:
``failurePolicy.recovery: restart`` and ``recovery: live`` (``torchkube run``), and plain
``torchrun`` (:mod:`bench.plain_torchrun`: two stock agents, one process each, the same as two
pods, c10d rendezvous on loopback, ``--max-restarts``, the same trainer, checkpoints in a
shared folder). The job is examples/live-recovery.yaml (two workers, tiny GPT, gloo), only
``steps`` changed.

Two parts, each alternating the ways trial by trial so a change of the shared machine's load
hits them alike; every figure carries the load average at the end of its run:

* **steady state**, no failure, restart and live: seconds per step from ``--from-step`` on, and
  torchft's own cost isolated in the live loop (the progress record's ``live.stepTime``:
  seconds in the per-step quorum and the commit vote, and in the all-reduce through the
  Manager, summed over the writer group's committed steps after its first);
* **the failure**: worker 1's training process SIGKILLed once the progress record shows
  ``--kill-at`` (its launcher lives on and starts it again: a crash, not a node loss), the same
  kill for the three ways. From the progress records as they change (written every 10 steps
  and when a round starts) and the worker logs:

  - *the survivors' longest step around the failure*: live, the writer group's own longest
    step (``live.longestStepSeconds``); restart and plain torchrun, whose survivors do not step
    through the failure but are restarted with the round, kill → the new round's first
    progress record past its start (includes up to 10 steps);
  - *steps computed twice*: restart and plain torchrun, the step the record showed at the kill
    less the step the new round started from (a lower bound: up to 9 steps past the record
    are not seen); live, none (an attempt the survivor discarded is counted apart);
  - *kill → the replacement trains*: restart and plain torchrun, kill → the new round's start
    record (written after the checkpoint load, before its first step); live, kill → the
    replacement's ``joined from a live peer`` log line (the state copied, before its first
    step);
  - *kill → back past the kill step*: kill → the first record past the step shown at the kill;
  - *goodput over the run*: the steps times the run's own median step time (record to record)
    over the wall time from launch to the last step: start-up, the failure, the steps redone
    and checkpoint saves are the rest;
  - *final loss*: the last record's (restart and torchrun: the mean over both ranks of the last
    10 steps; live: the writer group's).

Writes bench/results/live_recovery.json, with the failure rate above which live mode's
isolated steady cost is repaid (:func:`break_even_per_hour`). Not a test: it asserts nothing
about time.
"""

from __future__ import annotations

import argparse
import io
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.common import ROOT, Figure, Results, Target, fmt, load_average, log, spread
from bench.plain_torchrun import PlainTorchrun
from bench.recovery_e2e import read_log
from torchkube.api import TrainingJob
from torchkube.api.contract import LiveStepTime, ProgressReport
from torchkube.elastic.lighthouse import HEARTBEAT_TIMEOUT_MS
from torchkube.local.runner import Chaos, LocalRun

EXAMPLE = ROOT / "examples" / "live-recovery.yaml"
WAYS = ("restart", "live", "torchrun")
LABELS = {"restart": "recovery: restart", "live": "recovery: live", "torchrun": "plain torchrun"}
STEADY = ("restart", "live")
VICTIM = 1
JOINED = "live: joined from a live peer"


def job(recovery: str, steps: int, global_batch: int | None = None) -> TrainingJob:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["failurePolicy"]["recovery"] = recovery
    manifest["spec"]["trainer"]["steps"] = steps
    if global_batch is not None:
        manifest["spec"]["trainer"]["globalBatchSize"] = global_batch
    return TrainingJob.model_validate(manifest)


# ----------------------------------------------------------------------------- one run
@dataclass
class Observed:
    """What the bench saw of one run, in Unix time: the progress records as they changed,
    the kill, and (live) when the replacement joined."""

    began: float
    records: list[tuple[float, ProgressReport]] = field(default_factory=list)
    killed_at: float | None = None
    killed_step: int | None = None
    joined_at: float | None = None
    load: float = 0.0
    ended: float = 0.0

    @property
    def timeline(self) -> dict[str, float | None]:
        """Launch → the first step shown, and → the run's end (seconds): a slow start shows."""
        first = next((t for t, r in self.records if r.step > 0), None)
        return {
            "first_step_seconds": None if first is None else round(first - self.began, 2),
            "wall_seconds": round(self.ended - self.began, 2),
        }

    def watch(self, record: ProgressReport | None) -> None:
        if record is not None and (not self.records or record != self.records[-1][1]):
            self.records.append((time.time(), record))

    @property
    def final(self) -> ProgressReport | None:
        return self.records[-1][1] if self.records else None


def run_torchkube(
    recovery: str, steps: int, kill_at: int | None, global_batch: int | None = None
) -> Observed:
    """``torchkube run`` of the job; with ``kill_at``, worker 1's training process is
    SIGKILLed once the record shows that step (``Chaos.crash_at_steps``)."""
    chaos = Chaos(crash_at_steps=[kill_at], worker=VICTIM) if kill_at is not None else Chaos()
    with tempfile.TemporaryDirectory(prefix="live-bench-") as folder:
        run = LocalRun(
            job(recovery, steps, global_batch), Path(folder), chaos=chaos, out=io.StringIO()
        )
        seen = Observed(began=time.time())
        offset = seen.began - time.monotonic()
        summary = run.run(on_progress=lambda _line: seen.watch(run.progress()))
        seen.watch(run.progress())
        seen.load, seen.ended = load_average(), time.time()
        if run.failures:
            seen.killed_at, seen.killed_step = run.failures[0].at + offset, run.failures[0].step
            seen.joined_at = joined_at(run.log_dir / f"worker-{VICTIM}.log", seen.killed_at)
    assert summary.succeeded, summary.render()
    return seen


def run_torchrun(steps: int, kill_at: int, timeout: float) -> Observed:
    """Plain torchrun of the restart-mode job, the same kill: its default rendezvous settings,
    the rendezvous store not shared with the workers (:class:`PlainTorchrun`)."""
    with tempfile.TemporaryDirectory(prefix="live-bench-torchrun-") as folder:
        run = PlainTorchrun(job("restart", steps), Path(folder), "defaults", share_store=False)
        seen = Observed(began=time.time())
        result = run.run(kill_at, "other", timeout, target="trainer", watch=seen.watch)
        seen.watch(run.progress())
    seen.killed_at, seen.killed_step = result.killed_at, result.killed_step
    seen.load, seen.ended = load_average(), time.time()
    assert result.finished, f"plain torchrun did not finish: exit codes {result.exit_codes}"
    return seen


def joined_at(path: Path, after: float) -> float | None:
    """When the replacement logged that it copied the live state from a peer."""
    if not path.exists():
        return None
    year = time.gmtime(after).tm_year
    return next((x.at for x in read_log(path, year) if x.at >= after and JOINED in x.text), None)


# ----------------------------------------------------------------------------- figures of a run
Trace = Sequence[tuple[float, int]]
"""(Unix time, step) of each progress record."""


def steps_of(seen: Observed) -> list[tuple[float, int]]:
    return [(t, r.step) for t, r in seen.records]


def seconds_per_step(trace: Trace, from_step: int) -> float | None:
    """From the first record at ``from_step`` or later to the last one."""
    start = next(((t, s) for t, s in trace if s >= from_step), None)
    if start is None or trace[-1][1] <= start[1]:
        return None
    return (trace[-1][0] - start[0]) / (trace[-1][1] - start[1])


def goodput(trace: Trace, began: float) -> float | None:
    """The steps times the run's own median step time (record to record, forward only), over
    the wall time from ``began`` to the last record: the share of the run that trained."""
    paces = [(t1 - t0) / (s1 - s0) for (t0, s0), (t1, s1) in itertools.pairwise(trace) if s1 > s0]
    if not paces or trace[-1][0] <= began:
        return None
    return trace[-1][1] * statistics.median(paces) / (trace[-1][0] - began)


@dataclass(frozen=True)
class AfterKill:
    """What the records show around the kill (seconds from it; None: not seen)."""

    new_round_step: int | None
    """Restarted from this step (None: nothing restarted, the records never went back)."""
    new_round_started: float | None
    new_round_first_record: float | None
    back_past_kill_step: float | None


def after_kill(trace: Trace, killed_at: float, killed_step: int) -> AfterKill:
    """A restarted round shows as the step going back (its start record), then forward."""
    after = [(t - killed_at, s) for t, s in trace if t >= killed_at]
    start = next(((t, s) for t, s in after if s < killed_step), None)
    first = (
        None
        if start is None
        else next((t for t, s in after if t > start[0] and s > start[1]), None)
    )
    back = next((t for t, s in after if s > killed_step), None)
    return AfterKill(
        None if start is None else start[1],
        None if start is None else start[0],
        first,
        back,
    )


def kill_figures(way: str, seen: Observed) -> dict[str, Any]:
    """The issue's figures of one run with the kill (None where not measured)."""
    assert seen.killed_at is not None and seen.killed_step is not None, "no kill happened"
    final = seen.final
    found = after_kill(steps_of(seen), seen.killed_at, seen.killed_step)
    out: dict[str, Any] = {
        "killed_at_step": seen.killed_step,
        "back_past_kill_step_seconds": found.back_past_kill_step,
        "goodput": goodput(steps_of(seen), seen.began),
        "final_loss": final.loss if final else None,
        "load": seen.load,
    }
    if way == "live":
        live = final.live if final else None
        out |= {
            "survivors_longest_step_seconds": live.longest_step_seconds if live else None,
            "steps_computed_twice": 0,
            "discarded_attempts": live.discarded_steps if live else None,
            "replacement_trains_seconds": (
                None if seen.joined_at is None else seen.joined_at - seen.killed_at
            ),
        }
    else:
        twice = None if found.new_round_step is None else seen.killed_step - found.new_round_step
        out |= {
            "survivors_longest_step_seconds": found.new_round_first_record,
            "steps_computed_twice": twice,
            "resumed_from": found.new_round_step,
            "replacement_trains_seconds": found.new_round_started,
        }
    return out


# ----------------------------------------------------------------------------- break-even
def break_even_per_hour(share: float, lost_other: float, lost_live: float) -> float | None:
    """The losses per hour above which live mode wins.

    Live mode gives ``share`` of every step to torchft, so ``share`` × 3600 s of each hour;
    each loss costs the other way ``lost_other`` seconds of training and live ``lost_live``.
    Live wins once the losses' savings outweigh its hour: above ``share × 3600 / saved``.
    0.0: no steady cost, it wins at any rate; None: it saved nothing per loss."""
    saved = lost_other - lost_live
    if saved <= 0:
        return None
    return max(share, 0.0) * 3600 / saved


def describe_break_even(other: str, share: float, lost_other: float, lost_live: float) -> str:
    rate = break_even_per_hour(share, lost_other, lost_live)
    head = (
        f"break-even against {other}: torchft takes {share:.1%} of each live step "
        f"({share * 3600:.0f} s of an hour); a loss cost {other} {lost_other:.1f} s and live "
        f"{lost_live:.1f} s (kill → back past the kill step)"
    )
    if rate is None:
        return f"{head}: live saved nothing per loss here"
    if rate == 0:
        return f"{head}: live wins at any failure rate"
    every = f"{60 / rate:.0f} min" if rate <= 60 else f"{3600 / rate:.0f} s"
    return f"{head}, so live wins above {rate:.2f} losses per hour (one every {every})"


# ----------------------------------------------------------------------------- the bench
def rotated(ways: Sequence[str], trial: int) -> list[str]:
    """Each trial starts with the next way, so none always runs first (or after another)."""
    k = trial % len(ways)
    return [*ways[k:], *ways[:k]]


@dataclass
class Steady:
    """The steady-state figures: each way's pace, and torchft's isolated cost."""

    per_step: dict[str, Figure]
    loops: Figure
    quorum: Figure
    commit: Figure
    torchft: Figure
    allreduce: Figure
    share: Figure
    slowdown: Figure

    @classmethod
    def of(cls, results: Results) -> Steady:
        return cls(
            {w: results.figure(f"{LABELS[w]}: steady seconds per step", "s") for w in STEADY},
            results.figure("live loop ÷ restart loop, steady seconds per step (pairs)", "%"),
            results.figure("torchft per live step: the quorum", "s"),
            results.figure("torchft per live step: the commit vote", "s"),
            results.figure("torchft per live step: quorum + commit vote", "s"),
            results.figure("gradients' all-reduce through the Manager, per live step", "s"),
            results.figure("torchft's share of the live step", "%"),
            results.figure(
                "torchft's steady-state slowdown (its time ÷ the rest of the step)",
                "%",
                target=Target(3.0, text="≤ 3 %"),
            ),
        )

    def add_torchft(self, timed: LiveStepTime | None, load: float) -> None:
        if timed is None or not timed.steps or timed.torchft_share is None:
            return
        self.quorum.add(timed.quorum_seconds / timed.steps, load)
        self.commit.add(timed.commit_seconds / timed.steps, load)
        self.torchft.add(timed.torchft_seconds / timed.steps, load)
        self.allreduce.add(timed.allreduce_seconds / timed.steps, load)
        self.share.add(100 * timed.torchft_share, load)
        rest = timed.step_seconds - timed.torchft_seconds
        self.slowdown.add(100 * timed.torchft_seconds / rest, load)


def steady_state(results: Results, args: argparse.Namespace) -> Steady:
    """Restart and live without a failure, alternating which runs first."""
    steady = Steady.of(results)
    runs: list[list[str]] = []
    for trial in range(args.trials):
        pair: dict[str, float | None] = {}
        for way in rotated(STEADY, trial):
            log(f"steady state, trial {trial + 1}: {LABELS[way]}")
            seen = run_torchkube(way, args.steps, None, args.global_batch)
            pair[way] = pace = seconds_per_step(steps_of(seen), args.from_step)
            runs.append(
                [LABELS[way], str(trial + 1), fmt(pace, "s"), *timeline(seen), f"{seen.load:.1f}"]
            )
            if pace is not None:
                steady.per_step[way].add(pace, seen.load)
            if way == "live" and seen.final is not None and seen.final.live is not None:
                steady.add_torchft(seen.final.live.step_time, seen.load)
        live, restart = pair["live"], pair["restart"]
        if live is not None and restart is not None:
            steady.loops.add(100 * (live / restart - 1))
    results.tables["every steady-state run"] = (
        ["run", "trial", "seconds per step", "launch → first step", "wall", "load"],
        runs,
    )
    return steady


def timeline(seen: Observed) -> list[str]:
    return [fmt(seen.timeline[k], "s") for k in ("first_step_seconds", "wall_seconds")]


ROWS = {
    "survivors_longest_step_seconds": ("the survivors' longest step around the failure", "s"),
    "steps_computed_twice": ("steps computed twice", "steps"),
    "replacement_trains_seconds": ("kill → the replacement trains", "s"),
    "back_past_kill_step_seconds": ("kill → back past the kill step", "s"),
    "goodput": ("goodput over the run", "%"),
    "final_loss": ("final loss", ""),
}


def failures(
    results: Results, args: argparse.Namespace, live_step: Figure
) -> dict[str, dict[str, Figure]]:
    """The same kill, the three ways in turn, ``--kill-trials`` times."""
    detection = HEARTBEAT_TIMEOUT_MS / 1000
    pace = live_step.stats
    longest = Target(
        2 * (pace.median if pace else 0.0) + detection,
        text=f"≤ 2 × a step + {detection:.0f} s detection",
    )
    figures = {
        way: {
            key: results.figure(
                f"{LABELS[way]}: {title}",
                unit,
                target={
                    "steps_computed_twice": Target(0),
                    "survivors_longest_step_seconds": longest,
                }.get(key)
                if way == "live"
                else None,
            )
            for key, (title, unit) in ROWS.items()
        }
        for way in WAYS
    }
    trials = []
    for trial in range(args.kill_trials):
        for way in rotated(WAYS, trial):
            log(
                f"SIGKILL of worker {VICTIM}'s training process at step {args.kill_at}, trial "
                f"{trial + 1}: {LABELS[way]}"
            )
            seen = (
                run_torchrun(args.steps, args.kill_at, args.timeout)
                if way == "torchrun"
                else run_torchkube(way, args.steps, args.kill_at)
            )
            found = kill_figures(way, seen)
            trials.append({"way": way, "trial": trial + 1, **found, **seen.timeline})
            for key, figure in figures[way].items():
                if found[key] is not None:
                    figure.add(100 * found[key] if key == "goodput" else found[key], seen.load)
    results.extra["kill_trials"] = trials
    return figures


def tables(results: Results, figures: dict[str, dict[str, Figure]]) -> None:
    """The three ways side by side, and every trial."""
    rows = [[title, *(spread(figures[w][key]) for w in WAYS)] for key, (title, _) in ROWS.items()]
    loads = {w: [x for f in figures[w].values() for x in f.loads] for w in WAYS}
    rows.append(
        ["load average (1 min) at the runs' ends"]
        + [f"{min(v):.1f}–{max(v):.1f}" if v else "–" for v in loads.values()]
    )
    results.tables["the SIGKILL, three ways: median [min – max]"] = (
        ["", *(LABELS[w] for w in WAYS)],
        rows,
    )
    every = [
        [
            f"{LABELS[t['way']]} #{t['trial']}",
            *(
                fmt(None if t[k] is None else (100 * t[k] if k == "goodput" else t[k]), unit)
                for k, (_, unit) in ROWS.items()
            ),
            *(fmt(t[k], "s") for k in ("first_step_seconds", "wall_seconds")),
            f"{t['load']:.1f}",
        ]
        for t in results.extra["kill_trials"]
    ]
    results.tables["every run with the kill"] = (
        ["run", *(title for title, _ in ROWS.values()), "launch → first step", "wall", "load"],
        every,
    )


def break_even_notes(steady: Steady, figures: dict[str, dict[str, Figure]]) -> list[str]:
    share = steady.share.stats
    live = figures["live"]["back_past_kill_step_seconds"].stats
    if share is None or live is None:
        return ["break-even: not measured"]
    notes = []
    for other in ("restart", "torchrun"):
        lost = figures[other]["back_past_kill_step_seconds"].stats
        if lost is not None:
            notes.append(
                describe_break_even(LABELS[other], share.median / 100, lost.median, live.median)
            )
    return notes


STEADY_NOTE = (
    "torchft's cost: the writer group's seconds in the per-step quorum and the commit vote "
    "(live.stepTime), over its committed steps after the first; the quorum includes waiting "
    "for the other group to ask, which DDP would spend waiting in its all-reduce instead, so "
    "this is an upper bound of torchft's own overhead. The all-reduce is not counted in it: "
    "DDP does one too (overlapped with the backward pass). It is a cost per step (a "
    "Lighthouse round trip and a vote), not per unit of compute: its share falls as the step "
    "grows (global batch {batch}; bench.live_recovery --steady-only --global-batch N measures "
    "it at a longer step)."
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.live_recovery", description=__doc__)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--trials", type=int, default=3, help="steady-state runs per mode")
    parser.add_argument("--kill-trials", type=int, default=3, help="runs with the kill, per way")
    parser.add_argument("--kill-at", type=int, default=60)
    parser.add_argument("--from-step", type=int, default=50, help="steady state from here")
    parser.add_argument("--timeout", type=float, default=600, help="plain torchrun, per run")
    parser.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="the steady state's global batch (default: the example's): more micro-batches "
        "accumulated per step make the step longer, torchft's cost per step the same",
    )
    parser.add_argument(
        "--steady-only",
        action="store_true",
        help="the steady state alone, to bench/results/live_recovery_steady.json",
    )
    args = parser.parse_args(argv)
    name = "live_recovery_steady" if args.steady_only else "live_recovery"
    command = " ".join(["python -m bench.live_recovery", *(sys.argv[1:] if argv is None else argv)])
    results = Results(name, command.strip(), config=vars(args))
    steady = steady_state(results, args)
    if args.steady_only:
        results.notes += [STEADY_NOTE.format(batch=args.global_batch or "the example's")]
        results.write()
        return
    figures = failures(results, args, steady.per_step["live"])
    tables(results, figures)
    resumed = [t.get("resumed_from") for t in results.extra["kill_trials"] if t["way"] != "live"]
    results.notes += [
        f"examples/live-recovery.yaml with {args.steps} steps (checkpoint every 100, log every "
        f"10): worker {VICTIM}'s training process SIGKILLed once the record showed step "
        f"{args.kill_at}; its launcher started it again (torchkube's, or torchrun's agent "
        f"with --max-restarts); restart and plain torchrun resumed from step(s) "
        f"{sorted(set(r for r in resumed if r is not None))}.",
        STEADY_NOTE.format(batch=args.global_batch or "the example's"),
        "the loops compared whole (live ÷ restart) differ in more than torchft: the restart loop "
        "also runs a per-step stop/save agreement and the straggler probe; DDP's all-reduce "
        "overlaps the backward pass, the live loop's does not.",
        "the survivors' longest step: live, the trainer's own per-step time; restart and plain "
        "torchrun, kill → the new round's first progress record past its start, written at the "
        "first multiple of 10 steps (so it includes up to 10 steps).",
        "goodput: steps × the run's median step time (record to record) ÷ the wall time from "
        "launch to the last step. The operator's status.goodput is not used: no operator runs "
        "here, and its resolution (its progress poll) is longer than these recoveries.",
        "break-even: live gives torchft's share of every step (the isolated cost above) to "
        "torchft, so that share of each hour; each loss costs restart (or plain torchrun) the "
        "time from the kill until training is back past the kill step, redone steps included, "
        "and live its own such time. Live wins above (share × 3600 s) ÷ (the saving per loss) "
        "losses an hour. The saving grows with the steps since the last checkpoint (here "
        f"{args.kill_at}, resumed from step 0: a kill at a random step redoes half an interval "
        "on average) and, on a cluster, with the replacement pod's start after a node loss; "
        "the kill here is a crash restarted in place, the cheapest loss for restart.",
        *break_even_notes(steady, figures),
    ]
    results.write()


if __name__ == "__main__":
    main()
