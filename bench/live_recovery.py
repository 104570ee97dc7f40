"""What live recovery costs and what it saves, on this machine's CPU, against
``failurePolicy.recovery: restart`` (``torchkube run``) and plain ``torchrun``
(:mod:`bench.plain_torchrun`: two stock agents, one process each, the same as two pods, c10d
rendezvous on loopback, ``--max-restarts``, the same trainer, checkpoints in a shared folder).
The job is examples/live-recovery.yaml (two workers, tiny GPT, gloo), only ``steps`` and, for
the loss, ``checkpoint.intervalSteps`` changed.

Each part alternates the ways trial by trial, in rotated order (ABC, BCA, CAB, …) so that no
way always runs first or after another, and every figure carries the 1-minute load average at
the end of its run (the machine is shared):

* **steady state**, no failure, restart and live (``python -m bench.live_recovery``, and alone
  with ``--steady-only``): seconds per step from ``--from-step`` on, and torchft's own cost
  isolated in the live loop (the progress record's ``live.stepTime``: seconds in the per-step
  quorum and the commit vote, and in the all-reduce through the Manager, summed over the
  writer group's committed steps after its first);
* **a worker lost for good** (the default, to bench/results/live_recovery.json with the
  steady state): worker 1's whole agent (its pod: ``Chaos.at_steps``; plain torchrun, the
  agent without the rendezvous store) SIGKILLed at step ``--kill-at`` (its trainer holds
  still once that step is done, so the kill lands there whatever the load), its replacement
  started ``--replace-after`` seconds later (standing for a cluster scheduling the lost pod's
  replacement and pulling its image), with a checkpoint every ``--checkpoint-interval``
  steps. The loss live mode exists for: restart and torchrun wait for the replacement and
  redo the steps since the last checkpoint, live trains on without it;
* **a crash restarted in place** (``--crash``, to bench/results/live_recovery_crash.json):
  worker 1's training process alone SIGKILLed once the progress record shows ``--kill-at``;
  its launcher lives on and starts it again at once. The cheapest loss for restart.

The figures of a run with a loss are read from its workers' logs (:mod:`bench.timeline`:
the lines each training process writes when it starts to train, every 10 steps, and, live,
at each step's commit) and its progress records, never from a pace or a constant:

- *the loss → training back past the loss step*: the kill → the first ``step N`` log line
  past the step it happened at (logged every 10 steps, so it includes up to 10 steps, alike
  for the three ways);
- *the survivors' pause*: live, the writer group's longest step, from its first attempt (the
  progress record's ``live.longestStepSeconds``: detection, the attempt the loss broke and
  the next quorum); restart and torchrun, whose survivors stop and start again with the new
  round, the job's pause below;
- *no step trained around the loss*: the first stretch after the kill in which no process
  trained, from the end of the last step before it to the first time one began to train
  again (a new round's start, after its checkpoint load; live, the survivor's first step in
  the smaller quorum);
- *steps computed twice*: for every step, the rounds that computed it less one, from the log
  lines (live included: a survivor's step counter never goes back, and a process that loads
  a checkpoint says ``resumed from``; both are recorded per run); live's attempts discarded
  (the progress record's ``live.discardedSteps``) are counted apart;
- *the loss → the replacement trains*: the kill → the replacement's first start (live, in
  the victim's log, after its copy of a live peer's state; restart and torchrun, the new
  round's start, after its checkpoint load);
- *goodput*: the time the job spent training steps that were kept (committed and never
  computed again; checkpoint saves' blocking taken out) ÷ the wall time from the launch to
  the end of the final step (:mod:`bench.timeline` defines each part); the rest is split
  into the start-up, the time redone, the pause around the loss, the saves and other pauses
  (a live replacement's join);
- *the first step → the last*: the run's time from its first step to its last, start-up left
  out; a survivor training alone at twice the accumulation shows here, not in the goodput;
- *final loss*: the last record's (restart and torchrun: the mean over both ranks of the last
  10 steps; live: the writer group's).

Writes the record with the failure rate above which live mode's isolated steady cost is
repaid (:func:`break_even_per_hour`). Not a test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from bench import timeline
from bench.common import (
    RESULTS_DIR,
    ROOT,
    Figure,
    Results,
    Target,
    fmt,
    load_average,
    log,
    repo_path,
    rotated,
    spread,
)
from bench.live_recovery_docs import FIGURE_NOTES, LABELS, LOSS_TITLES, ROWS, SPLIT, STEADY, WAYS
from bench.plain_torchrun import PlainTorchrun
from torchkube.api import TrainingJob
from torchkube.api.contract import LiveStepTime, ProgressReport
from torchkube.elastic.lighthouse import HEARTBEAT_TIMEOUT_MS
from torchkube.local.runner import Chaos, LocalRun

EXAMPLE = ROOT / "examples" / "live-recovery.yaml"
VICTIM = 1
VICTIM_LOG = f"worker-{VICTIM}.log"
LossKind = Literal["lost", "crash"]


def job(
    recovery: str, steps: int, global_batch: int | None = None, interval: int | None = None
) -> TrainingJob:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["failurePolicy"]["recovery"] = recovery
    manifest["spec"]["trainer"]["steps"] = steps
    if global_batch is not None:
        manifest["spec"]["trainer"]["globalBatchSize"] = global_batch
    if interval is not None:
        manifest["spec"]["checkpoint"]["intervalSteps"] = interval
    return TrainingJob.model_validate(manifest)


@dataclass(frozen=True)
class Loss:
    """The failure of a run: a worker lost for good (its agent SIGKILLed, a replacement
    started ``replace_after`` seconds later) or its training process crashed (restarted in
    place by its launcher), at ``step``, with a checkpoint every ``interval`` steps."""

    kind: LossKind
    step: int
    interval: int | None
    replace_after: float | None = None


# ----------------------------------------------------------------------------- one run
@dataclass
class Observed:
    """What the bench saw of one run, in Unix time: the progress records as they changed,
    the kill, and the timeline its logs show."""

    began: float
    records: list[tuple[float, ProgressReport]] = field(default_factory=list)
    killed_at: float | None = None
    killed_step: int | None = None
    timeline: timeline.Timeline | None = None
    load: float = 0.0
    ended: float = 0.0

    def watch(self, record: ProgressReport | None) -> None:
        if record is not None and (not self.records or record != self.records[-1][1]):
            self.records.append((time.time(), record))

    @property
    def final(self) -> ProgressReport | None:
        return self.records[-1][1] if self.records else None

    @property
    def first_step_seconds(self) -> float | None:
        """Launch → the first record of a step done (the steady runs' start-up)."""
        first = next((t for t, r in self.records if r.step > 0), None)
        return None if first is None else first - self.began


def run_torchkube(
    recovery: str, steps: int, loss: Loss | None, global_batch: int | None = None
) -> Observed:
    """``torchkube run`` of the job, with ``loss`` if given (worker 1's)."""
    if loss is None:
        chaos = Chaos()
    elif loss.kind == "lost":
        chaos = Chaos(at_steps=[loss.step], worker=VICTIM, replace_after_seconds=loss.replace_after)
    else:
        chaos = Chaos(crash_at_steps=[loss.step], worker=VICTIM)
    interval = loss.interval if loss else None
    with tempfile.TemporaryDirectory(prefix="live-bench-") as folder:
        run = LocalRun(
            job(recovery, steps, global_batch, interval),
            Path(folder),
            chaos=chaos,
            out=io.StringIO(),
        )
        seen = Observed(began=time.time())
        offset = seen.began - time.monotonic()
        summary = run.run(on_progress=lambda _line: seen.watch(run.progress()))
        seen.watch(run.progress())
        seen.load, seen.ended = load_average(), time.time()
        if run.failures:
            seen.killed_at, seen.killed_step = run.failures[0].at + offset, run.failures[0].step
        if loss is not None:
            seen.timeline = timeline.Timeline.of(run.log_dir.glob("worker-*.log"))
    assert summary.succeeded, summary.render()
    return seen


def run_torchrun(steps: int, loss: Loss, timeout: float) -> Observed:
    """Plain torchrun of the restart-mode job, the same loss: its default rendezvous
    settings, the rendezvous store not shared with the workers (:class:`PlainTorchrun`)."""
    with tempfile.TemporaryDirectory(prefix="live-bench-torchrun-") as folder:
        run = PlainTorchrun(
            job("restart", steps, interval=loss.interval),
            Path(folder),
            "defaults",
            share_store=False,
        )
        seen = Observed(began=time.time())
        lost = loss.kind == "lost"
        result = run.run(
            loss.step,
            "other",
            timeout,
            target="agent" if lost else "trainer",
            watch=seen.watch,
            hold=lost,
            replace_after=loss.replace_after if lost else None,
        )
        seen.watch(run.progress())
        seen.timeline = timeline.Timeline.of(run.log_dir.glob("worker-*.log"))
    seen.killed_at, seen.killed_step = result.killed_at, result.killed_step
    seen.load, seen.ended = load_average(), time.time()
    assert result.finished, f"plain torchrun did not finish: exit codes {result.exit_codes}"
    return seen


# ----------------------------------------------------------------------------- figures of a run
def seconds_per_step(trace: Sequence[tuple[float, int]], from_step: int) -> float | None:
    """From the first record at ``from_step`` or later to the last one."""
    start = next(((t, s) for t, s in trace if s >= from_step), None)
    if start is None or trace[-1][1] <= start[1]:
        return None
    return (trace[-1][0] - start[0]) / (trace[-1][1] - start[1])


def loss_figures(way: str, seen: Observed) -> dict[str, Any]:
    """The figures of one run with the loss (None where not seen), from its logs and records."""
    assert seen.killed_at is not None and seen.killed_step is not None, "no kill happened"
    assert seen.timeline is not None
    final = seen.final
    live = final.live if final else None
    found = timeline.figures(
        seen.timeline,
        seen.began,
        seen.killed_at,
        seen.killed_step,
        VICTIM_LOG if way == "live" else None,
    )
    assert found is not None, "the logs show no step"
    after = seen.killed_at
    return {
        "killed_at_step": seen.killed_step,
        "back_past_loss_step_seconds": found.back_past_loss_step,
        "survivors_pause_seconds": (
            (live.longest_step_seconds if live else None) if way == "live" else found.loss_pause
        ),
        "training_stopped_seconds": found.loss_pause,
        "steps_computed_twice": found.steps_computed_twice,
        "discarded_attempts": (live.discarded_steps if live else None) if way == "live" else None,
        "replacement_trains_seconds": found.replacement_trains,
        "goodput": found.goodput,
        "first_to_last_step_seconds": found.wall - found.startup,
        "final_loss": final.loss if final else None,
        "load": seen.load,
        "wall_seconds": found.wall,
        "startup_seconds": found.startup,
        "trained_seconds": found.trained,
        "redone_seconds": found.redone,
        "checkpoint_blocked_seconds": found.checkpoint_blocked,
        "other_seconds": found.other,
        "round_starts_after_loss": sorted(
            {
                e.step
                for e in seen.timeline.events
                if e.kind == "start" and e.at >= after and e.step is not None
            }
        ),
        "resumed_after_loss": [
            f"{name.removesuffix('.log')}: step {step}"
            for at, step, name in seen.timeline.resumes
            if at >= after
        ],
    }


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
        f"{lost_live:.1f} s (the loss → training back past the loss step)"
    )
    if rate is None:
        return f"{head}: live saved nothing per loss here"
    if rate == 0:
        return f"{head}: live wins at any failure rate"
    every = f"{60 / rate:.0f} min" if rate <= 60 else f"{3600 / rate:.0f} s"
    return f"{head}, so live wins above {rate:.2f} losses per hour (one every {every})"


