"""How fast the job trains now, and the time left at that pace (``status.progress``:
``stepSeconds``, ``estimatedRemainingSeconds``).

The pace is the recent steps', not the whole run's: the whole run's includes the start-up,
every restart and its recovery, and says little of when the job will finish. It is measured
from the trainer's reports as the operator reads them (every progress poll, 10 s), whatever
the trainer: a report carries its step and the time it was written (``updated``, whole
seconds; the operator's clock when it has none).

- **Windows.** A window opens at a report that shows the steps advancing within a round —
  never at a round's first report, so the start-up (image, rendezvous, checkpoint load) and
  the first, compiling step stay out. It closes at the first report at least
  :data:`PACE_WINDOW_SECONDS` later with more steps, which yields a sample (its seconds over
  its steps) and opens the next window there. A window without a step stays open: the step
  that ends a long checkpoint save, an evaluation or a stall is charged with it, as it
  delays the end too.
- **Smoothing.** Samples are combined as time over steps, each weighted by its age with
  :data:`PACE_HORIZON_SECONDS` as the time constant (the old pace stands for the time before
  the sample): about the last five minutes count. A periodic checkpoint save then raises the
  pace by its share of the time, not by its window's.
- **Rounds.** A new round — the step went back (a resume from a checkpoint) or the trainer's
  ``resumes`` changed — opens no window across it: the downtime is not a step's. The pace is
  kept (the same workers step at the same pace), so the estimate is there again as soon as
  the job runs. Another world size (elastic resize, a live replica group lost) trains at
  another pace: the pace is unset until measured again. The planner also closes the window
  whenever the job is not Running (restarting, suspended), so no window spans such a gap
  even for a trainer that does not report ``resumes``.

Both functions are pure; ``planner._apply_progress`` and ``planner._estimate_remaining``
carry them out, and the status is what the next pass (or a restarted operator) goes on from.
"""

import math
from dataclasses import dataclass
from datetime import datetime

from torchkube.api.contract import ProgressReport
from torchkube.api.status import PaceWindow, ProgressRecord
from torchkube.api.times import format_time, parse_time

PACE_WINDOW_SECONDS = 20.0
"""The shortest span a pace sample covers: report times have whole seconds, so 20 s keeps
their rounding within 10% of a sample (and far less of the smoothed pace)."""
PACE_HORIZON_SECONDS = 300.0
"""The time constant of the smoothing: a sample's weight falls by e every five minutes."""


@dataclass(frozen=True)
class Pace:
    """Seconds per step (None: not known) and the window now measuring it (None: none open)."""

    step_seconds: float | None
    window: PaceWindow | None


def track(
    previous: ProgressRecord | None,
    previous_world_size: int,
    report: ProgressReport,
    now: datetime,
) -> Pace:
    """The pace after ``report``, from the progress record the status holds (``previous``,
    with its pace and window) and the world size it was reported at."""
    if previous is None:
        return Pace(None, None)
    if report.world_size and previous_world_size and report.world_size != previous_world_size:
        return Pace(None, None)
    kept, window = previous.step_seconds, previous.pace_window
    resumed = previous.resumes is not None and report.resumes != previous.resumes
    if resumed or report.step < previous.step:
        return Pace(kept, None)
    at = parse_time(report.updated) or now
    if window is None:
        stepping = report.step > previous.step
        return Pace(kept, PaceWindow(step=report.step, time=format_time(at)) if stepping else None)
    start = parse_time(window.time)
    steps = report.step - window.step
    elapsed = (at - start).total_seconds() if start is not None else 0.0
    if steps <= 0 or elapsed < PACE_WINDOW_SECONDS:
        return Pace(kept, window)
    return Pace(
        round(_blend(kept, elapsed, steps), 6), PaceWindow(step=report.step, time=format_time(at))
    )


def _blend(kept: float | None, elapsed: float, steps: int) -> float:
    """Time over steps: the window's, plus the decayed horizon at the kept pace."""
    if not kept:
        return elapsed / steps
    before = math.exp(-elapsed / PACE_HORIZON_SECONDS) * PACE_HORIZON_SECONDS
    return (before + elapsed) / (before / kept + steps)


def remaining_seconds(phase: str, progress: ProgressRecord | None) -> int | None:
    """Seconds until ``totalSteps`` at the recent pace, as of the last report: 0 once the job
    succeeded or every step is done; None while not known, and whenever the job is not
    Running (recovery, a suspension or the queue take a time no pace tells)."""
    if phase == "Succeeded":
        return 0
    if phase != "Running" or progress is None or not progress.total_steps:
        return None
    left = progress.total_steps - progress.step
    if left <= 0:
        return 0
    if progress.step_seconds is None:
        return None
    return round(left * progress.step_seconds)
