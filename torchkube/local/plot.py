"""``torchkube plot RUN_DIR``: the key panels of a finished local run as one PNG.

For users without Prometheus and Grafana: the run's own logs are the data. Rank 0 logs one
line per log interval (loss, tokens/s, MFU, step time, data wait, world size), one per
committed checkpoint and one per resume; ranks log errors. Which worker holds rank 0 changes
after a failure, so every ``<run>/logs/worker-*.log`` is read and the lines are merged by time.

The failures drawn are those ``torchkube run`` summed into the "time lost" it printed, from
when it saw each until training passed the step it had reached: it leaves them in
``logs/failures.jsonl`` (``torchkube.local.display.FAILURES_FILE``), so the picture and the
summary say the same. A run dir without that file (a run stopped by SIGKILL, logs copied from
elsewhere) has its failures read off the logs: training going back to an earlier step (the
resume from the newest checkpoint), drawn from the first error logged before that (or the
last progress line, for a worker killed without a word) until training passes the step it had
reached. matplotlib is imported only when drawing.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from torchkube.local.display import FAILURES_FILE

_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) torchkube(?: \[rank (\d+)\])?: (.*)$"
)
_STEP = re.compile(r"^step (\d+)/(\d+) \| (.*)$")
_EVAL = re.compile(r"^step (\d+) \| eval loss ([-\d.naif]+)")
_CHECKPOINT = re.compile(
    r"^checkpoint step-(\d+) committed: ([\d.]+)s in total, training blocked ([\d.]+)s"
)
_RESUMED = re.compile(r"^resumed from \S*step-(\d+)")


@dataclass
class StepLine:
    time: float
    step: int
    total: int
    loss: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    step_ms: float | None = None
    data_ms: float | None = None
    world: int | None = None


@dataclass
class Failure:
    at: float
    step: int
    """The furthest step reached before it."""
    resumed_step: int | None = None
    recovered_at: float | None = None
    """When training passed ``step`` again (None: never)."""


@dataclass
class Run:
    """What a run's logs say, times in seconds since its first log line."""

    name: str
    steps: list[StepLine] = field(default_factory=list)
    evals: list[tuple[float, int, float]] = field(default_factory=list)
    checkpoints: list[tuple[float, int, float, float]] = field(default_factory=list)
    """(time, step, save seconds, blocking seconds)"""
    resumes: list[tuple[float, int]] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    @property
    def lost_seconds(self) -> float:
        return sum((f.recovered_at or f.at) - f.at for f in self.failures)

    def to_wire(self) -> dict[str, Any]:
        """What the picture is drawn from, as JSON: a run recorded once and drawn again
        later (``bench.quickstart``) without its run dir."""
        return asdict(self)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Run:
        return cls(
            name=body["name"],
            steps=[StepLine(**line) for line in body["steps"]],
            evals=[(at, int(step), loss) for at, step, loss in body["evals"]],
            checkpoints=[(at, int(step), s, b) for at, step, s, b in body["checkpoints"]],
            resumes=[(at, int(step)) for at, step in body["resumes"]],
            errors=list(body["errors"]),
            failures=[Failure(**failure) for failure in body["failures"]],
        )


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").rstrip("%"))
    except ValueError:
        return None


def _step_line(at: float, match: re.Match[str]) -> StepLine:
    line = StepLine(at, int(match.group(1)), int(match.group(2)))
    for part in match.group(3).split(" | "):
        key, _, rest = part.partition(" ")
        if part.startswith("loss "):
            line.loss = _number(rest)
        elif part.endswith(" tok/s"):
            line.tokens_per_second = _number(part.split()[0])
        elif key == "mfu":
            value = _number(rest)
            line.mfu = None if value is None else value / 100
        elif "ms/step" in part:
            numbers = re.findall(r"[\d.]+", part)
            line.step_ms = float(numbers[0]) if numbers else None
            line.data_ms = float(numbers[1]) if len(numbers) > 1 else None
        elif key == "world":
            line.world = int(rest.split()[0])
    return line


