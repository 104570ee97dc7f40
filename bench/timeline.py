"""A run's training timeline, read from its workers' logs: when the job trained which steps,
and whether a later round computed them again.

Each training process writes lines time-stamped to the millisecond into its worker's log:

* a **start**, ``global batch G sequences over world size W: …``, when it begins to train at
  a layout: a round's start, after its checkpoint load (``resumed from …/step-R``, else from
  step 0) or its copy of a live peer's state, and in live mode each time the quorum of
  replica groups changes size;
* a **report**, ``step N/M | …``, every ``logIntervalSteps`` steps (rank 0; in live mode the
  first process of each replica group);
* in live mode, torchft's ``should_commit completed should_commit=true`` at the end of each
  committed step (a **commit**; numbered back from the next report of the same log), and
  ``…=false`` for an attempt not committed (a **discard**).

A **window** is the time between two consecutive events of one log that ends at a commit
(live mode) or else at a report: the steps it trained are those after the step of the event
that opened it, up to the one that closed it. The time between a log's last report or commit
and a start or discard that follows it lies in no window: a failure's pause (detection,
restart, checkpoint load, state copy, the attempt a loss broke, a quorum that waits for a
joining group). A window's step is **redone** when a window of a later round holds it too
(one that began after it ended: the windows of two processes of one round overlap in time).

From these, for a run launched at ``launched`` (:func:`figures`):

* **goodput** = the time the job spent training steps that were kept (the union over the
  processes of the windows' time, each window counted for its share of steps not redone,
  less the ``training blocked`` seconds of the checkpoint saves logged in them) ÷ the wall
  time from the launch to the end of the last window (the final step);
* **steps computed twice**: over every step, the number of rounds that computed it, less one;
* the wall time split into the start-up (launch → the first window), the time trained and
  kept, the checkpoint saves' blocking time, the time redone, the pause of the loss (the first
  stretch after it in no window: the end of the last window before that stretch → the start
  of the next) and the rest outside the windows (other pauses, e.g. a live replacement's
  join).

Nothing here models a pace: every second is read off the log lines.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["start", "report", "commit", "discard"]

_PY = re.compile(r"^(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2}),(\d{3}) ")
_RUST = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{3}) ")
_START = re.compile(r" torchkube(?: \[rank \d+\])?: global batch \d+ sequences over ")
_REPORT = re.compile(r" torchkube(?: \[rank \d+\])?: step (\d+)/\d+ \|")
_RESUMED = re.compile(r" torchkube(?: \[rank \d+\])?: resumed from \S*step-(\d+) ")
_SAVED = re.compile(r"checkpoint step-\d+ committed: .* training blocked ([0-9.]+)s")
_COMMIT = re.compile(r"\[torchft::manager\] .*should_commit completed should_commit=(true|false)")
_FRESH = re.compile(r" torchkube: live: (joined from a live peer|no live peer ahead)")
_LIVE_RESUMED = re.compile(r" torchkube: live: no live peer ahead; resumed from .* of step (\d+)")
"""A live group's process that starts here (a state copied, or a checkpoint loaded)."""


@dataclass(frozen=True)
class Event:
    at: float
    kind: Kind
    step: int | None
    """The step done when it happened (None: a start no step followed)."""
    log: str


@dataclass(frozen=True)
class Window:
    """One log's steps ``(after, upto]``, trained from ``began`` to ``ended`` (Unix time)."""

    log: str
    began: float
    ended: float
    after: int
    upto: int
    blocked: float = 0.0
    """Seconds a checkpoint save logged in it blocked training."""


@dataclass(frozen=True)
class Timeline:
    """What a run's logs show: every event and every window."""

    events: tuple[Event, ...]
    windows: tuple[Window, ...]
    resumes: tuple[tuple[float, int, str], ...] = ()
    """(time, step, log) of every checkpoint load a process logged (``resumed from``)."""

    @classmethod
    def of(cls, paths: Iterable[Path]) -> Timeline:
        events: list[Event] = []
        windows: list[Window] = []
        resumes: list[tuple[float, int, str]] = []
        for path in sorted(paths):
            found, blocked = read_events(path)
            events += found
            windows += windows_of(found, blocked)
            resumes += [(at, step, path.name) for at, step in read_resumes(path)]
        return cls(
            tuple(sorted(events, key=lambda e: e.at)), tuple(windows), tuple(sorted(resumes))
        )

    def reports(self) -> list[tuple[float, int]]:
        return [(e.at, e.step) for e in self.events if e.kind == "report" and e.step is not None]


