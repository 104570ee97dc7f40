"""Recovery end to end: SIGKILL a worker → training makes progress again, and where the time goes.

Run: ``python -m bench.recovery_e2e`` (≈ 14 min; ``--trials N``, ``--cases replaced,gone,crashed``).

Uses the local runner (``torchkube run``: real torchrun agents through
``torchkube.elastic.launch`` on loopback, the dedicated rendezvous store process, the built-in
trainer on CPU) with the quick start's tiny GPT and 2 workers. Three cases:

- **replaced**: a fixed-size job (``replicas: {min: 2, max: 2}``); the killed worker is
  started again at once, as the operator creates a replacement pod.
- **gone**: an elastic job (``replicas: {min: 1, max: 2}``); the killed worker never comes
  back (``Chaos(restart=False)``, ``torchkube run --chaos-no-restart``), so the survivor must
  carry on alone.
- **crashed**: the fixed-size job; only worker 0's training process is SIGKILLed, as a CUDA
  error or the OOM killer ends it (``Chaos(crash_at_steps=…)``, ``torchkube run
  --chaos-crash-at-step``): both launchers live on and restart the round in place, so nothing
  waits for a keep-alive to expire and detection is on the critical path.

The limit runs the ``gone`` case too (:mod:`bench.bare_recovery`): a static world of two with
no agent, whose survivor's end hands a world of one at once to a standby process that imported
torch and the trainer beforehand — what no restart can skip; torchkube ÷ the limit says how
far its launcher is from it. Its split: detection (kill → the survivor's process seen ended),
hand-over (→ the standby told, in place of the re-rendezvous), then as below.

Plain torchrun runs the ``gone`` case as the reference, in the same benchmark run, interleaved
with torchkube's trials (:mod:`bench.plain_torchrun`: two agents, the rendezvous store inside
the first): with torchrun's default rendezvous settings, and with the settings torchkube passes
(the difference between the two is settings; what remains against torchkube is design); then
once with the store's agent killed — rank 0's node lost — which torchkube survives because its
store is a process of its own.

Worker 0 is SIGKILLed (its whole process tree, as a node loss would) at ``--kill-step``, where
it holds still until the kill comes (``torchkube run --chaos-at-step``); in ``crashed`` its
training process alone, and under plain torchrun its agent's tree, once the progress report
shows the step. The split comes from the time
stamps of the logs (torchrun's agent logs at INFO through ``LOGLEVEL=INFO``; the trainer logs
every step here):

- **detection**: kill → a surviving agent logs ``Worker group FAILED`` (its worker hit the
  gloo error from the dead peer, and the agent noticed; when a trainer crashed, whichever
  agent is first);
- **re-rendezvous**: → that agent logs ``Rendezvous complete`` for the new round;
- **worker start**: → the new rank 0 starts loading the checkpoint (the load's end minus its
  logged duration): process spawn, ``import torch``, process groups, model build. The trainer
  logs nothing in between, so this is not split further;
- **checkpoint load**: the duration rank 0 logs in ``resumed from … in X s``;
- **first step**: → rank 0 logs its first step after the resume;
- **total**: kill → that first step (the sum of the above).

Also reported: **back at the kill step**, kill → rank 0 logs a step past the one training had
reached at the kill, in the round after the failure was noticed (adds re-doing the steps since
the last checkpoint; checkpoints every ``--interval`` steps); the same function
(:func:`back_at_step`) for torchkube and plain torchrun.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bare_recovery import BareRestart
from bench.common import (
    Figure,
    Reference,
    Results,
    Target,
    command_line,
    fmt,
    leaving_out,
    load_average,
    log,
    record_dir_of,
    rotated,
    spread,
)
from bench.plain_torchrun import PlainTorchrun
from torchkube.api.worker_launch import TORCHRUN_MONITOR_INTERVAL

TARGET_TOTAL = 20.0
REFERENCES = {
    "torchrun-defaults": "plain torchrun, default rendezvous settings",
    "torchrun-same-settings": "plain torchrun, torchkube's rendezvous settings",
}
HOST_LOSS = "torchrun-store-host-killed"
LIMIT = "limit"
LIMIT_LABEL = "the limit: the survivor alone at once, a standby with torch imported (1:2)"

_TORCH_LOG = re.compile(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) ")
_PY_LOG = re.compile(r"^(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2}),(\d{3}) ")
_RESUMED = re.compile(r"resumed from \S+ .* in ([0-9.]+)s")
_STEP = re.compile(r"torchkube: step (\d+)/\d+ \|")


@dataclass(frozen=True)
class LogLine:
    """One time-stamped log line: when (Unix time), which file, and the text."""

    at: float
    source: str
    text: str

    @property
    def rank0(self) -> bool:
        """The trainer's rank 0 logs without a ``[rank N]`` tag."""
        return " torchkube: " in self.text


