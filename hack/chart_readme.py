"""Print a chart's README.md with its values table regenerated from values.yaml's comments.

Usage: ``python hack/chart_readme.py charts/torchkube > README.md`` (hack/render-manifests.sh
runs it). The table sits between the ``<!-- values:start -->`` and ``<!-- values:end -->``
markers; everything else in the README is kept as written.

values.yaml is the single place a value is documented: the comment right above a key must start
with the key's name (Helm's best practice). values.schema.json says which keys are sections
(objects with ``properties``) and which are values (free-form maps such as ``resources`` count as
one value). The script fails, naming the key, when a key has no such comment or when
values.yaml and the schema disagree, so an undocumented value cannot be added.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

START, END = "<!-- values:start -->", "<!-- values:end -->"
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?P<rest>.*)$")
IGNORED_SCHEMA_KEYS = {"global"}  # Helm's own: parent charts pass it, values.yaml never sets it


def schema_paths(node: dict[str, Any], prefix: str = "") -> dict[str, bool]:
    """Every key path in the schema -> whether it is a section (has properties of its own)."""
    paths: dict[str, bool] = {}
    for name, child in node.get("properties", {}).items():
        if not prefix and name in IGNORED_SCHEMA_KEYS:
            continue
        path = f"{prefix}{name}"
        paths[path] = "properties" in child
        if "properties" in child:
            paths.update(schema_paths(child, f"{path}."))
    return paths


def documented_keys(values_text: str, sections: dict[str, bool]) -> dict[str, str]:
    """Key path -> the comment block right above it, for every key outside free-form values."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in values_text.splitlines():
        stripped = line.strip()
        if not stripped:
            comment = []
            continue
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        match = KEY_LINE.match(line)
        if not match:  # a list item or a continuation inside a value
            comment = []
            continue
        indent, key = len(match["indent"]), match["key"]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = ".".join(name for _, name in stack)
        if parent and not sections.get(parent, False):
            comment = []  # inside a free-form value such as resources: not a chart key
            continue
        path = f"{parent}.{key}" if parent else key
        found[path] = " ".join(comment)
        stack.append((indent, key))
        comment = []
    return found


def check(documented: dict[str, str], sections: dict[str, bool]) -> list[str]:
    problems = []
    for path in sorted(set(sections) - set(documented)):
        problems.append(f"{path}: in values.schema.json but not in values.yaml")
    for path in sorted(set(documented) - set(sections)):
        problems.append(f"{path}: in values.yaml but not in values.schema.json")
    for path, text in sorted(documented.items()):
        key = path.rsplit(".", 1)[-1]
        if not re.match(rf"{re.escape(key)}\b", text):
            problems.append(f"{path}: the comment above it must start with {key!r} (got {text!r})")
    return problems


def lookup(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return node


def table(chart: Path) -> str:
    schema = json.loads((chart / "values.schema.json").read_text())
    values_text = (chart / "values.yaml").read_text()
    sections = schema_paths(schema)
    documented = documented_keys(values_text, sections)
    problems = check(documented, sections)
    if problems:
        raise SystemExit("values.yaml is not fully documented:\n  " + "\n  ".join(problems))
    values = yaml.safe_load(values_text)
    rows = ["| Key | Default | Description |", "|---|---|---|"]
    for path, text in documented.items():
        if sections[path]:
            continue
        default = json.dumps(lookup(values, path), separators=(", ", ": "))
        description = text.replace("|", "\\|")
        rows.append(f"| `{path}` | `{default}` | {description} |")
    return "\n".join(rows)


def main() -> None:
    chart = Path(sys.argv[1])
    readme = (chart / "README.md").read_text()
    if START not in readme or END not in readme:
        raise SystemExit(f"{chart / 'README.md'} needs the markers {START} and {END}")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    sys.stdout.write(f"{head}{START}\n{table(chart)}\n{END}{tail}")


if __name__ == "__main__":
    main()
