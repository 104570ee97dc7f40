"""Reading torchkube's Grafana dashboards (``dashboards/*.json``) the way Grafana does.

Three things the tests need and Grafana would otherwise be the only judge of: every PromQL
expression in a dashboard (panel targets, annotation queries, template variable queries),
that expression with the template variables filled in, and the structural checks Grafana's
dashboard schema makes for the ``schemaVersion`` the file declares.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.binaries import repo_root

if TYPE_CHECKING:
    from testbed.prometheus import Prometheus

MIN_SCHEMA_VERSION = 36
"""Datasources as ``{type, uid}`` objects (what ``${datasource}`` needs) since schema 36."""
BUILTIN_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}
"""Grafana's own variables, with values that suit a test run of a few minutes."""
VARIABLE_TYPES = {"query", "datasource", "custom", "constant", "interval", "textbox", "adhoc"}
DATASOURCE = "${datasource}"
OPTIONAL = ("DCGM_", "kueue_")
"""Metrics from exporters torchkube does not run (NVIDIA's DCGM, Kueue): their queries must be
valid, may be empty."""
_REFERENCE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)\]\]|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.+),\s*)?(\w+)\s*\)\s*$", re.S)


def dashboard_dir() -> Path:
    return repo_root() / "dashboards"


def load_all(folder: Path | None = None) -> dict[str, dict[str, Any]]:
    """File name → parsed dashboard, for every ``*.json`` in ``folder``."""
    folder = folder or dashboard_dir()
    return {path.name: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


@dataclass(frozen=True)
class Query:
    """One PromQL expression and where it sits in the dashboard."""

    where: str
    expr: str
    kind: str
    """``panel``, ``annotation`` or ``variable`` (a ``label_values(...)`` query)."""


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those nested in collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: Mapping[str, Any]) -> list[Query]:
    found: list[Query] = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            if target.get("expr"):
                where = f"panel {panel.get('title')!r} target {target.get('refId')}"
                found.append(Query(where, target["expr"], "panel"))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            found.append(
                Query(f"annotation {annotation['name']!r}", annotation["expr"], "annotation")
            )
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable.get("query")
            text = query.get("query") if isinstance(query, dict) else query
            found.append(Query(f"variable {variable['name']!r}", str(text), "variable"))
    return found


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with ``$var``, ``${var}``, ``${var:fmt}`` and ``[[var]]`` replaced, as Grafana
    interpolates them; Grafana's built-ins (``$__rate_interval``, ...) get test values."""
    known = {**BUILTIN_VARIABLES, **values}

    def replace(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        if name not in known:
            raise KeyError(f"no value for template variable ${name} in {expr!r}")
        return known[name]

    return _REFERENCE.sub(replace, expr)


def references(expr: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in _REFERENCE.finditer(expr)}


def label_values_query(text: str) -> tuple[str | None, str]:
    """``label_values(metric{...}, label)`` → (series selector or None, label)."""
    match = _LABEL_VALUES.match(text)
    if match is None:
        raise ValueError(f"not a label_values() query: {text!r}")
    return match.group(1), match.group(2)


def has_data(result: list[dict[str, Any]]) -> bool:
    """At least one finite value in a range-query result."""
    return any(
        not math.isnan(float(value)) for series in result for _, value in series.get("values", [])
    )


def evaluate(
    prom: Prometheus,
    values: Mapping[str, str],
    start: float,
    end: float,
    unexercised: Sequence[str] = (),
) -> int:
    """Every expression of every dashboard as Grafana would send it for ``values`` (the
    ``namespace`` and ``job`` variables), over ``start``..``end``: each must return data
    (``OPTIONAL`` exporters' need only be valid, and so must expressions holding one of
    ``unexercised``: what the caller's scenario does not produce), each variable must offer
    its value. Raises AssertionError listing every miss; returns how many expressions were
    checked."""
    from testbed.prometheus import PrometheusError

    values = {**values, "datasource": "prometheus"}
    failures: list[str] = []
    checked = 0
    for name, dashboard in load_all().items():
        assert problems(dashboard) == [], name
        for query in queries(dashboard):
            expr = substitute(query.expr, values)
            where = f"{name} {query.where}: {expr}"
            try:
                if query.kind == "variable":
                    selector, label = label_values_query(expr)
                    found = prom.label_values(label, selector)
                    if values[label] not in found:
                        failures.append(f"{where}: {values[label]!r} not in {found}")
                    checked += 1
                    continue
                result = prom.query_range(expr, start, end, step=1.0)
            except PrometheusError as error:
                failures.append(f"{where}: {error}")
                continue
            if any(part in expr for part in (*OPTIONAL, *unexercised)):
                continue
            if not has_data(result):
                failures.append(f"{where}: no data")
            checked += 1
    assert not failures, "\n".join(failures)
    return checked


# ---------------------------------------------------------------------------- structure


def problems(dashboard: Mapping[str, Any]) -> list[str]:
    """What Grafana's dashboard schema (for the declared ``schemaVersion``) would reject or
    misrender; empty when the dashboard is sound."""
    out: list[str] = []
    version = dashboard.get("schemaVersion")
    if not isinstance(version, int) or version < MIN_SCHEMA_VERSION:
        out.append(f"schemaVersion must be an integer >= {MIN_SCHEMA_VERSION}, not {version!r}")
    for key, kind in (
        ("title", str),
        ("uid", str),
        ("tags", list),
        ("editable", bool),
        ("graphTooltip", int),
        ("time", dict),
        ("panels", list),
        ("templating", dict),
        ("annotations", dict),
    ):
        if not isinstance(dashboard.get(key), kind):
            out.append(f"top-level {key!r} must be a {kind.__name__}")
    if isinstance(dashboard.get("uid"), str) and not 0 < len(dashboard["uid"]) <= 40:
        out.append("uid must have 1 to 40 characters")
    time_range = dashboard.get("time") or {}
    if not ({"from", "to"} <= set(time_range)):
        out.append("time needs 'from' and 'to'")
    variables = dashboard.get("templating", {}).get("list")
    annotations = dashboard.get("annotations", {}).get("list")
    if not isinstance(variables, list):
        out.append("templating.list must be a list")
        variables = []
    if not isinstance(annotations, list):
        out.append("annotations.list must be a list")
        annotations = []
    names = [v.get("name") for v in variables]
    out += _check_variables(variables)
    out += _check_annotations(annotations)
    out += _check_panels(dashboard)
    for query in queries(dashboard):
        for name in references(query.expr) - set(names) - set(BUILTIN_VARIABLES):
            out.append(f"{query.where}: ${name} is not a template variable")
    return out


def _datasource_ok(ref: Any) -> bool:
    return (
        isinstance(ref, dict) and ref.get("type") == "prometheus" and ref.get("uid") == DATASOURCE
    )


def _check_variables(variables: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    names = [v.get("name") for v in variables]
    if len(set(names)) != len(names):
        out.append(f"template variable names repeat: {names}")
    datasource = [v for v in variables if v.get("type") == "datasource"]
    if not datasource or datasource[0].get("name") != "datasource":
        out.append("a 'datasource' variable of type datasource must come first")
    elif datasource[0].get("query") != "prometheus":
        out.append("the datasource variable must select Prometheus data sources")
    for variable in variables:
        where = f"variable {variable.get('name')!r}"
        if variable.get("type") not in VARIABLE_TYPES:
            out.append(f"{where}: unknown type {variable.get('type')!r}")
        if variable.get("type") == "query":
            if not _datasource_ok(variable.get("datasource")):
                out.append(f"{where}: datasource must be {{type: prometheus, uid: {DATASOURCE}}}")
            query = variable.get("query")
            text = query.get("query") if isinstance(query, dict) else query
            try:
                label_values_query(str(text))
            except ValueError as error:
                out.append(f"{where}: {error}")
            if variable.get("refresh") not in (1, 2):
                out.append(f"{where}: refresh must be 1 (on load) or 2 (on time range change)")
    return out


def _check_annotations(annotations: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    if not any(a.get("builtIn") == 1 for a in annotations):
        out.append("annotations.list lacks Grafana's built-in 'Annotations & Alerts' entry")
    for annotation in annotations:
        where = f"annotation {annotation.get('name')!r}"
        for key, kind in (("name", str), ("enable", bool), ("iconColor", str)):
            if not isinstance(annotation.get(key), kind):
                out.append(f"{where}: {key!r} must be a {kind.__name__}")
        if annotation.get("builtIn") == 1:
            continue
        if not _datasource_ok(annotation.get("datasource")):
            out.append(f"{where}: datasource must be {{type: prometheus, uid: {DATASOURCE}}}")
        if not annotation.get("expr"):
            out.append(f"{where}: a Prometheus annotation needs an expr")
    return out


def _check_panels(dashboard: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    ids: list[Any] = []
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(dashboard):
        title = panel.get("title")
        where = f"panel {title!r}"
        ids.append(panel.get("id"))
        if not isinstance(panel.get("id"), int):
            out.append(f"{where}: id must be an integer")
        if not isinstance(panel.get("type"), str) or not isinstance(title, str):
            out.append(f"{where}: type and title must be strings")
        grid = panel.get("gridPos")
        if not isinstance(grid, dict) or not all(
            isinstance(grid.get(k), int) for k in ("h", "w", "x", "y")
        ):
            out.append(f"{where}: gridPos needs integer h, w, x, y")
            continue
        if not (1 <= grid["w"] <= 24 and grid["h"] >= 1 and grid["x"] >= 0 and grid["y"] >= 0):
            out.append(f"{where}: gridPos {grid} out of range")
        if grid["x"] + grid["w"] > 24:
            out.append(f"{where}: gridPos {grid} is wider than the 24-column grid")
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                if (x, y) in cells:
                    out.append(f"{where}: overlaps panel {cells[(x, y)]!r}")
                    break
                cells[(x, y)] = str(title)
            else:
                continue
            break
        if panel.get("type") == "row":
            if not isinstance(panel.get("collapsed"), bool) or not isinstance(
                panel.get("panels"), list
            ):
                out.append(f"{where}: a row needs 'collapsed' and a 'panels' list")
            continue
        if not _datasource_ok(panel.get("datasource")):
            out.append(f"{where}: datasource must be {{type: prometheus, uid: {DATASOURCE}}}")
        targets = panel.get("targets")
        if not isinstance(targets, list) or not targets:
            out.append(f"{where}: needs a non-empty targets list")
            continue
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or not all(isinstance(r, str) and r for r in refs):
            out.append(f"{where}: target refIds must be unique non-empty strings: {refs}")
        for target in targets:
            if not isinstance(target.get("expr"), str) or not target["expr"].strip():
                out.append(f"{where}: target {target.get('refId')} has no expr")
            if not _datasource_ok(target.get("datasource", panel.get("datasource"))):
                out.append(f"{where}: target datasource must be the panel's ${{datasource}}")
        field_config = panel.get("fieldConfig")
        if not isinstance(field_config, dict) or not (
            isinstance(field_config.get("defaults"), dict)
            and isinstance(field_config.get("overrides"), list)
        ):
            out.append(f"{where}: fieldConfig needs 'defaults' and an 'overrides' list")
        if not isinstance(panel.get("options"), dict):
            out.append(f"{where}: options must be an object")
    if len(set(ids)) != len(ids):
        out.append("panel ids repeat")
    return out


# ---------------------------------------------------------------------------- docs/metrics.md

_DOC_ROW = re.compile(r"^\|\s*`(torchkube_\w+)`\s*\|\s*(\w+)\s*\|([^|]*)\|")


@dataclass(frozen=True)
class MetricInfo:
    """A metric family as documented or exposed: its type and label names."""

    type: str
    labels: frozenset[str]


def documented_metrics(path: Path | None = None) -> dict[str, MetricInfo]:
    """The rows of docs/metrics.md's tables: ``| `name` | type | labels | unit | meaning |``."""
    path = path or repo_root() / "docs" / "metrics.md"
    found: dict[str, MetricInfo] = {}
    for line in path.read_text().splitlines():
        match = _DOC_ROW.match(line)
        if match:
            labels = {part.strip() for part in match.group(3).split(",")} - {"—", "-", ""}
            found[match.group(1)] = MetricInfo(match.group(2), frozenset(labels))
    return found


def exposed_metrics(text: str, prefix: str = "torchkube_") -> dict[str, MetricInfo]:
    """The metric families in a ``/metrics`` page, named as documented (counters with
    ``_total``); prometheus-client's ``_created`` companions are left out."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, MetricInfo] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix) or family.name.endswith("_created"):
            continue
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = {key for sample in family.samples for key in sample.labels} - {"le"}
        found[name] = MetricInfo(family.type, frozenset(labels))
    return found


def compare_metrics(
    documented: Mapping[str, MetricInfo], exposed: Mapping[str, MetricInfo]
) -> list[str]:
    """Differences between the docs and an endpoint, for the metrics the endpoint serves
    (``documented`` should be narrowed to that endpoint's prefix by the caller)."""
    out = [
        f"{name} is exposed but not documented" for name in sorted(set(exposed) - set(documented))
    ]
    out += [
        f"{name} is documented but not exposed" for name in sorted(set(documented) - set(exposed))
    ]
    for name in sorted(set(documented) & set(exposed)):
        doc, real = documented[name], exposed[name]
        if doc.type != real.type:
            out.append(f"{name}: documented as {doc.type}, exposed as {real.type}")
        if real.labels and doc.labels != real.labels:
            out.append(
                f"{name}: documented labels {sorted(doc.labels)}, exposed {sorted(real.labels)}"
            )
    return out