def stamp(line: str) -> float | None:
    """Unix time of a Python ``logging`` line or a torchft (Rust) one; None otherwise. Both
    are written in the machine's local time, as ``time.time()`` is read back here."""
    match = _PY.match(line) or _RUST.match(line)
    if match is None:
        return None
    y, mo, d, h, mi, s, ms = (int(x) for x in match.groups())
    return dt.datetime(y, mo, d, h, mi, s, ms * 1000).timestamp()


def read_events(path: Path) -> tuple[list[Event], list[tuple[float, float]]]:
    """The events of one worker's log, in order, and the (time, seconds) of each checkpoint
    save's blocking."""
    raw: list[_Raw] = []
    blocked: list[tuple[float, float]] = []
    resumed: int | None = None
    fresh = False
    for line in path.read_text(errors="replace").splitlines():
        at = stamp(line)
        if at is None:
            continue
        if m := _REPORT.search(line):
            raw.append(_Raw(at, "report", int(m[1])))
            resumed, fresh = None, False
        elif m := _RESUMED.search(line):
            resumed, fresh = int(m[1]), True
        elif _FRESH.search(line):
            fresh = True
        elif _START.search(line):
            raw.append(_Raw(at, "start", resumed, fresh))
            resumed, fresh = None, False
        elif m := _COMMIT.search(line):
            raw.append(_Raw(at, "commit" if m[1] == "true" else "discard", None))
        elif m := _SAVED.search(line):
            blocked.append((at, float(m[1])))
    return _numbered(raw, path.name), blocked


