"""Render the last results (``bench/results/*.json``) into docs/benchmarks.md, the one place
their tables are published (bench/README.md links there).

Run: ``python -m bench.report`` after a benchmark. Only the text between the markers
``<!-- results:begin -->`` and ``<!-- results:end -->`` is replaced, so the prose around the
tables is written by hand and the numbers are never copied by hand. The same goes for the
README's quick-start sample (``<!-- quickstart:begin -->``), the output ``bench.quickstart``
recorded, for its picture, ``docs/images/quickstart.png``, drawn from the run of the same
record, and for every block of :data:`bench.blocks.BLOCKS`: each measured figure README.md,
docs/benchmarks.md, docs/operator.md, docs/queueing.md and docs/trainer.md quote
(``<!-- NAME:begin -->``).
Ratios and verdicts follow the rule of :mod:`bench.common` (none on fewer than three trials
per contender).

``python -m bench.report --check`` writes nothing: it fails (exit 1), naming each, when a
rendered block or the picture differs from what the records render.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import blocks, quickstart
from bench.common import RESULTS_DIR, ROOT, figure_rows, markdown_of, markdown_table, repo_path

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
ORDER = [
    "operator_scale",
    "operator_scale_single",
    "operator_scale_fast-scheduler",
    "operator_scale_fleet",
    "operator_cost",
    "queued_start",
    "operator_recovery",
    "recovery_e2e",
    "real_node_recovery",
    "trainer_throughput",
    "trainer_throughput_gpu",
    "checkpoint_cost",
]
TARGET = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
OPERATOR = ROOT / "docs" / "operator.md"
QUEUEING = ROOT / "docs" / "queueing.md"
TRAINER = ROOT / "docs" / "trainer.md"
SAMPLE = "<!-- quickstart:begin -->", "<!-- quickstart:end -->"


def summary(results_dir: Path = RESULTS_DIR) -> str:
    """Every figure that has a target, from every result file: one table of verdicts, each on
    the median with its range and every trial's load, and none on fewer than
    :data:`~bench.common.MIN_TRIALS` trials (the rule)."""
    rows = []
    for name in ordered(results_dir):
        body = json.loads((results_dir / f"{name}.json").read_text())
        cores = int(body["machine"].get("nproc", 2))
        figures = body["figures"]
        for fig, row in zip(figures, figure_rows(figures, cores), strict=True):
            if "target" not in fig:
                continue
            figure, n, shown, _, spread, loads, target, verdict, ref = row
            if spread:
                shown = f"{shown} [{spread}]"
            rows.append([name, figure, n, shown, loads, target, verdict, ref])
    headers = ["benchmark", "figure", "trials", "median [min – max]", "load per trial"]
    return markdown_table([*headers, "target", "", "reference"], rows)


def ordered(results_dir: Path) -> list[str]:
    present = {p.stem for p in results_dir.glob("*.json")}
    return [n for n in ORDER if n in present] + sorted(present - set(ORDER))


RELABELED = {"goodput over the run": "steps × median step time ÷ wall time"}
"""Recorded names that say more than their figure measures, rendered as what the figure is:
live_recovery's "goodput over the run" is the steps times the run's median step time over the
wall time (its record's notes), which slower steps raise — no goodput."""


def relabeled(text: str) -> str:
    for recorded, shown in RELABELED.items():
        text = text.replace(recorded, shown)
    return text


def render(results_dir: Path = RESULTS_DIR) -> str:
    parts = ["#### Targets", "", summary(results_dir), ""]
    for name in ordered(results_dir):
        body = json.loads((results_dir / f"{name}.json").read_text())
        parts += [relabeled(markdown_of(body)).replace("### ", "#### ", 1), ""]
    return "\n".join(parts).rstrip() + "\n"


def splice(document: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    """Replace what lies between the markers; the markers must be there, once each."""
    if document.count(begin) != 1 or document.count(end) != 1:
        raise ValueError(f"the document needs exactly one {begin} and one {end}")
    head, rest = document.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{block}{end}{tail}"


def quickstart_sample(body: dict[str, Any]) -> str:
    """The README's sample: the recorded output, and where and when it was recorded."""
    m = body["machine"]
    return (
        f"Recorded by `python -m bench.quickstart` on {m['date']}: {m['nproc']} cores "
        f"({m['cpu']}), 1-minute load average {m['load_average_at_start'][0]} at the start "
        f"({m['nproc']} would keep every core busy), revision {m['revision']}:\n\n"
        f"```\n{body['extra']['output']}```\n"
    )


def documents(results_dir: Path | None = None) -> dict[Path, str]:
    """Each document the records are rendered into, as the records render it: the tables
    here, the README's quick-start sample, and every block of :data:`bench.blocks.BLOCKS`
    whose records are there."""
    results_dir = results_dir or RESULTS_DIR
    out = {TARGET: splice(TARGET.read_text(), render(results_dir))}
    recorded = results_dir / "quickstart.json"
    if recorded.exists():
        sample = quickstart_sample(json.loads(recorded.read_text()))
        out[README] = splice(README.read_text(), sample, *SAMPLE)
    present = {p.stem for p in results_dir.glob("*.json")}
    for block in blocks.BLOCKS:
        if not set(block.records) <= present:
            continue
        records = {n: json.loads((results_dir / f"{n}.json").read_text()) for n in block.records}
        path: Path = globals()[block.document]
        text = out[path] if path in out else path.read_text()
        out[path] = splice(text, block.render(records), *block.markers)
    return out


def quickstart_picture(results_dir: Path | None = None) -> bytes | None:
    """The README's picture as the quick start's record draws it (None: no recorded run)."""
    recorded = (results_dir or RESULTS_DIR) / "quickstart.json"
    body = json.loads(recorded.read_text()) if recorded.exists() else {}
    if "run" not in body.get("extra", {}):
        return None
    with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
        return quickstart.draw(body, Path(scratch) / "quickstart.png").read_bytes()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when a rendered block or picture differs from its record",
    )
    args = parser.parse_args(argv)
    stale = []
    for path, text in documents().items():
        if path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text)
            print(f"updated {repo_path(path)}")
    image, picture = quickstart.IMAGE, quickstart_picture()
    if picture is None:
        print(f"{repo_path(image)}: the quickstart record holds no run to draw it from")
        stale.append(image)
    elif not image.exists() or image.read_bytes() != picture:
        stale.append(image)
        if not args.check:
            image.write_bytes(picture)
            print(f"drew {repo_path(image)}")
    if args.check and stale:
        names = ", ".join(repo_path(path) for path in stale)
        sys.exit(f"not what bench/results/*.json render: {names} (python -m bench.report does)")


if __name__ == "__main__":
    main()
