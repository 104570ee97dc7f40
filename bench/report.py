"""Copy the last results (``bench/results/*.md``) into docs/benchmarks.md and bench/README.md.

Run: ``python -m bench.report`` after a benchmark. Only the text between the markers
``<!-- results:begin -->`` and ``<!-- results:end -->`` is replaced, so the prose around the
tables is written by hand and the numbers are never copied by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import RESULTS_DIR, ROOT, markdown_table

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
ORDER = [
    "operator_scale",
    "operator_scale_single",
    "operator_scale_fast-scheduler",
    "operator_scale_fleet",
    "queued_start",
    "operator_recovery",
    "recovery_e2e",
    "real_node_recovery",
    "trainer_throughput",
    "trainer_throughput_gpu",
    "checkpoint_cost",
]
TARGETS = ROOT / "docs" / "benchmarks.md", ROOT / "bench" / "README.md"


def summary(results_dir: Path = RESULTS_DIR) -> str:
    """Every figure that has a target, from every result file: one table of met/missed."""
    rows = []
    for name in ordered(results_dir):
        body = json.loads((results_dir / f"{name}.json").read_text())
        for fig in body["figures"]:
            if "target" not in fig:
                continue
            unit = fig["unit"]
            value = fig.get("median")
            shown = "not measured" if value is None else f"{value:.3g} {unit}"
            ref = fig.get("reference", "")
            if fig.get("ratio") is not None:
                ref += f" (ratio {fig['ratio']:.2f})"
            rows.append([name, fig["name"], shown, fig["target"], fig["verdict"], ref])
    return markdown_table(["benchmark", "figure", "median", "target", "", "reference"], rows)


def ordered(results_dir: Path) -> list[str]:
    present = {p.stem for p in results_dir.glob("*.json")}
    return [n for n in ORDER if n in present] + sorted(present - set(ORDER))


def render(results_dir: Path = RESULTS_DIR) -> str:
    parts = ["#### Targets", "", summary(results_dir), ""]
    for name in ordered(results_dir):
        md = results_dir / f"{name}.md"
        if md.exists():
            parts += [md.read_text().replace("### ", "#### ", 1), ""]
    return "\n".join(parts).rstrip() + "\n"


def splice(document: str, block: str) -> str:
    """Replace what lies between the markers; the markers must be there, once each."""
    if document.count(BEGIN) != 1 or document.count(END) != 1:
        raise ValueError(f"the document needs exactly one {BEGIN} and one {END}")
    head, rest = document.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def main() -> None:
    block = render()
    for path in TARGETS:
        path.write_text(splice(path.read_text(), block))
        print(f"updated {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
