"""CI's regression guard for the README's quick start (see bench/guard.py): its first command
run once as the README gives it (``bench.quickstart.run_quickstart``), the reader's wait from
the command's start to its exit — an exit that lingers after the summary included — against
the wall time its last record printed (``bench/results/quickstart.json``). Fails only on a
gross regression; prints the figures either way."""

import pytest

from bench import guard
from bench.quickstart import run_quickstart

pytestmark = pytest.mark.slow

FIGURE = "wall time"


def test_the_quick_start_has_not_regressed_grossly() -> None:
    recorded = guard.baseline("quickstart", FIGURE)
    check = guard.Check("quick start: command start → exit", 0.0, recorded)
    ran = run_quickstart(timeout=check.limit + 10)  # a hang is killed, past the limit
    assert ran.code == 0 and ran.run is not None, (
        f"the quick start failed (exit {ran.code}) after {ran.seconds:.1f} s "
        f"(limit {check.limit:.1f} s):\n{ran.shown[-3000:]}"
    )
    checks = [guard.Check(check.figure, ran.seconds, recorded)]
    print("\n" + guard.report(checks))
    assert guard.passed(checks), guard.report(checks)