def read_run(run_dir: Path) -> Run:
    """Parse ``run_dir/logs/worker-*.log``; ValueError when there is nothing to plot."""
    logs = sorted((run_dir / "logs").glob("worker-*.log"))
    if not logs:
        raise ValueError(f"no worker logs in {run_dir / 'logs'} (is it a `torchkube run` dir?)")
    lines: list[tuple[datetime, str, str]] = []
    for path in logs:
        for text in path.read_text(errors="replace").splitlines():
            match = _LINE.match(text)
            if match:
                stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
                lines.append((stamp, match.group(2), match.group(4)))
    if not lines:
        raise ValueError(f"no trainer log lines in {run_dir / 'logs'}")
    lines.sort(key=lambda item: item[0])
    start = lines[0][0]
    run = Run(name=run_dir.resolve().name)
    for stamp, level, message in lines:
        at = (stamp - start).total_seconds()
        if level in ("ERROR", "CRITICAL"):
            run.errors.append(at)
        if match := _STEP.match(message):
            run.steps.append(_step_line(at, match))
        elif match := _EVAL.match(message):
            value = _number(match.group(2))
            if value is not None:
                run.evals.append((at, int(match.group(1)), value))
        elif match := _CHECKPOINT.match(message):
            run.checkpoints.append(
                (at, int(match.group(1)), float(match.group(2)), float(match.group(3)))
            )
        elif match := _RESUMED.match(message):
            run.resumes.append((at, int(match.group(1))))
    recorded = run_dir / "logs" / FAILURES_FILE
    if recorded.exists():
        run.failures = recorded_failures(recorded, start.timestamp())
    else:
        run.failures = find_failures(run)
    return run


def recorded_failures(path: Path, start: float) -> list[Failure]:
    """The failures ``torchkube run`` recorded (``FAILURES_FILE``), in seconds since
    ``start`` (the first log line, on the wall clock)."""
    failures = []
    for text in path.read_text().splitlines():
        try:
            line = json.loads(text)
            at, recovered = float(line["at"]), line.get("recoveredAt")
            failures.append(
                Failure(
                    at=at - start,
                    step=int(line["step"]),
                    resumed_step=None if line.get("live") else line.get("checkpointStep"),
                    recovered_at=None if recovered is None else float(recovered) - start,
                )
            )
        except (ValueError, KeyError, TypeError):  # a line cut short by a killed run
            continue
    return sorted(failures, key=lambda failure: failure.at)


def find_failures(run: Run) -> list[Failure]:
    """Each restart of training: a resume from a checkpoint after training had run, or the
    step going back. It lasts from the first error after the last progress line before it
    (or that line) until training passes the step it had reached."""
    events = sorted(
        [(line.time, 1, line.step) for line in run.steps]
        + [(at, 0, step) for at, step in run.resumes]
    )  # a resume sorts before a progress line of the same millisecond
    failures: list[Failure] = []
    furthest, last_time = -1, 0.0
    for at, kind, step in events:
        current = failures[-1] if failures and failures[-1].recovered_at is None else None
        restarted = kind == 0 or step <= furthest
        if furthest >= 0 and restarted and current is None:
            errors = [t for t in run.errors if last_time < t <= at]
            current = Failure(at=errors[0] if errors else last_time, step=furthest)
            failures.append(current)
        if kind == 0:
            if current is not None:
                current.resumed_step = step
            continue
        if current is not None and step > current.step:
            current.recovered_at = at
        furthest = max(furthest, step)
        last_time = at
    return failures


