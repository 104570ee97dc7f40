"""The suite's files, checked as pytest's default import mode needs them.

The tiers have no ``__init__.py``: pytest imports each test file by its bare
name, so two files of one name in different tiers pass tier by tier and break
the one run of them all that CI makes, at collection, before any test runs."""

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name_across_tiers() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in sorted(TESTS.glob("*/test_*.py")):
        by_name[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"rename one of each: {shared}"
