"""What every benchmark shares: statistics, the machine's description, and the result files.

Our figures are only worth something if a reader can see how they were taken. So every
figure carries all its trial values, the load average seen during each trial (the machine is
shared and noisy), its median and p95, the target it is held against and whether it met it,
and the reference figure it is compared with (docs/benchmarks.md explains the sources). A
missed target is written down as missed: nothing here rounds, drops or retries a trial to
make a number look better.

Results go to ``bench/results/<name>.json`` (everything: the record); ``python -m bench.report``
renders them into docs/benchmarks.md, the one place their tables are published.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
QUICK_RESULTS_DIR = RESULTS_DIR / "quick"
"""Where a ``--quick`` run's record goes (git ignores it; ``bench.report`` reads the folder
above only): a smoke run of one trial must not replace the record the docs are rendered from."""


def record_dir(quick: bool) -> Path:
    return QUICK_RESULTS_DIR if quick else RESULTS_DIR


def leaving_out(
    parser: argparse.ArgumentParser, args: argparse.Namespace, scope: Iterable[str]
) -> argparse.Namespace:
    """``args`` with ``left_out``: the options of ``scope`` (a size, a case, a contender) this
    run set away from their defaults. Such a run's record lacks figures the docs render, so it
    goes where a quick one's does (:func:`record_dir_of`)."""
    args.left_out = [dest for dest in scope if getattr(args, dest) != parser.get_default(dest)]
    return args


def record_dir_of(args: argparse.Namespace) -> Path:
    """Where a run's record goes: a quick run's, or one that left part of its scope out, in
    :data:`QUICK_RESULTS_DIR`; only a whole run replaces the record."""
    partial = bool(getattr(args, "quick", False) or getattr(args, "left_out", ()))
    if partial:
        log(f"a partial run: its record goes to {repo_path(QUICK_RESULTS_DIR)}/")
    return record_dir(partial)


def repo_path(path: Path) -> str:
    """``path`` as a record or a message names it: relative to the repository when inside it,
    so no record names a folder of the machine it ran on."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# ----------------------------------------------------------------------------- statistics
def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation between order statistics.

    The same definition as numpy's default (``method="linear"``), so anyone can recompute our
    p95 from the raw values in the JSON. With few trials p95 lies close to the maximum.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0–100")
    ordered = sorted(float(v) for v in values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


@dataclass(frozen=True)
class Stats:
    """Summary of one figure's trials."""

    n: int
    median: float
    p95: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        return cls(len(values), median(values), percentile(values, 95), min(values), max(values))


# ----------------------------------------------------------------------------- the machine
LIMIT = "bare client"
"""The physical limit's contender: the pods torchkube would create, created with no operator."""

Way = TypeVar("Way")


def rotated(ways: Sequence[Way], trial: int) -> list[Way]:
    """Each trial starts with the next way, so none always runs first (or after another)."""
    k = trial % len(ways)
    return [*ways[k:], *ways[:k]]


def load_average() -> float:
    """The 1-minute load average: how busy the shared machine was (2 cores: 2.0 is full)."""
    return round(os.getloadavg()[0], 2)