def line_time(line: str, year: int) -> float | None:
    """Unix time of a torch (glog-style, no year) or Python ``logging`` line; None otherwise.

    Both are written in the machine's local time, as ``time.time()`` is read back here.
    """
    m = _PY_LOG.match(line)
    if m:
        y, mo, d, h, mi, s, ms = (int(x) for x in m.groups())
        return dt.datetime(y, mo, d, h, mi, s, ms * 1000).timestamp()
    m = _TORCH_LOG.match(line)
    if m:
        mo, d, h, mi, s, us = (int(x) for x in m.groups())
        return dt.datetime(year, mo, d, h, mi, s, us).timestamp()
    return None


def read_log(path: Path, year: int) -> list[LogLine]:
    """Time-stamped lines of a log file (continuation lines are skipped)."""
    out = []
    for text in path.read_text(errors="replace").splitlines():
        at = line_time(text, year)
        if at is not None:
            out.append(LogLine(at, path.name, text))
    return out


@dataclass
class Split:
    """Where the time between a kill and the next training step went (seconds)."""

    detection: float
    rendezvous: float
    worker_start: float
    checkpoint_load: float
    first_step: float
    resumed_step: int
    first_new_step: int

    @property
    def total(self) -> float:
        return (
            self.detection
            + self.rendezvous
            + self.worker_start
            + self.checkpoint_load
            + self.first_step
        )


def split_recovery(lines: list[LogLine], killed_at: float) -> Split:
    """Find the recovery's milestones in the logs of all workers, after ``killed_at``.

    Raises ValueError naming the milestone that is missing (e.g. training never resumed).
    """
    after = sorted((line for line in lines if line.at >= killed_at), key=lambda x: x.at)

    def first(what: str, since: float, match: Any, source: str | None = None) -> LogLine:
        for line in after:
            if line.at >= since and match(line) and (source is None or line.source == source):
                return line
        raise ValueError(f"no {what} in the logs after the kill")

    failed = first(
        "'Worker group FAILED' from a surviving agent",
        killed_at,
        lambda x: "Worker group FAILED" in x.text or "Worker group UNHEALTHY" in x.text,
    )
    rendezvous = first(
        "'Rendezvous complete'",
        failed.at,
        lambda x: "Rendezvous complete for workers" in x.text,
        failed.source,
    )
    resumed = first(
        "'resumed from' on rank 0", rendezvous.at, lambda x: x.rank0 and _RESUMED.search(x.text)
    )
    match = _RESUMED.search(resumed.text)
    assert match is not None
    load = float(match.group(1))
    step = first(
        "a training step after the resume",
        resumed.at,
        lambda x: x.rank0 and _STEP.search(x.text),
    )
    step_match = _STEP.search(step.text)
    assert step_match is not None
    resumed_from = re.search(r"step-(\d+)", resumed.text)
    return Split(
        detection=failed.at - killed_at,
        rendezvous=rendezvous.at - failed.at,
        worker_start=(resumed.at - load) - rendezvous.at,
        checkpoint_load=load,
        first_step=step.at - resumed.at,
        resumed_step=int(resumed_from.group(1)) if resumed_from else -1,
        first_new_step=int(step_match.group(1)),
    )


