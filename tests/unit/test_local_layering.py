"""``torchkube run`` shares the operator's decisions without importing the operator: what both
use lives in ``torchkube/policy/`` and ``torchkube/api/``. An import of ``torchkube.operator``
from ``torchkube/local/`` (or from the shared policy) would bring the copy-or-import choice
back, so no module there names it, not even inside a function."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = [ROOT / "torchkube" / "local", ROOT / "torchkube" / "policy"]
MODULES = sorted(path for folder in SHARED for path in folder.glob("*.py"))


def imported(source: str) -> set[str]:
    """Every module an import statement anywhere in ``source`` names (``from a import b``
    names ``a`` and ``a.b``: ``b`` may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def is_operator(name: str) -> bool:
    return name == "torchkube.operator" or name.startswith("torchkube.operator.")


def test_the_check_sees_every_form_of_import() -> None:
    sources = [
        "import torchkube.operator.failure",
        "from torchkube.operator import failure",
        "from torchkube import operator",
        "def f():\n    from torchkube.operator.workloads import queue_name",
    ]
    assert all(any(map(is_operator, imported(source))) for source in sources)
    assert not any(map(is_operator, imported("from torchkube.policy import failures")))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_local_or_policy_module_imports_the_operator(path: Path) -> None:
    found = sorted(filter(is_operator, imported(path.read_text())))
    assert found == [], f"{path.relative_to(ROOT)} imports {found}"


def test_importing_the_local_runner_loads_nothing_of_the_operator() -> None:
    """What those modules import may not bring the operator in either."""
    modules = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in MODULES
        if path.name != "__init__.py"
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('torchkube.operator')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