def _meminfo_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024**2, 1)
    return float("nan")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def revision() -> str:
    """The commit measured, and whether torchkube/ had uncommitted changes (then: "+dirty")."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "torchkube"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def machine_info() -> dict[str, Any]:
    """What the figures were measured on, written next to them."""
    info: dict[str, Any] = {
        "nproc": len(os.sched_getaffinity(0)),
        "memory_gib": _meminfo_gib(),
        "cpu": _cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "revision": revision(),
    }
    if "torch" in sys.modules:
        info["torch"] = sys.modules["torch"].__version__
    return info


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (``/proc/<pid>/stat`` fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces: split after its ')'
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def proc_peak_rss_bytes(pid: int) -> int:
    """Peak resident memory of a process over its life (``VmHWM`` in ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


class Stopwatch:
    """Wall time of a block plus the load average at its end (the figure's context)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.load = 0.0

    def __enter__(self) -> Stopwatch:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._started
        self.load = load_average()


# ----------------------------------------------------------------------------- figures
Direction = Literal["max", "min"]


@dataclass
class Target:
    """What a figure must be: at most (``max``) or at least (``min``) ``limit`` — in the
    median, or with ``every`` in each trial (a count of failures, where one is one too many)."""

    limit: float
    direction: Direction = "max"
    text: str = ""
    every: bool = False

    def met(self, value: float) -> bool:
        return value <= self.limit if self.direction == "max" else value >= self.limit

    def describe(self, unit: str) -> str:
        if self.text:
            return self.text
        return f"{'≤' if self.direction == 'max' else '≥'} {fmt(self.limit, unit)}"


@dataclass
class Reference:
    """A peer's figure for the same work, measured in the same run on the same cluster.

    ``ratio`` is reference ÷ ours for times (how many times faster we are) unless
    ``higher_is_better``, then ours ÷ reference.
    """

    value: float
    text: str
    higher_is_better: bool = False

    def ratio(self, ours: float) -> float | None:
        if ours <= 0 or self.value <= 0:
            return None
        return ours / self.value if self.higher_is_better else self.value / ours


@dataclass
class Figure:
    """One measured quantity over its trials, with its context."""

    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    target: Target | None = None
    reference: Reference | None = None
    note: str = ""

    def add(self, value: float, load: float | None = None) -> None:
        self.values.append(float(value))
        self.loads.append(load_average() if load is None else float(load))

    @property
    def stats(self) -> Stats | None:
        return Stats.of(self.values) if self.values else None

    def verdict(self) -> str:
        """``met``/``missed`` judged on the median (says so when the p95 misses), or on every
        trial where the target says so."""
        stats = self.stats
        if self.target is None:
            return ""
        if stats is None:
            return "not measured"
        if self.target.every:
            return "met" if all(self.target.met(v) for v in self.values) else "missed"
        if not self.target.met(stats.median):
            return "missed"
        return "met" if self.target.met(stats.p95) else "met (p95 missed)"

    def to_json(self) -> dict[str, Any]:
        stats = self.stats
        body: dict[str, Any] = {"name": self.name, "unit": self.unit, "values": self.values}
        body["load_average"] = self.loads
        if stats is not None:
            body |= {k: v for k, v in asdict(stats).items()}
        if self.target is not None:
            body["target"] = self.target.describe(self.unit)
            body["verdict"] = self.verdict()
        if self.reference is not None and stats is not None:
            ratio = self.reference.ratio(stats.median)
            body["reference"] = self.reference.text
            body["reference_value"] = self.reference.value
            body["ratio"] = None if ratio is None else round(ratio, 3)
        if self.note:
            body["note"] = self.note
        return body


COUNT_UNITS = {"steps": "step", "watches": "watch"}
"""Units of counts (each with its singular): a whole number of them is shown as one."""


def fmt(value: float | None, unit: str) -> str:
    """A value in its unit, with as many digits as such a figure deserves."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if unit == "s":
        if abs(value) < 1:
            return f"{value:.3f} s"
        return f"{value:.2f} s" if abs(value) < 10 else f"{value:.1f} s"
    if unit == "%":
        return f"{value:.1f} %"
    if unit == "x":
        return f"{value:.2f}×"
    if unit in COUNT_UNITS and float(value).is_integer():
        return f"{int(value):,} {COUNT_UNITS[unit] if value == 1 else unit}"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}".strip()
    if abs(value) >= 10:
        return f"{value:.1f} {unit}".strip()
    return f"{value:.3g} {unit}".strip()