def split_handover(
    lines: list[LogLine], killed_at: float, noticed_at: float, handed_at: float
) -> Split:
    """The limit's milestones: the harness saw the survivor end (``noticed_at``) and gave the
    standby its world (``handed_at``); the standby's log has the resume and the steps."""
    after = sorted(
        (x for x in lines if x.at >= handed_at and x.source == "standby.log"), key=lambda x: x.at
    )
    resumed = next((x for x in after if _RESUMED.search(x.text)), None)
    if resumed is None:
        raise ValueError("no 'resumed from' in the standby's log after the hand-over")
    step = next((x for x in after if x.at >= resumed.at and _STEP.search(x.text)), None)
    if step is None:
        raise ValueError("no training step in the standby's log after the resume")
    load_match, step_match = _RESUMED.search(resumed.text), _STEP.search(step.text)
    assert load_match is not None and step_match is not None
    load = float(load_match.group(1))
    resumed_from = re.search(r"step-(\d+)", resumed.text)
    return Split(
        detection=noticed_at - killed_at,
        rendezvous=handed_at - noticed_at,
        worker_start=(resumed.at - load) - handed_at,
        checkpoint_load=load,
        first_step=step.at - resumed.at,
        resumed_step=int(resumed_from.group(1)) if resumed_from else -1,
        first_new_step=int(step_match.group(1)),
    )


# ----------------------------------------------------------------------------- the runs
def job_manifest(case: str, steps: int, interval: int) -> dict[str, Any]:
    """The quick start's job (tiny GPT, 2 CPU workers), logging every step."""
    replicas = {"min": 1, "max": 2} if case == "gone" else {"min": 2, "max": 2}
    return {
        "apiVersion": "torchkube.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": f"recovery-{case}"},
        "spec": {
            "replicas": replicas,
            "nprocPerNode": 1,
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
            "checkpoint": {"size": "1Gi", "intervalSteps": interval, "keep": 2},
            "failurePolicy": {"maxRestarts": 5},
            "trainer": {
                "model": "tiny",
                "device": "cpu",
                "strategy": "ddp",
                "microBatchSize": 4,
                "globalBatchSize": 8,
                "seqLen": 128,
                "steps": steps,
                "learningRate": 6.0e-4,
                "warmupSteps": 10,
                "logIntervalSteps": 1,
            },
        },
    }


@dataclass
class Trial:
    split: Split | None
    back_at_step: float | None
    load: float
    error: str = ""
    killed_rank0: bool | None = None


def back_at_step(lines: list[LogLine], killed_at: float, step: int, split: Split) -> float | None:
    """Seconds from the kill until rank 0 logged a step past ``step`` (the step training had
    reached when the kill came) in the round that recovered from it.

    Only steps logged once a surviving agent noticed the failure count: a step the survivor
    finished between the kill and its notice (its peer's last gradients were already in) is
    not a recovery. One definition for torchkube and for plain torchrun.
    """
    noticed = killed_at + split.detection
    for line in sorted(lines, key=lambda x: x.at):
        match = _STEP.search(line.text) if line.rank0 and line.at >= noticed else None
        if match and int(match.group(1)) > step:
            return line.at - killed_at
    return None


def worker_logs(log_dir: Path, killed_at: float, pattern: str = "worker-*.log") -> list[LogLine]:
    year = dt.datetime.fromtimestamp(killed_at).year
    return [ln for p in sorted(log_dir.glob(pattern)) for ln in read_log(p, year)]