# ----------------------------------------------------------------------------- the bench
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
            trace = [(t, r.step) for t, r in seen.records]
            pair[way] = pace = seconds_per_step(trace, args.from_step)
            runs.append(
                [
                    LABELS[way],
                    str(trial + 1),
                    fmt(pace, "s"),
                    fmt(seen.first_step_seconds, "s"),
                    fmt(seen.ended - seen.began, "s"),
                    f"{seen.load:.1f}",
                ]
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


def scaled(key: str, value: float | None) -> float | None:
    return None if value is None else 100 * value if key == "goodput" else value


def losses(
    results: Results, args: argparse.Namespace, loss: Loss, live_step: Figure | None
) -> dict[str, dict[str, Figure]]:
    """The same loss, the three ways in rotated order, ``--kill-trials`` times."""
    detection = HEARTBEAT_TIMEOUT_MS / 1000
    pace = live_step.stats if live_step is not None else None
    longest = Target(
        2 * (pace.median if pace else 0.0) + detection,
        text=f"≤ 2 × a step + {detection:.0f} s detection",
    )
    targets: dict[str, Target] = {"steps_computed_twice": Target(0)}
    if pace is not None:
        targets["survivors_pause_seconds"] = longest
    figures = {
        way: {
            key: results.figure(
                f"{LABELS[way]}: {title}",
                unit,
                target=targets.get(key) if way == "live" else None,
            )
            for key, (title, unit) in ROWS.items()
            if key != "discarded_attempts" or way == "live"
        }
        for way in WAYS
    }
    trials = []
    what = "agent (a lost pod)" if loss.kind == "lost" else "training process (a crash)"
    for trial in range(args.kill_trials):
        for position, way in enumerate(rotated(WAYS, trial), start=1):
            log(
                f"SIGKILL of worker {VICTIM}'s {what} at step {loss.step}, trial {trial + 1}: "
                f"{LABELS[way]}"
            )
            which = {"way": way, "trial": trial + 1, "position": position}
            try:
                seen = (
                    run_torchrun(args.loss_steps, loss, args.timeout)
                    if way == "torchrun"
                    else run_torchkube(way, args.loss_steps, loss)
                )
                found = loss_figures(way, seen)
            except AssertionError as failed:  # written down, not retried: the run failed
                log(f"{LABELS[way]} failed: {failed}")
                trials.append({**which, "failed": str(failed), "load": load_average()})
                continue
            trials.append({**which, **found})
            for key, figure in figures[way].items():
                value = scaled(key, found[key])
                if value is not None:
                    figure.add(value, seen.load)
    results.extra["loss_trials"] = trials
    return figures


def tables(results: Results, figures: dict[str, dict[str, Figure]], title: str) -> None:
    """The three ways side by side, every trial, and where each trial's time went."""
    rows = []
    for key, (name, _) in ROWS.items():
        rows.append([name, *(spread(figures[w][key]) if key in figures[w] else "–" for w in WAYS)])
    trials = results.extra["loss_trials"]
    loads = {w: [t["load"] for t in trials if t["way"] == w] for w in WAYS}
    rows.append(
        ["load average (1 min) at the runs' ends"]
        + [f"{min(v):.1f}–{max(v):.1f}" if v else "–" for v in loads.values()]
    )
    results.tables[f"{title}, three ways: median [min – max]"] = (
        ["", *(LABELS[w] for w in WAYS)],
        rows,
    )
    results.tables[f"{title}: every run, in the order run"] = (
        ["run", "order", *(name for name, _ in ROWS.values()), "load"],
        [
            [
                f"{LABELS[t['way']]} #{t['trial']}",
                str(t["position"]),
                *(
                    [f"failed: {t['failed']}", *("" for _ in list(ROWS)[1:])]
                    if "failed" in t
                    else (fmt(scaled(k, t[k]), unit) for k, (_, unit) in ROWS.items())
                ),
                f"{t['load']:.1f}",
            ]
            for t in trials
        ],
    )
    results.tables[f"{title}: where each run's wall time went (its timeline)"] = (
        ["run", *SPLIT.values(), "rounds started after the loss at step", "resumed from"],
        [
            [
                f"{LABELS[t['way']]} #{t['trial']}",
                *(fmt(t[k], "s") for k in SPLIT),
                ", ".join(str(s) for s in t["round_starts_after_loss"]) or "–",
                "; ".join(t["resumed_after_loss"]) or "none",
            ]
            for t in trials
            if "failed" not in t
        ],
    )


def break_even_notes(steady: Steady, figures: dict[str, dict[str, Figure]]) -> list[str]:
    share = steady.share.stats
    live = figures["live"]["back_past_loss_step_seconds"].stats
    if share is None or live is None:
        return ["break-even: not measured"]
    notes = []
    for other in ("restart", "torchrun"):
        lost = figures[other]["back_past_loss_step_seconds"].stats
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
    parser.add_argument("--trials", type=int, default=3, help="steady-state runs per mode")
    parser.add_argument("--steps", type=int, default=300, help="steps of a steady-state run")
    parser.add_argument("--from-step", type=int, default=50, help="steady state from here")
    parser.add_argument("--kill-trials", type=int, default=3, help="runs with the loss, per way")
    parser.add_argument(
        "--crash",
        action="store_true",
        help="the crash restarted in place instead of the worker lost for good, to "
        "live_recovery_crash.json, without the steady state",
    )
    parser.add_argument(
        "--loss-steps",
        type=int,
        default=None,
        help="steps of a run with the loss (1500; crash 400)",
    )
    parser.add_argument("--kill-at", type=int, default=None, help="the loss's step (250; crash 60)")
    parser.add_argument(
        "--checkpoint-interval",
        type=int,
        default=None,
        help="spec.checkpoint.intervalSteps of the runs with the loss (500; crash: the example's)",
    )
    parser.add_argument(
        "--replace-after",
        type=float,
        default=20.0,
        help="seconds from the loss of a worker to its replacement's start (not for --crash)",
    )
    parser.add_argument("--timeout", type=float, default=900, help="plain torchrun, per run")
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
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the record goes")
    args = parser.parse_args(argv)
    crash = args.crash
    if args.global_batch is None:
        args.global_batch = job("restart", args.steps).spec.trainer.global_batch_size
    if args.loss_steps is None:
        args.loss_steps = 400 if crash else 1500
    if args.kill_at is None:
        args.kill_at = 60 if crash else 250
    if args.checkpoint_interval is None and not crash:
        args.checkpoint_interval = 500
    name = (
        "live_recovery_steady"
        if args.steady_only
        else "live_recovery_crash"
        if crash
        else "live_recovery"
    )
    command = " ".join(["python -m bench.live_recovery", *(sys.argv[1:] if argv is None else argv)])
    config = {k: repo_path(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    results = Results(name, command.strip(), config=config)
    steady = None if crash else steady_state(results, args)
    if args.steady_only:
        results.notes += [STEADY_NOTE.format(batch=args.global_batch)]
        results.write(args.out)
        return
    interval = args.checkpoint_interval
    loss = Loss(
        "crash" if crash else "lost",
        args.kill_at,
        interval,
        None if crash else args.replace_after,
    )
    title = LOSS_TITLES[loss.kind]
    figures = losses(results, args, loss, steady.per_step["live"] if steady else None)
    tables(results, figures, title)
    every = f"every {interval} steps" if interval else "at the example's interval"
    if crash:
        setup = (
            f"examples/live-recovery.yaml with {args.loss_steps} steps (checkpoints "
            f"{every}, log every 10): worker {VICTIM}'s training process SIGKILLed once the "
            f"progress record showed step {args.kill_at}; its launcher started it again at once "
            "(torchkube's, or torchrun's agent with --max-restarts): a crash, the cheapest "
            "loss for restart, whose launcher starts the round again from warm processes."
        )
    else:
        setup = (
            f"examples/live-recovery.yaml with {args.loss_steps} steps, a checkpoint "
            f"{every}, log every 10: worker {VICTIM}'s whole agent (its pod; plain torchrun: "
            f"the agent without the rendezvous store) SIGKILLed at step {args.kill_at}, its "
            "trainer holding still once that step was done so that the kill lands there; its "
            f"replacement started {args.replace_after:g} s after the kill (standing for a "
            "cluster scheduling a lost pod's replacement and pulling its image), then "
            "importing torch and joining as any worker does."
        )
    results.extra["setup"] = setup
    results.notes += [setup, *FIGURE_NOTES]
    if steady is not None:
        results.notes += [
            STEADY_NOTE.format(batch=args.global_batch),
            "the loops compared whole (live ÷ restart) differ in more than torchft: the "
            "restart loop also runs a per-step stop/save agreement and the straggler probe; "
            "DDP's all-reduce overlaps the backward pass, the live loop's does not.",
            "break-even: live gives torchft's share of every step (the isolated cost above) to "
            "torchft, so that share of each hour; each loss costs restart (or plain torchrun) "
            "the time from the loss until training is back past the loss step, redone steps "
            "included, and live its own such time. Live wins above (share × 3600 s) ÷ (the "
            "saving per loss) losses an hour.",
        ]
        results.extra["break_even"] = break_even_notes(steady, figures)
        results.notes += results.extra["break_even"]
    results.write(args.out)


if __name__ == "__main__":
    main()
