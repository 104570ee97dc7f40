"""The Grafana dashboards and docs/metrics.md, without a Prometheus (that is
tests/integration/test_observability.py): structure, the chart's copies, names."""

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest

from testbed import dashboards as d
from torchkube.operator import goodput, metrics
from torchkube.trainer.metrics import TrainMetrics

ROOT = Path(__file__).resolve().parents[2]
CHART_DASHBOARDS = ROOT / "charts" / "torchkube" / "dashboards"
NAMES = ("fleet.json", "job.json")


def test_the_chart_ships_identical_copies_of_the_dashboards() -> None:
    ours = sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))
    chart = sorted(p.name for p in CHART_DASHBOARDS.glob("*.json"))
    assert ours == chart == sorted(NAMES), "run hack/render-manifests.sh to copy them"
    for name in NAMES:
        assert (ROOT / "dashboards" / name).read_bytes() == (
            CHART_DASHBOARDS / name
        ).read_bytes(), (
            f"charts/torchkube/dashboards/{name} differs from dashboards/{name}: "
            "run hack/render-manifests.sh"
        )


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_has_the_structure_grafana_expects(name: str) -> None:
    dashboard = d.load_all()[name]
    assert dashboard["schemaVersion"] == 39
    assert d.problems(dashboard) == []
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "namespace", "job"]


def test_problems_are_found() -> None:
    """The checker itself: a broken dashboard is reported, not waved through."""
    broken = d.load_all()["job.json"]
    broken["schemaVersion"] = 20
    panel = broken["panels"][1]
    panel["gridPos"] = {"h": 4, "w": 30, "x": 0, "y": 0}
    panel["targets"][0]["expr"] = "up{job=$nope}"
    broken["annotations"]["list"] = broken["annotations"]["list"][1:]
    found = "\n".join(d.problems(broken))
    for expected in ("schemaVersion", "wider than", "overlaps", "$nope", "built-in"):
        assert expected in found


def test_every_metric_the_dashboards_use_is_documented() -> None:
    documented = d.documented_metrics()
    for name, dashboard in d.load_all().items():
        for query in d.queries(dashboard):
            for metric in re.findall(r"\b(torchkube_\w+)", query.expr):
                base = re.sub(r"_(bucket|sum|count)$", "", metric)
                info = documented.get(metric) or documented.get(base)
                assert info is not None, f"{name} {query.where}: {metric} is not in docs/metrics.md"
                if base != metric:
                    assert info.type == "histogram", f"{metric}: {base} is not a histogram"


def test_docs_list_exactly_the_operators_metrics() -> None:
    metrics.job_seen("docs-ns", "docs-job")
    state = goodput.start(datetime(2026, 1, 1, tzinfo=UTC))
    metrics.GOODPUT.set("docs-ns", "docs-job", state)
    try:
        exposed = d.exposed_metrics(generate_latest(REGISTRY).decode())
    finally:
        metrics.job_gone("docs-ns", "docs-job")
    documented = {
        name: info
        for name, info in d.documented_metrics().items()
        if not name.startswith("torchkube_train_")
    }
    assert d.compare_metrics(documented, exposed) == []


def test_docs_list_exactly_the_trainers_metrics() -> None:
    exposed = d.exposed_metrics(generate_latest(TrainMetrics("docs", 0).registry).decode())
    documented = {
        name: info
        for name, info in d.documented_metrics().items()
        if name.startswith("torchkube_train_")
    }
    assert d.compare_metrics(documented, exposed) == []


def test_job_dashboard_shows_the_device_mesh() -> None:
    """Data × tensor ranks, now (a stat) and across resizes (a time series)."""
    job = d.load_all()["job.json"]
    mesh = {"torchkube_train_data_parallel_size", "torchkube_train_tensor_parallel_size"}
    showing = {}
    for panel in job["panels"]:
        exprs = " ".join(t.get("expr", "") for t in panel.get("targets", []))
        if all(name in exprs for name in mesh):
            showing[panel["type"]] = panel["title"]
    assert set(showing) == {"stat", "timeseries"}, showing


def test_job_dashboard_shows_the_time_left() -> None:
    """The operator's estimate, in the overview row beside the step, as a duration."""
    job = d.load_all()["job.json"]
    shown = [
        panel
        for panel in d.panels(job)
        if any(
            "torchkube_job_estimated_remaining_seconds" in t.get("expr", "")
            for t in panel.get("targets", [])
        )
    ]
    assert [panel["type"] for panel in shown] == ["stat"], shown
    assert shown[0]["fieldConfig"]["defaults"]["unit"] == "dtdurations"
    step = next(panel for panel in job["panels"] if panel.get("title") == "Step")
    assert shown[0]["gridPos"]["y"] == step["gridPos"]["y"]


def test_job_dashboard_shows_the_topology_domains() -> None:
    """How many domains the workers occupy (orange from two: spread) and which, by level."""
    job = d.load_all()["job.json"]
    by_metric = {
        name: panel
        for panel in d.panels(job)
        for name in ("torchkube_job_topology_domains", "torchkube_job_topology_domain_info")
        if any(f"{name}{{" in t.get("expr", "") for t in panel.get("targets", []))
    }
    count = by_metric["torchkube_job_topology_domains"]
    assert count["type"] == "stat"
    steps = count["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [(s["color"], s["value"]) for s in steps] == [("green", None), ("orange", 2)]
    listed = by_metric["torchkube_job_topology_domain_info"]
    assert listed["type"] == "table"
    assert "by (level, domain)" in listed["targets"][0]["expr"]
