"""Write the requirement lists hack/lock.sh compiles, from pyproject.toml alone.

``python hack/lock_inputs.py DIR`` writes DIR/{trainer,torch,operator,dev}.in. The same lists
are what tests/unit/test_lock.py checks the lock files against, so this is their one home.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def name(requirement: str) -> str:
    """The distribution name of a requirement line, normalised (PEP 503)."""
    bare = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", bare).lower()


def inputs() -> dict[str, list[str]]:
    """Lock file name -> the requirement lines it locks."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps, extras = project["dependencies"], project["optional-dependencies"]
    own = [r for r in extras["test"] if name(r) != "torchkube"]
    return {
        "trainer": [*deps, *extras["data"], *extras["live"]],
        "torch": [r for r in deps if name(r) == "torch"],
        "operator": list(extras["operator"]),
        "dev": [*deps, *extras["data"], *extras["live"], *extras["plot"], *own],
    }


def main(folder: str) -> None:
    for lock, lines in inputs().items():
        (Path(folder) / f"{lock}.in").write_text("".join(line + "\n" for line in lines))


if __name__ == "__main__":
    main(sys.argv[1])
