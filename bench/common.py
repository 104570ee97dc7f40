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

import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"


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
    """What a figure must be: at most (``max``) or at least (``min``) ``limit``."""

    limit: float
    direction: Direction = "max"
    text: str = ""

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
        """``met``/``missed`` judged on the median; says so when the p95 misses."""
        stats = self.stats
        if self.target is None:
            return ""
        if stats is None:
            return "not measured"
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
    if unit == "steps" and float(value).is_integer():  # a count
        return f"{int(value):,} steps"
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


def figure_rows(figures: Sequence[dict[str, Any]]) -> list[list[str]]:
    """The rows of a result file's figures (:meth:`Figure.to_json`): tables are rendered from
    the recorded JSON alone, so a table can never say what the record does not."""
    rows = []
    for f in figures:
        unit, verdict = f["unit"], f.get("verdict", "")
        if not f["values"]:
            rows.append([f["name"], "0", "not measured", "", "", "", "", verdict, ""])
            continue
        loads = f["load_average"]
        load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else ""
        ref = ""
        if "reference" in f:
            ratio = f.get("ratio")
            ref = f["reference"] + (f" (ratio {ratio:.2f})" if ratio is not None else "")
        rows.append(
            [
                f["name"] + (f" ({f['note']})" if f.get("note") else ""),
                str(f["n"]),
                fmt(f["median"], unit),
                fmt(f["p95"], unit),
                f"{fmt(f['min'], unit)} – {fmt(f['max'], unit)}",
                load,
                f.get("target", ""),
                verdict,
                ref,
            ]
        )
    return rows


def markdown_of(body: dict[str, Any]) -> str:
    """A result file (:meth:`Results.to_json`) as Markdown: its header line (command, date,
    machine, load, revision), the figures, the extra tables and the notes."""
    m = body["machine"]
    lines = [
        f"### {body['benchmark']}",
        "",
        f"`{body['command']}` — {m['date']}, {m['nproc']} cores ({m['cpu']}), "
        f"{m['memory_gib']} GiB, kernel {m['kernel']}, load average at start "
        f"{' / '.join(str(x) for x in m['load_average_at_start'])}"
        + (f", torch {m['torch']}" if "torch" in m else "")
        + (f", revision {m['revision']}" if "revision" in m else ""),
        "",
    ]
    if body["figures"]:
        lines += [markdown_table(FIGURE_HEADERS, figure_rows(body["figures"])), ""]
    for title, table in body["tables"].items():
        lines += [f"**{title}**", "", markdown_table(table["headers"], table["rows"]), ""]
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


def log(message: str) -> None:
    """Progress on stderr with a time stamp and the load, so a slow trial can be explained."""
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp} load {load_average():.1f}] {message}", file=sys.stderr, flush=True)