def render(run: Run, output: Path, title: str | None = None) -> Path:
    """Draw progress, loss, throughput and step time, failures marked on each; save a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not run.steps:
        raise ValueError("the logs have no progress lines (did training reach a log step?)")
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), sharex=True)
    (progress, loss), (speed, step_time) = axes
    steps = _broken(run)
    times = [s.time if s else float("nan") for s in steps]

    def values(name: str, scale: float = 1.0) -> list[float]:
        out = []
        for line in steps:
            value = getattr(line, name) if line else None
            out.append(float("nan") if value is None else value * scale)
        return out

    progress.plot(times, values("step"), ".-", color="tab:blue", label="step")
    if run.checkpoints:
        progress.plot(
            [c[0] for c in run.checkpoints],
            [c[1] for c in run.checkpoints],
            "s",
            color="tab:green",
            markersize=4,
            label="checkpoint committed",
        )
    progress.set_ylabel("optimizer step")
    progress.set_title("Progress")

    loss.plot(times, values("loss"), ".-", color="tab:purple", label="train")
    if run.evals:
        loss.plot([e[0] for e in run.evals], [e[2] for e in run.evals], "o", label="eval")
    loss.set_ylabel("loss")
    loss.set_title("Loss")

    speed.plot(times, values("tokens_per_second"), ".-", color="tab:orange")
    speed.set_ylabel("tokens / s")
    speed.set_title("Throughput (each log interval)")
    if any(s.mfu is not None for s in run.steps):
        twin = speed.twinx()
        twin.plot(times, values("mfu", 100), ":", color="grey")
        twin.set_ylabel("MFU % (dotted)")
        twin.set_ylim(bottom=0)

    step_time.plot(times, values("step_ms"), ".-", color="tab:red", label="step")
    step_time.plot(times, values("data_ms"), ".-", color="tab:cyan", label="data wait")
    if run.checkpoints:
        step_time.plot(
            [c[0] for c in run.checkpoints],
            [1000 * c[3] for c in run.checkpoints],
            "s",
            color="tab:green",
            markersize=4,
            label="checkpoint blocking",
        )
    step_time.set_ylabel("milliseconds")
    step_time.set_title("Step time (mean over the log interval)")

    for axis in axes.flat:
        for number, failure in enumerate(run.failures):
            end = failure.recovered_at if failure.recovered_at is not None else run.steps[-1].time
            axis.axvline(failure.at, color="red", linestyle="--", linewidth=1)
            axis.axvspan(
                failure.at,
                end,
                color="red",
                alpha=0.12,
                label="failure → back past its step" if number == 0 else None,
            )
        axis.grid(alpha=0.3)
        if axis is not loss:
            axis.set_ylim(bottom=0)
        if axis.get_legend_handles_labels()[0]:  # a panel with nothing named has no legend
            axis.legend(loc="best", fontsize="small")
    for axis in axes[1]:
        axis.set_xlabel("seconds since the first log line")

    last = run.steps[-1]
    final = f"final loss {last.loss:.3f}" if last.loss is not None else ""
    summary = (
        f"{last.step}/{last.total} steps, {len(run.failures)} failure(s), "
        f"{run.lost_seconds:.1f} s lost to failures, {final}"
    )
    fig.suptitle(f"{title or run.name}: {summary}")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def _broken(run: Run) -> list[StepLine | None]:
    """The progress lines with a gap (None) at each failure, so a restart is not drawn as a
    line from the last step before it to the first one after."""
    out: list[StepLine | None] = []
    for line in run.steps:
        previous = out[-1] if out else None
        if previous is not None and (
            line.step <= previous.step
            or any(previous.time <= f.at < line.time for f in run.failures)
        ):
            out.append(None)
        out.append(line)
    return out


@click.command("plot")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="PNG to write. Default: RUN_DIR/run.png.",
)
@click.option("--title", help="Figure title. Default: the run dir's name.")
def plot_command(run_dir: Path, output: Path | None, title: str | None) -> None:
    """Draw a `torchkube run` (its RUN_DIR, e.g. torchkube-runs/quickstart) as a PNG:
    progress with checkpoints, loss, tokens/s and step time, failures and the time they
    cost marked in red."""
    try:
        run = read_run(run_dir)
        path = render(run, output or run_dir / "run.png", title)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    except ImportError as error:
        raise click.ClickException(
            f"plotting needs matplotlib ({error}): pip install 'torchkube[plot]'"
        ) from None
    click.echo(f"wrote {path}: {_describe(run)}")


def _describe(run: Run) -> str:
    parts: list[Any] = [f"{len(run.steps)} log steps", f"{len(run.checkpoints)} checkpoints"]
    for failure in run.failures:
        took = (
            "not recovered"
            if failure.recovered_at is None
            else f"back past it in {failure.recovered_at - failure.at:.1f}s"
        )
        parts.append(f"failure at step {failure.step} ({took})")
    return ", ".join(str(p) for p in parts)