def spread(figure: Figure) -> str:
    """``median [min – max]`` of a figure's values."""
    stats = figure.stats
    if stats is None:
        return "–"
    return f"{fmt(stats.median, figure.unit)} [{fmt(min(figure.values), figure.unit)} – " + (
        f"{fmt(max(figure.values), figure.unit)}]"
    )


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table; ``|`` in cells is escaped."""

    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


FIGURE_HEADERS = ("figure", "n", "median", "p95", "min – max", "load", "target", "", "reference")

# ----------------------------------------------------------------------------- the rule
MIN_TRIALS = 3
"""No ratio and no verdict on fewer trials than this per contender: with two, the median is
the mean of the two, and one outlier decides it."""
LOAD_MARGIN = 0.5
"""Contenders whose median trial loads differ by more than this many load-average units per
core of the machine (1.0 on 2 cores) ran under different load, which is said beside the
figure."""


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def spread_of(figure: dict[str, Any]) -> str:
    """``median [min – max]`` of a recorded figure (:meth:`Figure.to_json`)."""
    if not figure["values"]:
        return "not measured"
    unit = figure["unit"]
    return (
        f"{fmt(figure['median'], unit)} [{fmt(figure['min'], unit)} – {fmt(figure['max'], unit)}]"
    )


def loads_of(figure: dict[str, Any]) -> str:
    """The load average of each trial (the range once there are more than six)."""
    loads = figure.get("load_average") or []
    if len(loads) > 6:
        return f"{min(loads):.1f}–{max(loads):.1f}"
    return ", ".join(f"{load:.1f}" for load in loads)


def ratio_of_medians(figure: dict[str, Any], figures: Sequence[dict[str, Any]]) -> list[dict]:
    """The two recorded figures whose medians a one-value ratio figure is (ours ÷ theirs or
    theirs ÷ ours); empty when it is not such a ratio. Two figures with the same median are
    no such pair: all workers and all pods Running of one contender share their median
    whenever its last pod is a worker, and their ratio, 1, would claim any one-trial figure
    of 1 as a ratio of their medians (a true ratio of exactly 1 is then shown as one
    trial's, without a verdict: the cautious side)."""
    if figure["unit"] != "x" or len(figure["values"]) != 1:
        return []
    value = figure["values"][0]
    for top in figures:
        for bottom in figures:
            if top is bottom or not (top["values"] and bottom["values"]):
                continue
            if _same(top["median"], bottom["median"]):
                continue
            if top["unit"] == "x" or top["unit"] != bottom["unit"] or bottom["median"] <= 0:
                continue
            if _same(top["median"] / bottom["median"], value):
                return [bottom, top]
    return []


def is_ratio(figure: dict[str, Any]) -> bool:
    """A figure that compares two things (a ratio, an overhead against a reference)."""
    return figure["unit"] == "x" or "÷" in figure["name"] or "overhead" in figure["name"]


def compared(figure: dict[str, Any], figures: Sequence[dict[str, Any]]) -> list[dict]:
    """The recorded figures a comparison stands on: a figure and the one its reference is the
    median of (itself alone when the record holds no such figure); the two behind a ratio of
    medians; a figure alone otherwise."""
    if figure.get("reference_value") is not None:
        theirs = [
            f
            for f in figures
            if f is not figure
            and f["values"]
            and f["unit"] == figure["unit"]
            and _same(f["median"], figure["reference_value"])
        ]
        return [figure, *theirs[:1]]
    return ratio_of_medians(figure, figures) or [figure]


def trials_text(behind: Sequence[dict[str, Any]]) -> str:
    counts = [len(f["values"]) for f in behind]
    return " and ".join(str(n) for n in counts) + (" trial" if counts == [1] else " trials")


def short_of_trials(behind: Sequence[dict[str, Any]]) -> bool:
    return min(len(f["values"]) for f in behind) < MIN_TRIALS


NAME_PARTS = re.compile(r"(, |: )")
"""Where a figure's name is cut into its parts (its scenario, what is timed, whose): a part
shared by every name compared says nothing about which is which."""


def distinct_names(names: Sequence[str]) -> list[str]:
    """What tells figures' names apart, for a note that must say whose each value is without
    repeating what they share: the parts (:data:`NAME_PARTS`) all of them share at the start
    and at the end dropped, each keeping one part at least. ``…, idle: apply → all Running,
    bare client`` beside ``…, torchkube`` gives ``bare client`` and ``torchkube``."""
    split = [NAME_PARTS.split(name) for name in names]
    shortest = min(len(s) for s in split)  # parts at even places, their separators between

    def shared(start: int, end: int) -> bool:
        return len({tuple(s[start:end] if end else s[start:]) for s in split}) == 1

    head = 0
    while head + 2 < shortest and shared(head, head + 2):
        head += 2
    tail = 0
    while head + tail + 2 < shortest and shared(-tail - 2, -tail):
        tail += 2
    return ["".join(s[head : len(s) - tail]) for s in split]


def loads_differ(behind: Sequence[dict[str, Any]], cores: int) -> str:
    """``loads differ: A at a vs B at b`` when the contenders' median trial loads lie further
    apart than :data:`LOAD_MARGIN` per core; empty otherwise. Each load is named by what sets
    its figure's name apart from the other's: the note stands beside a ratio read in one order
    and a loads column listed in another."""
    loaded = [f for f in behind if f.get("load_average")]
    medians = [median(f["load_average"]) for f in loaded]
    if len(medians) < 2 or max(medians) - min(medians) <= LOAD_MARGIN * cores:
        return ""
    names = distinct_names([f["name"] for f in loaded])
    named = len(set(names)) == len(names)
    pairs = zip(names, medians, strict=True)
    loads = [f"{name} at {load:.1f}" if named else f"{load:.1f}" for name, load in pairs]
    return "loads differ: " + " vs ".join(loads)


def ruled_verdict(figure: dict[str, Any], figures: Sequence[dict[str, Any]]) -> str:
    """The recorded verdict (judged on the median), unless fewer than :data:`MIN_TRIALS`
    trials stand behind it."""
    if "target" not in figure:
        return ""
    if not figure["values"]:
        return "not measured"
    behind = ratio_of_medians(figure, figures) or [figure]
    if short_of_trials(behind):
        return f"no verdict: {trials_text(behind)}"
    return str(figure.get("verdict", ""))


def ruled_reference(figure: dict[str, Any], figures: Sequence[dict[str, Any]], cores: int) -> str:
    """The reference, and its ratio where both contenders have :data:`MIN_TRIALS` trials (said
    otherwise), with a note when their loads differ."""
    if "reference" not in figure:
        return ""
    behind = compared(figure, figures)
    if len(behind) < 2:
        return f"{figure['reference']} (no ratio: its trials are not in the record)"
    if short_of_trials(behind):
        return f"{figure['reference']} (no ratio: {trials_text(behind)})"
    ratio = figure.get("ratio")
    notes = [f"ratio {ratio:.2f}"] if ratio is not None else []
    notes += [text] if (text := loads_differ(behind, cores)) else []
    return figure["reference"] + (f" ({'; '.join(notes)})" if notes else "")


def figure_rows(figures: Sequence[dict[str, Any]], cores: int = 2) -> list[list[str]]:
    """The rows of a result file's figures (:meth:`Figure.to_json`): tables are rendered from
    the recorded JSON alone, so a table can never say what the record does not. Ratios and
    verdicts follow the rule (:data:`MIN_TRIALS`, :data:`LOAD_MARGIN`); a ratio of two
    medians shows the trials of both and their loads."""
    rows = []
    for f in figures:
        unit, verdict = f["unit"], ruled_verdict(f, figures)
        name = f["name"] + (f" ({f['note']})" if f.get("note") else "")
        if not f["values"]:
            rows.append([name, "0", "not measured", "", "", "", "", verdict, ""])
            continue
        pair = ratio_of_medians(f, figures)
        if pair:
            counts = ", ".join(str(len(p["values"])) for p in pair)
            shown = (
                f"no ratio: {trials_text(pair)}"
                if short_of_trials(pair)
                else fmt(f["median"], unit)
            )
            loads = "; ".join(loads_of(p) for p in pair)
            differ = loads_differ(pair, cores)
            rows.append(
                [
                    f"{name} (a ratio of medians)",
                    counts,
                    shown,
                    "",
                    "",
                    loads + (f" ({differ})" if differ else ""),
                    f.get("target", ""),
                    verdict,
                    "",
                ]
            )
            continue
        if is_ratio(f) and short_of_trials([f]):
            withheld = f"no ratio: {trials_text([f])}"
            rows.append([name, str(f["n"]), withheld, "", "", loads_of(f), f.get("target", "")])
            rows[-1] += [verdict, ruled_reference(f, figures, cores)]
            continue
        rows.append(
            [
                name,
                str(f["n"]),
                fmt(f["median"], unit),
                fmt(f["p95"], unit),
                f"{fmt(f['min'], unit)} – {fmt(f['max'], unit)}",
                loads_of(f),
                f.get("target", ""),
                verdict,
                ruled_reference(f, figures, cores),
            ]
        )
    return rows


def cells_of_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], figures: Sequence[dict[str, Any]]
) -> list[list[str]]:
    """A recorded table's rows with its ratio and target cells (a header with ``÷``, or
    ``ratio``, or ``target``) withheld where a figure the row shows, by its ``median [min –
    max]``, has fewer than :data:`MIN_TRIALS` trials, or where the row shows none."""
    judged = [
        i
        for i, header in enumerate(headers)
        if "÷" in header or "ratio" in header or header == "target"
    ]
    if not judged:
        return [list(row) for row in rows]
    by_spread: dict[str, list[dict[str, Any]]] = {}
    for f in figures:
        if f["values"]:
            by_spread.setdefault(spread_of(f), []).append(f)
    out = []
    for row in rows:
        shown = [f for i, c in enumerate(row) if i not in judged for f in by_spread.get(c, [])]
        cells = list(row)
        if not shown or short_of_trials(shown):
            counts = sorted({len(f["values"]) for f in shown})
            why = (
                "no figure in the row"
                if not shown
                else f"{counts[0]} trial{'s' if counts[0] > 1 else ''} each"
                if len(counts) == 1
                else f"{counts[0]}–{counts[-1]} trials"
            )
            for i in judged:
                if cells[i] not in ("", "–"):
                    cells[i] = f"none: {why}"
        out.append(cells)
    return out


