"""What ``torchkube run`` prints: a progress line while training, a summary at the end; and
what it leaves of its failures in the run dir (``logs/failures.jsonl``), for ``torchkube
plot`` to draw the same failures and time lost as the summary says."""

import json
from dataclasses import dataclass, field

from torchkube.api.contract import ProgressReport

BAR_WIDTH = 24


def progress_line(
    report: ProgressReport | None, restarts: int, elapsed: float, window: int | None = None
) -> str:
    """``step 120/400 [#######.........] loss 3.214  12.3k tok/s (last 10 steps)  world 2 ...``

    The trainer's tokens/s is its last log window's (``window``: its steps, the job's
    ``logIntervalSteps``), not the run's average: the summary has that."""
    if report is None:
        return f"starting workers ... {elapsed:4.0f}s"
    step, total = report.step, report.total_steps or 0
    done = min(1.0, step / total) if total else 0.0
    filled = int(done * BAR_WIDTH)
    parts = [f"step {step}/{total or '?'} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}]"]
    if report.loss is not None:
        parts.append(f"loss {report.loss:.3f}")
    if report.tokens_per_second:
        over = f" (last {window} steps)" if window else ""
        parts.append(f"{report.tokens_per_second / 1000:.1f}k tok/s{over}")
    if report.world_size:
        parts.append(f"world {report.world_size}")
    if report.last_checkpoint_step is not None:
        parts.append(f"ckpt {report.last_checkpoint_step}")
    parts.append(f"restarts {restarts}")
    parts.append(f"{elapsed:.0f}s")
    return "  ".join(parts)


STORE, LIGHTHOUSE = -1, -2
"""The :attr:`Failure.worker` of the rendezvous store's loss and of the torchft Lighthouse's."""


@dataclass
class Failure:
    """One worker (or store, or Lighthouse) loss and how long training took to get past the
    step it stopped at."""

    worker: int
    """The worker's index, or :data:`STORE` or :data:`LIGHTHOUSE`."""
    reason: str
    at: float
    step: int
    checkpoint_step: int | None
    recovered_at: float | None = None
    live: bool = False
    """Lost under recovery live: the others trained on, nothing was resumed."""

    @property
    def lost_seconds(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.at

    @property
    def subject(self) -> str:
        if self.worker == STORE:
            return "rendezvous store"
        if self.worker == LIGHTHOUSE:
            return "torchft lighthouse"
        return f"worker {self.worker}"

    def to_line(self, epoch: float) -> str:
        """One line of :data:`FAILURES_FILE`: times on the wall clock (``epoch``: the wall
        clock's reading at this clock's 0), as the trainer's log lines are stamped."""
        recovered = None if self.recovered_at is None else epoch + self.recovered_at
        return json.dumps(
            {
                "subject": self.subject,
                "reason": self.reason,
                "step": self.step,
                "checkpointStep": self.checkpoint_step,
                "at": epoch + self.at,
                "recoveredAt": recovered,
                "live": self.live,
            }
        )


FAILURES_FILE = "failures.jsonl"
"""In a run's ``logs/``: every failure ``torchkube run`` summed into its time lost, one JSON
line each (:meth:`Failure.to_line`), each run's appended as its logs are."""


@dataclass
class Summary:
    name: str
    succeeded: bool
    message: str
    steps: int = 0
    total_steps: int = 0
    loss: float | None = None
    tokens_per_step: int | None = None
    first_step: int = 0
    """The step training started from in this run (the checkpoint an earlier run left)."""
    wall_seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    restarts: int = 0
    """Failure incidents, as the operator counts them (workers failing together are one)."""
    replica_group_losses: int = 0
    """recovery live: workers lost while the others trained on, which restarted nothing."""
    replica_group_losses_counted: int = 0
    """Those that counted towards maxRestarts: a worker lost again before committing a step."""

    @property
    def lost_seconds(self) -> float:
        return sum(f.lost_seconds or 0.0 for f in self.failures)

    def _group_losses(self) -> str:
        counted = self.replica_group_losses_counted
        crash_loop = (
            f"; {counted} counted towards maxRestarts: lost again before committing a step"
            if counted
            else ""
        )
        return f"{self.replica_group_losses} (recovery live: not restarts{crash_loop})"

    @property
    def steps_trained(self) -> int:
        return max(0, self.steps - self.first_step)

    @property
    def tokens_trained(self) -> int | None:
        """The tokens of the steps this run took training to (a step redone after a failure
        counts once)."""
        return None if self.tokens_per_step is None else self.steps_trained * self.tokens_per_step

    @property
    def tokens_per_second(self) -> float | None:
        """The run's average: :attr:`tokens_trained` over its wall time, start-up and
        failures included."""
        if not self.tokens_trained or self.wall_seconds <= 0:
            return None
        return self.tokens_trained / self.wall_seconds

    def _throughput(self) -> str:
        speed, tokens = self.tokens_per_second, self.tokens_trained
        if speed is None or tokens is None:
            return "-"
        start = f" from step {self.first_step}" if self.first_step else ""
        return (
            f"{speed:,.0f} tokens/s over the run: {tokens:,} tokens ({self.steps_trained} steps"
            f"{start}) ÷ {self.wall_seconds:.1f}s wall time"
        )

    def render(self) -> str:
        status = "succeeded" if self.succeeded else "FAILED"
        loss = "-" if self.loss is None else f"{self.loss:.4f}"
        lines = [
            f"{self.name}: {status} — {self.message}",
            f"  steps            {self.steps}/{self.total_steps}",
            f"  final loss       {loss}",
            f"  throughput       {self._throughput()}",
            f"  wall time        {self.wall_seconds:.1f}s",
            f"  restarts         {self.restarts}",
            *([f"  groups lost      {self._group_losses()}"] if self.replica_group_losses else []),
            f"  time lost        {self.lost_seconds:.1f}s to failures "
            "(from each loss until training passed the step it stopped at)",
        ]
        for f in self.failures:
            redo = "" if f.checkpoint_step is None else f", resumed from step {f.checkpoint_step}"
            if f.live and f.worker == LIGHTHOUSE:
                redo = ", the replica groups waited for it without a restart (recovery live)"
            elif f.live:
                others = "the replica groups" if f.worker == STORE else "the others"
                redo = f", {others} trained on without a restart (recovery live)"
            took = "not recovered" if f.lost_seconds is None else f"back in {f.lost_seconds:.1f}s"
            lines.append(f"    {f.subject} {f.reason} at step {f.step}{redo}: {took}")
        return "\n".join(lines)
