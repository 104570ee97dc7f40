"""Recovery end to end: SIGKILL a worker → training makes progress again, and where the time goes.

Run: ``python -m bench.recovery_e2e`` (≈ 12 min; ``--trials N``, ``--cases replaced,gone``).

Uses the local runner (``torchkube run``: real torchrun agents through
``torchkube.elastic.launch`` on loopback, the dedicated rendezvous store process, the built-in
trainer on CPU) with the quick start's tiny GPT and 2 workers. Two cases:

- **replaced**: a fixed-size job (``replicas: {min: 2, max: 2}``); the killed worker is
  started again at once, as the operator creates a replacement pod.
- **gone**: an elastic job (``replicas: {min: 1, max: 2}``); the killed worker never comes
  back (``Chaos(restart=False)``, ``torchkube run --chaos-no-restart``), so the survivor must
  carry on alone — the case plain torchrun took 47 s for on this machine kind (perf-targets §8).

Worker 0 is SIGKILLed (its whole process tree, as a node loss would) once training passed
``--kill-step``. The split comes from the time stamps of the logs (torchrun's agent logs at
INFO through ``LOGLEVEL=INFO``; the trainer logs every step here):

- **detection**: kill → a surviving agent logs ``Worker group FAILED`` (its worker hit the
  gloo error from the dead peer, and the agent noticed);
- **re-rendezvous**: → that agent logs ``Rendezvous complete`` for the new round;
- **worker start**: → the new rank 0 starts loading the checkpoint (the load's end minus its
  logged duration): process spawn, ``import torch``, process groups, model build. The trainer
  logs nothing in between, so this is not split further;
- **checkpoint load**: the duration rank 0 logs in ``resumed from … in X s``;
- **first step**: → rank 0 logs its first step after the resume;
- **total**: kill → that first step (the sum of the above).

Also reported: **back at the kill step**, kill → training passed the step it was killed at
(adds re-doing the steps since the last checkpoint; checkpoints every ``--interval`` steps).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Figure, Reference, Results, Target, load_average, log

TARGET_TOTAL = 20.0
TORCHRUN_GONE = 47.0  # perf-targets §8: plain torchrun 2.15, c10d defaults, --nnodes=1:2

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


# ----------------------------------------------------------------------------- the runs
def job_manifest(case: str, steps: int, interval: int) -> dict[str, Any]:
    """The quick start's job (tiny GPT, 2 CPU workers), logging every step."""
    replicas = {"min": 2, "max": 2} if case == "replaced" else {"min": 1, "max": 2}
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


def run_trial(case: str, args: argparse.Namespace, workdir: Path) -> Trial:
    from torchkube.api import TrainingJob
    from torchkube.local.runner import Chaos, LocalRun

    job = TrainingJob.model_validate(job_manifest(case, args.steps, args.interval))
    chaos = Chaos(at_steps=[args.kill_step], worker=0, restart=case == "replaced")
    os.environ["LOGLEVEL"] = "INFO"  # torchrun's agents: rendezvous milestones with times
    run = LocalRun(job, workdir, workers=2, chaos=chaos, out=io.StringIO())
    offset = time.time() - time.monotonic()
    summary = run.run(on_progress=lambda line: None)
    load = load_average()
    if not run.failures:
        return Trial(None, None, load, f"no kill happened: {summary.message}")
    failure = run.failures[0]
    killed_at = failure.at + offset
    year = dt.datetime.fromtimestamp(killed_at).year
    lines = [ln for p in sorted(run.log_dir.glob("worker-*.log")) for ln in read_log(p, year)]
    before = [ln for ln in lines if ln.at < killed_at and ln.rank0]
    killed_rank0 = bool(before) and before[-1].source == "worker-0.log"
    try:
        split = split_recovery(lines, killed_at)
    except ValueError as error:
        return Trial(None, None, load, f"{error}; run: {summary.message}", killed_rank0)
    back = failure.lost_seconds
    return Trial(split, back, load, "" if summary.succeeded else summary.message, killed_rank0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery_e2e", description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--cases", default="gone,replaced")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--kill-step", type=int, default=45)
    parser.add_argument("--interval", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--keep", action="store_true", help="keep the work dirs (logs)")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    results = Results("recovery_e2e", "python -m bench.recovery_e2e", config=vars(args))
    figures: dict[str, dict[str, Figure]] = {}
    for case in cases:
        label = {"gone": "killed, never back (1:2)", "replaced": "killed, replaced (2:2)"}[case]
        reference = Reference(TORCHRUN_GONE, "torchrun 47 s") if case == "gone" else None
        figures[case] = {
            "total": results.figure(
                f"{label}: kill → next step", "s", target=Target(TARGET_TOTAL), reference=reference
            ),
            "detection": results.figure(f"{label}: detection", "s"),
            "rendezvous": results.figure(f"{label}: re-rendezvous", "s"),
            "worker_start": results.figure(f"{label}: worker start", "s"),
            "checkpoint_load": results.figure(f"{label}: checkpoint load", "s"),
            "first_step": results.figure(f"{label}: first step", "s"),
            "back": results.figure(f"{label}: kill → back at the kill step", "s"),
        }
    base = Path(tempfile.mkdtemp(prefix="torchkube-bench-recovery-"))
    rows = []
    for trial in range(args.trials):
        for case in cases:  # interleaved, so the machine's load drifts over both cases alike
            workdir = base / f"{case}-{trial}"
            result = run_trial(case, args, workdir)
            f = figures[case]
            if result.split is None:
                log(f"{case} trial {trial + 1}: NOT RECOVERED: {result.error}")
                results.notes.append(f"{case} trial {trial + 1} did not recover: {result.error}")
                rows.append([case, str(trial + 1), "not recovered", "", "", "", "", "", ""])
                continue
            s = result.split
            for key in ("detection", "rendezvous", "worker_start", "checkpoint_load", "first_step"):
                f[key].add(getattr(s, key), result.load)
            f["total"].add(s.total, result.load)
            if result.back_at_step is not None:
                f["back"].add(result.back_at_step, result.load)
            rows.append(
                [
                    case,
                    str(trial + 1),
                    f"{s.total:.2f}",
                    f"{s.detection:.2f}",
                    f"{s.rendezvous:.2f}",
                    f"{s.worker_start:.2f}",
                    f"{s.checkpoint_load:.2f}",
                    f"{s.first_step:.2f}",
                    f"{'yes' if result.killed_rank0 else 'no'}; step-{s.resumed_step}; "
                    f"load {result.load:.1f}",
                ]
            )
            log(
                f"{case} trial {trial + 1}: total {s.total:.2f}s = detection {s.detection:.2f} "
                f"+ rendezvous {s.rendezvous:.2f} + worker start {s.worker_start:.2f} "
                f"+ load {s.checkpoint_load:.2f} + first step {s.first_step:.2f}"
                + (f" [{result.error}]" if result.error else "")
            )
            if not args.keep:
                import shutil

                shutil.rmtree(workdir, ignore_errors=True)
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
        "rendezvous settings are the TrainingJob defaults: keep-alive 2 s × 3, last call 5 s, "
        "torchrun --monitor-interval 0.5 s; the rendezvous store is its own process",
        "the trainer logs nothing between process start and the checkpoint load, so 'worker "
        "start' (spawn, import torch, process groups, model build) is one figure",
        f"the median total is not the sum of the median parts; checkpoints every "
        f"{args.interval} steps, kill once training passed step {args.kill_step}",
    ]
    results.write()
    if args.keep:
        print(f"work dirs kept in {base}")


if __name__ == "__main__":
    main()