def run_trial(case: str, args: argparse.Namespace, workdir: Path) -> Trial:
    from torchkube.api import TrainingJob
    from torchkube.local.runner import Chaos, LocalRun

    job = TrainingJob.model_validate(job_manifest(case, args.steps, args.interval))
    chaos = (
        Chaos(crash_at_steps=[args.kill_step], worker=0)
        if case == "crashed"
        else Chaos(at_steps=[args.kill_step], worker=0, restart=case == "replaced")
    )
    os.environ["LOGLEVEL"] = "INFO"  # torchrun's agents: rendezvous milestones with times
    run = LocalRun(job, workdir, workers=2, chaos=chaos, out=io.StringIO())
    offset = time.time() - time.monotonic()
    summary = run.run(on_progress=lambda line: None)
    load = load_average()
    if not run.failures:
        return Trial(None, None, load, f"no kill happened: {summary.message}")
    failure = run.failures[0]
    killed_at = failure.at + offset
    lines = worker_logs(run.log_dir, killed_at)
    before = [ln for ln in lines if ln.at < killed_at and ln.rank0]
    killed_rank0 = bool(before) and before[-1].source == "worker-0.log"
    try:
        split = split_recovery(lines, killed_at)
    except ValueError as error:
        return Trial(None, None, load, f"{error}; run: {summary.message}", killed_rank0)
    back = back_at_step(lines, killed_at, failure.step, split)
    return Trial(split, back, load, "" if summary.succeeded else summary.message, killed_rank0)


def run_reference(case: str, args: argparse.Namespace, workdir: Path) -> Trial:
    """The ``gone`` job under plain torchrun; ``case`` says which settings and which agent."""
    from torchkube.api import TrainingJob

    job = TrainingJob.model_validate(job_manifest("gone", args.steps, args.interval))
    settings = "defaults" if case == "torchrun-defaults" else "torchkube"
    victim = "host" if case == HOST_LOSS else "other"
    run = PlainTorchrun(job, workdir, settings)
    result = run.run(args.kill_step, victim, timeout=args.reference_timeout)
    load = load_average()
    if result.killed_at is None:
        return Trial(None, None, load, f"no kill happened (exit codes {result.exit_codes})")
    lines = worker_logs(result.log_dir, result.killed_at)
    outcome = "" if result.finished else f"training did not finish (exit {result.exit_codes})"
    try:
        split = split_recovery(lines, result.killed_at)
    except ValueError as error:
        return Trial(None, None, load, f"{error}; {outcome}".rstrip("; "), victim == "host")
    assert result.killed_step is not None
    back = back_at_step(lines, result.killed_at, result.killed_step, split)
    return Trial(split, back, load, outcome, victim == "host")


def run_limit(args: argparse.Namespace, workdir: Path) -> Trial:
    """The ``gone`` job's kill with nothing but a standby to take over (bench.bare_recovery)."""
    from torchkube.api import TrainingJob

    job = TrainingJob.model_validate(job_manifest("gone", args.steps, args.interval))
    result = BareRestart(job, workdir).run(args.kill_step, timeout=args.reference_timeout)
    load = load_average()
    killed, noticed, handed = result.killed_at, result.noticed_at, result.handed_at
    if killed is None or noticed is None or handed is None:
        return Trial(None, None, load, f"no kill or no hand-over (exit codes {result.exit_codes})")
    lines = worker_logs(result.log_dir, killed, "*.log")
    outcome = "" if result.finished else f"training did not finish (exit {result.exit_codes})"
    try:
        split = split_handover(lines, killed, noticed, handed)
    except ValueError as error:
        return Trial(None, None, load, f"{error}; {outcome}".rstrip("; "), True)
    back = back_at_step(lines, killed, args.kill_step, split)
    return Trial(split, back, load, outcome, True)


PARTS = ("detection", "rendezvous", "worker_start", "checkpoint_load", "first_step")


