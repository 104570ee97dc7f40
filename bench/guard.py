"""The quick regression guard CI runs (tests/integration/test_operator_speed_guard.py and
tests/local/test_recovery_guard.py): a few small measurements against the last recorded
benchmark run in ``bench/results/``, failing only on a gross regression.

A guard measures on the test suite's cluster and machine, not the benchmark's quiet one, so it
allows ``FACTOR`` times the recorded median plus ``SLACK_S`` seconds (a busy CI machine, one
trial instead of many) and prints both figures either way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bench.common import RESULTS_DIR

FACTOR = 3.0
SLACK_S = 1.0


class MissingBaseline(LookupError):
    """The recorded results lack the figure a guard compares with."""


def baseline(benchmark: str, figure: str, results_dir: Path = RESULTS_DIR) -> float:
    """The recorded median of ``figure``: from ``bench/results/<benchmark>.json`` or a run of
    one of its scenarios (``<benchmark>_<scenario>.json``, ``--only``), the latest recorded
    that has it, so re-recording one scenario moves the guard's baseline with it."""
    paths = [results_dir / f"{benchmark}.json", *sorted(results_dir.glob(f"{benchmark}_*.json"))]
    found: list[tuple[str, float]] = []
    unreadable: list[str] = []
    for path in paths:
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            unreadable.append(f"{path}: {error}")
            continue
        recorded_at = str(body.get("machine", {}).get("date", ""))
        for entry in body.get("figures", []):
            if entry.get("name") == figure and entry.get("median") is not None:
                found.append((recorded_at, float(entry["median"])))
    if found:
        return max(found)[1]
    hint = f"run bench/run.sh {benchmark} to record it"
    if len(unreadable) == len(paths):
        raise MissingBaseline(f"cannot read {'; '.join(unreadable)}; {hint}")
    raise MissingBaseline(f"{benchmark} results have no median for {figure!r}; {hint}")


@dataclass(frozen=True)
class Check:
    """One guarded figure: what was measured now against what was recorded."""

    figure: str
    measured: float
    recorded: float

    @property
    def limit(self) -> float:
        return FACTOR * self.recorded + SLACK_S

    @property
    def passed(self) -> bool:
        return self.measured <= self.limit

    def describe(self) -> str:
        verdict = "ok" if self.passed else "GROSS REGRESSION"
        return (
            f"{self.figure}: {self.measured:.3f} s now, {self.recorded:.3f} s recorded, "
            f"limit {self.limit:.3f} s ({FACTOR:g}× + {SLACK_S:g} s): {verdict}"
        )


def report(checks: list[Check]) -> str:
    """Every check on a line; the caller prints it and asserts :func:`passed`."""
    return "\n".join(check.describe() for check in checks)


def passed(checks: list[Check]) -> bool:
    return all(check.passed for check in checks)