def read_resumes(path: Path) -> list[tuple[float, int]]:
    """(time, step) of each ``resumed from`` line of one log: a checkpoint loaded."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        match = _RESUMED.search(line) or _LIVE_RESUMED.search(line)
        at = stamp(line) if match else None
        if match and at is not None:
            out.append((at, int(match[1])))
    return out


@dataclass(frozen=True)
class _Raw:
    at: float
    kind: Kind
    step: int | None
    fresh: bool = False
    """A start of a new process (it loaded a checkpoint or copied a live peer's state)."""


def _numbered(raw: list[_Raw], log: str) -> list[Event]:
    """Steps for every event: a log with commits numbers them back from the next report (a
    start or discard is at the step of the commit before the next one; the commits of a
    process that ended without a report after them are not numbered); without commits, a
    start is at the step it resumed from, else 0."""
    live = any(r.kind == "commit" for r in raw)
    if not live:
        return [Event(r.at, r.kind, 0 if r.step is None else r.step, log) for r in raw]
    steps: list[int | None] = [None] * len(raw)
    following: int | None = None  # the step of the next commit, walking back
    for i in range(len(raw) - 1, -1, -1):
        r = raw[i]
        if r.kind == "report":
            steps[i] = r.step
            following = None if r.step is None else r.step + 1
        elif r.kind == "commit":
            following = None if following is None else following - 1
            steps[i] = following
        else:
            steps[i] = None if following is None else following - 1
            if r.fresh:  # what came before it was another process's
                following = None
    return [Event(r.at, r.kind, steps[i], log) for i, r in enumerate(raw)]


def windows_of(events: Sequence[Event], blocked: Sequence[tuple[float, float]]) -> list[Window]:
    """One log's windows: each pair of consecutive events that ends at a commit (a log with
    commits) or a report (one without), over the steps between theirs."""
    live = any(e.kind == "commit" for e in events)
    closer: Kind = "commit" if live else "report"
    chain = [e for e in events if not (live and e.kind == "report")]
    out = []
    for before, event in itertools.pairwise(chain):
        if event.kind != closer or before.step is None or event.step is None:
            continue
        if event.step <= before.step:
            continue
        saves = sum(s for at, s in blocked if before.at < at <= event.at)
        out.append(Window(event.log, before.at, event.at, before.step, event.step, saves))
    return out


# ----------------------------------------------------------------------------- figures
def _union(spans: Iterable[tuple[float, float]]) -> float:
    """The total length of the union of the intervals."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def kept_share(window: Window, windows: Sequence[Window]) -> float:
    """The share of the window's steps no later round computed again."""
    later = [w for w in windows if w.began >= window.ended]
    kept = sum(
        1
        for n in range(window.after + 1, window.upto + 1)
        if not any(w.after < n <= w.upto for w in later)
    )
    return kept / (window.upto - window.after)


def computed_twice(windows: Sequence[Window]) -> int:
    """Over every step, the rounds that computed it less one: the windows holding a step are
    one round where they overlap in time (two processes of one round), another where not."""
    if not windows:
        return 0
    twice = 0
    for n in range(min(w.after for w in windows) + 1, max(w.upto for w in windows) + 1):
        spans = sorted((w.began, w.ended) for w in windows if w.after < n <= w.upto)
        rounds, reach = 0, float("-inf")
        for a, b in spans:
            if a >= reach:
                rounds += 1
            reach = max(reach, b)
        twice += max(0, rounds - 1)
    return twice


@dataclass(frozen=True)
class Figures:
    """A run's timeline figures (seconds; None: not seen in the logs)."""

    wall: float
    """The launch → the end of the last window."""
    startup: float
    """The launch → the first window."""
    trained: float
    """Steps kept: the goodput's numerator."""
    checkpoint_blocked: float
    redone: float
    """Windows (their share of steps) a later round computed again."""
    loss_pause: float | None
    """The first stretch after the loss in no window (:func:`loss_pause`)."""
    other: float
    """The rest of the wall time: outside the windows, not the loss's pause."""
    steps_computed_twice: int
    back_past_loss_step: float | None
    """The loss → the first report of a step past the one it was at."""
    replacement_trains: float | None
    """The loss → the first start after it (in ``replacement_log``, if given)."""

    @property
    def goodput(self) -> float:
        return self.trained / self.wall if self.wall > 0 else 0.0


def figures(
    timeline: Timeline,
    launched: float,
    lost_at: float | None = None,
    lost_step: int | None = None,
    replacement_log: str | None = None,
) -> Figures | None:
    """The run's figures; None when its logs show no window."""
    windows = timeline.windows
    if not windows:
        return None
    end = max(w.ended for w in windows)
    first = min(w.began for w in windows)
    shares = [(w, kept_share(w, windows)) for w in windows]
    trained_raw = _union((w.began, w.began + k * (w.ended - w.began)) for w, k in shares if k > 0)
    blocked = sum(k * w.blocked for w, k in shares)
    redone = _union((w.began + k * (w.ended - w.began), w.ended) for w, k in shares if k < 1)
    pause = back = replacement = None
    if lost_at is not None:
        pause = loss_pause(windows, lost_at)
        if lost_step is not None:
            back = next(
                (at - lost_at for at, s in timeline.reports() if at >= lost_at and s > lost_step),
                None,
            )
        replacement = next(
            (
                e.at - lost_at
                for e in timeline.events
                if e.kind == "start"
                and e.at >= lost_at
                and (replacement_log is None or e.log == replacement_log)
            ),
            None,
        )
    wall = end - launched
    startup = first - launched
    outside = (end - first) - _union((w.began, w.ended) for w in windows)
    return Figures(
        wall=wall,
        startup=startup,
        trained=trained_raw - blocked,
        checkpoint_blocked=blocked,
        redone=redone,
        loss_pause=pause,
        other=outside - (pause or 0.0),
        steps_computed_twice=computed_twice(windows),
        back_past_loss_step=back,
        replacement_trains=replacement,
    )


def loss_pause(windows: Sequence[Window], at: float) -> float | None:
    """The first stretch in no window of any log that ends after ``at``: from the end of the
    last window before it to the start of the next. A loss seen a moment before it struck
    (a crash found by a poll) may fall in the window of a step still finished; 0.0 when the
    job trained on without a pause, None when nothing trained after ``at``."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted((w.began, w.ended) for w in windows):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    for (_, ended), (began, _) in itertools.pairwise(merged):
        if began > at:
            return began - ended
    return 0.0 if merged and merged[-1][1] > at else None