def arguments(body: dict[str, Any]) -> str:
    """The arguments a run used: its command where that names them, else the record's
    configuration (a command recorded without its flags ran with these)."""
    command, config = body["command"], body.get("config") or {}
    if len(command.split()) > 3 or not config:
        return f"`{command}`"

    def value(v: Any) -> str:
        return ",".join(str(x) for x in v) if isinstance(v, list) else str(v)

    return f"`{command}` with {', '.join(f'{k}={value(v)}' for k, v in config.items())}"


def markdown_of(body: dict[str, Any]) -> str:
    """A result file (:meth:`Results.to_json`) as Markdown: its header line (command and its
    arguments, date, machine, load, revision), the figures, the extra tables and the notes;
    ratios and verdicts by the rule (:func:`figure_rows`, :func:`cells_of_table`)."""
    m = body["machine"]
    cores = int(m.get("nproc", 2))
    lines = [
        f"### {body['benchmark']}",
        "",
        f"{arguments(body)} — {m['date']}, {m['nproc']} cores ({m['cpu']}), "
        f"{m['memory_gib']} GiB, kernel {m['kernel']}, load average at start "
        f"{' / '.join(str(x) for x in m['load_average_at_start'])}"
        + (f", torch {m['torch']}" if "torch" in m else "")
        + (f", revision {m['revision']}" if "revision" in m else ""),
        "",
    ]
    figures = body["figures"]
    if figures:
        lines += [markdown_table(FIGURE_HEADERS, figure_rows(figures, cores)), ""]
    for title, table in body["tables"].items():
        rows = cells_of_table(table["headers"], table["rows"], figures)
        lines += [f"**{title}**", "", markdown_table(table["headers"], rows), ""]
    lines += [f"- {note}" for note in body["notes"]]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- results