@dataclass
class CaseFigures:
    """The figures of one case: the total, its parts, and back at the kill step."""

    total: Figure
    parts: dict[str, Figure]
    back: Figure

    @classmethod
    def of(cls, results: Results, label: str, target: Target | None) -> CaseFigures:
        titles = {
            "detection": "detection",
            "rendezvous": "re-rendezvous",
            "worker_start": "worker start",
            "checkpoint_load": "checkpoint load",
            "first_step": "first step",
        }
        return cls(
            results.figure(f"{label}: kill → next step", "s", target=target),
            {key: results.figure(f"{label}: {titles[key]}", "s") for key in PARTS},
            results.figure(f"{label}: kill → back at the kill step", "s"),
        )

    def add(self, trial: Trial) -> None:
        assert trial.split is not None
        for key in PARTS:
            self.parts[key].add(getattr(trial.split, key), trial.load)
        self.total.add(trial.split.total, trial.load)
        if trial.back_at_step is not None:
            self.back.add(trial.back_at_step, trial.load)


def compare(
    results: Results, ours: Figure, references: dict[str, CaseFigures], limit: CaseFigures | None
) -> None:
    """torchkube's ``gone`` total against each plain-torchrun reference of the same run, and
    against the limit."""
    rows = []
    mine = ours.stats
    if limit is not None and mine is not None and (floor := limit.total.stats) is not None:
        ratio = results.figure("torchkube ÷ the limit, kill → next step", "x")
        ratio.add(mine.median / floor.median, ours.loads[-1])
        rows.append(
            [LIMIT_LABEL, spread(limit.total), f"torchkube ÷ it: {fmt(ratio.values[0], 'x')}"]
        )
    for case, figures in references.items():
        theirs = figures.total.stats
        if mine is None or theirs is None:
            continue
        ratio = results.figure(f"{REFERENCES[case]} ÷ torchkube, kill → next step", "x")
        ratio.add(theirs.median / mine.median, ours.loads[-1])
        if case == "torchrun-defaults":
            ours.reference = Reference(
                theirs.median, f"plain torchrun (defaults), same run: {fmt(theirs.median, 's')}"
            )
        rows.append([REFERENCES[case], spread(figures.total), fmt(ratio.values[0], "x")])
    results.tables["killed, never back (1:2): kill → next step, median [min – max]"] = (
        ["launcher", "kill → next step", "÷ torchkube"],
        [["torchkube", spread(ours), "1.00×"], *rows],
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery_e2e", description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--cases", default="gone,replaced,crashed")
    parser.add_argument(
        "--reference-trials", type=int, default=3, help="plain torchrun trials per setting"
    )
    parser.add_argument("--reference-timeout", type=float, default=600)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--kill-step", type=int, default=45)
    parser.add_argument("--interval", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--keep", action="store_true", help="keep the work dirs (logs)")
    parser.add_argument(
        "--quick", action="store_true", help="one trial of each case, no plain torchrun"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.reference_trials = 1, 0
    return leaving_out(parser, args, ["cases"])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    references = list(REFERENCES) if args.reference_trials and "gone" in cases else []
    limits = [LIMIT] if args.trials and "gone" in cases and not args.quick else []
    results = Results("recovery_e2e", command_line("bench.recovery_e2e", argv), config=vars(args))
    labels = {
        "gone": "killed, never back (1:2)",
        "replaced": "killed, replaced (2:2)",
        "crashed": "trainer crashed, restarted in place (2:2)",
        **{case: f"{REFERENCES[case]} (1:2)" for case in references},
        LIMIT: LIMIT_LABEL,
    }
    figures = {
        case: CaseFigures.of(results, labels[case], Target(TARGET_TOTAL) if case in cases else None)
        for case in [*cases, *limits, *references]
    }
    host_loss = results.figure(
        "plain torchrun, store's agent killed: trials where training went on", "trials"
    )
    base = Path(tempfile.mkdtemp(prefix="torchkube-bench-recovery-"))
    rows = []
    rounds = max(args.trials, args.reference_trials)
    for trial in range(rounds):
        # interleaved, each round starting with the next case, so the machine's load drifts
        # over every case alike and none always runs first
        due = [c for c in [*cases, *limits] if trial < args.trials]
        due += [c for c in references if trial < args.reference_trials]
        for case in rotated(due, trial):
            workdir = base / f"{case}-{trial}"
            if case in REFERENCES:
                result = run_reference(case, args, workdir)
            elif case == LIMIT:
                result = run_limit(args, workdir)
            else:
                result = run_trial(case, args, workdir)
            rows.append(trial_row(case, trial, result))
            if result.split is None:
                log(f"{case} trial {trial + 1}: NOT RECOVERED: {result.error}")
                results.notes.append(f"{case} trial {trial + 1} did not recover: {result.error}")
            else:
                figures[case].add(result)
                s = result.split
                log(
                    f"{case} trial {trial + 1}: total {s.total:.2f}s = detection "
                    f"{s.detection:.2f} + rendezvous {s.rendezvous:.2f} + worker start "
                    f"{s.worker_start:.2f} + load {s.checkpoint_load:.2f} + first step "
                    f"{s.first_step:.2f}" + (f" [{result.error}]" if result.error else "")
                )
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    if references:
        result = run_reference(HOST_LOSS, args, base / HOST_LOSS)
        rows.append(trial_row(HOST_LOSS, 0, result))
        went_on = result.split is not None and not result.error
        host_loss.add(1.0 if went_on else 0.0, result.load)
        log(f"{HOST_LOSS}: " + ("training went on" if went_on else f"FAILED: {result.error}"))
        results.notes.append(
            "plain torchrun with the store's agent killed (rank 0's node lost): "
            + ("training went on" if went_on else f"training did not go on: {result.error}")
            + "; torchkube's store is a process (a pod) of its own, so the 'gone' case above "
            "kills worker 0 with the store untouched"
        )
        compare(
            results,
            figures["gone"].total,
            {c: figures[c] for c in references},
            figures[LIMIT] if limits else None,
        )
    results.tables["every trial (seconds)"] = (
        [
            "case",
            "trial",
            "total",
            "detection",
            "re-rendezvous",
            "worker start",
            "load",
            "first step",
            "killed rank 0?; resumed from; load avg",
        ],
        rows,
    )
    results.notes += [
        "torchkube's rendezvous settings are the TrainingJob defaults: keep-alive 2 s × 3, last "
        f"call 5 s, torchrun --monitor-interval {TORCHRUN_MONITOR_INTERVAL} s; its rendezvous "
        "store is its own process; "
        "its launcher drops a lost agent once its beats stop (0.5 s), and a round re-formed "
        "after a loss starts without the last call; plain torchrun's defaults: keep-alive "
        "5 s × 3, last call 30 s, monitor 0.1 s",
        "settings vs design: 'plain torchrun, default settings' − 'plain torchrun, torchkube's "
        "settings' is what the settings buy; what is left against torchkube is design",
        "the trainer logs nothing between process start and the checkpoint load, so 'worker "
        "start' (spawn, import torch, process groups, model build) is one figure",
        f"the median total is not the sum of the median parts; checkpoints every "
        f"{args.interval} steps; worker 0 killed at step {args.kill_step} (crashed, and plain "
        "torchrun: once the progress report showed it)",
    ]
    results.write(record_dir_of(args))
    if args.keep:
        print(f"work dirs kept in {base}")


def trial_row(case: str, trial: int, result: Trial) -> list[str]:
    if result.split is None:
        return [case, str(trial + 1), "not recovered", "", "", "", "", "", result.error[:80]]
    s = result.split
    return [
        case,
        str(trial + 1),
        f"{s.total:.2f}",
        f"{s.detection:.2f}",
        f"{s.rendezvous:.2f}",
        f"{s.worker_start:.2f}",
        f"{s.checkpoint_load:.2f}",
        f"{s.first_step:.2f}",
        f"{'yes' if result.killed_rank0 else 'no'}; step-{s.resumed_step}; load {result.load:.1f}",
    ]


if __name__ == "__main__":
    main()