@dataclass
class Results:
    """One benchmark run: its figures, extra tables, notes, and where it was measured."""

    name: str
    command: str
    config: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    tables: dict[str, tuple[list[str], list[list[str]]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=machine_info)

    def figure(self, name: str, unit: str, **kwargs: Any) -> Figure:
        found = Figure(name, unit, **kwargs)
        self.figures.append(found)
        return found

    def to_json(self) -> dict[str, Any]:
        self.machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        return {
            "benchmark": self.name,
            "command": self.command,
            "machine": self.machine,
            "config": self.config,
            "figures": [f.to_json() for f in self.figures],
            "tables": {k: {"headers": h, "rows": r} for k, (h, r) in self.tables.items()},
            "notes": self.notes,
            "extra": self.extra,
        }

    def markdown(self) -> str:
        return markdown_of(self.to_json())

    def write(self, directory: Path = RESULTS_DIR) -> Path:
        """Write ``<name>.json``; print its table and where it went (``python -m bench.report``
        puts the table into docs/benchmarks.md)."""
        directory.mkdir(parents=True, exist_ok=True)
        json_path = directory / f"{self.name}.json"
        json_path.write_text(json.dumps(self.to_json(), indent=1, default=str) + "\n")
        print("\n" + self.markdown())
        print(f"results: {json_path}")
        return json_path


def command_line(module: str, argv: Sequence[str] | None = None) -> str:
    """How a benchmark was started, with the arguments it was given (``sys.argv`` unless
    ``argv``): a record's header then names the run's flags, never only the module."""
    return " ".join([f"python -m {module}", *(sys.argv[1:] if argv is None else argv)])


def log(message: str) -> None:
    """Progress on stderr with a time stamp and the load, so a slow trial can be explained."""
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp} load {load_average():.1f}] {message}", file=sys.stderr, flush=True)
