"""The benchmarks' pure helpers: statistics, verdicts, tables, log parsing, metric deltas.

No benchmark runs here and nothing is timed: these check that the arithmetic which turns
trial values into published figures is right.
"""

import datetime as dt
import importlib
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ lives beside torchkube/

from bench import contenders, guard, kubeflow, operator_cost, report
from bench.common import (
    QUICK_RESULTS_DIR,
    RESULTS_DIR,
    ROOT,
    Figure,
    Reference,
    Results,
    Stats,
    Target,
    fmt,
    markdown_table,
    percentile,
    record_dir,
    record_dir_of,
)
from bench.kube import QUIET_MARGIN_CORES, idle_rate, metric_delta, parse_metrics, wait_quiet
from bench.plain_torchrun import PlainTorchrun
from bench.recovery_e2e import (
    LogLine,
    Split,
    back_at_step,
    job_manifest,
    line_time,
    split_handover,
    split_recovery,
)
from bench.trainer_throughput import throughput
from testbed.cluster import scheduler_configuration
from testbed.crds import CRD_MANIFEST
from torchkube.api import TrainingJob
from torchkube.api.worker_launch import TORCHRUN_MONITOR_INTERVAL
from torchkube.operator import informer


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5, 1, 4, 2, 3], [0.3, 0.1, 9.0, 2.5]])
@pytest.mark.parametrize("q", [0, 50, 95, 100])
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_stats_of_trials() -> None:
    stats = Stats.of([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (stats.n, stats.median, stats.min, stats.max) == (5, 3.0, 1.0, 5.0)
    assert stats.p95 == pytest.approx(4.8)


def test_verdict_is_judged_on_the_median_and_says_when_p95_misses() -> None:
    figure = Figure("created", "s", target=Target(5.0))
    assert figure.verdict() == "not measured"
    for value in (1.0, 2.0, 9.0):
        figure.add(value, load=1.0)
    assert figure.verdict() == "met (p95 missed)"
    figure.add(6.0, load=1.0)
    figure.add(7.0, load=1.0)
    assert figure.verdict() == "missed"
    higher = Figure("mfu", "%", values=[50.0, 60.0, 70.0], loads=[1, 1, 1])
    higher.target = Target(45.0, "min")
    assert higher.verdict() == "met"
    assert Target(45.0, "min").met(45.0) and not Target(45.0, "min").met(44.9)


def test_a_target_on_every_trial_misses_on_one() -> None:
    """Unrecoverable runs, one value a run: one failed run of three misses "0 in every run",
    where the median (0) would have met it."""
    failed = Figure("runs failed", "", values=[0, 0, 1], loads=[1, 1, 1])
    failed.target = Target(0, text="0 in every run", every=True)
    assert failed.verdict() == "missed"
    failed.values[2] = 0
    assert failed.verdict() == "met"


def test_reference_ratio_says_how_many_times_better() -> None:
    assert Reference(50.4, "Kubeflow").ratio(5.04) == pytest.approx(10.0)
    assert Reference(100.0, "bare", higher_is_better=True).ratio(97.0) == pytest.approx(0.97)
    assert Reference(1.0, "x").ratio(0.0) is None


def test_a_count_is_shown_whole_and_a_measure_with_its_digits() -> None:
    assert fmt(322.0, "watches") == "322 watches"
    assert fmt(1248.0, "steps") == "1,248 steps"
    assert fmt(12.5, "watches") == "12.5 watches"  # a median of two counts
    assert fmt(322.0, "ms") == "322.0 ms"
    assert fmt(1.0, "watches") == "1 watch" and fmt(1.0, "steps") == "1 step"


def test_markdown_table_escapes_pipes() -> None:
    table = markdown_table(["a", "b"], [["x|y", "z"]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | z |"]


def test_results_are_recorded_as_json_and_rendered_from_it_alone(tmp_path: Path) -> None:
    """The JSON is the only record; docs/benchmarks.md's tables are rendered from it
    (``bench.report``), not copied from a Markdown file beside it."""
    results = Results("demo", "python -m bench.demo")
    figure = results.figure(
        "apply → created", "s", target=Target(5.0), reference=Reference(50.4, "Kubeflow 50.4 s")
    )
    figure.add(4.0, load=2.0)
    figure.add(6.0, load=3.0)
    results.figure("never measured", "s", target=Target(1.0))
    results.tables["per trial"] = (["trial", "s"], [["1", "4.0"]])
    results.notes.append("a note")
    json_path = results.write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.json"]

    body = json.loads(json_path.read_text())
    (fig, _) = body["figures"]
    assert fig["values"] == [4.0, 6.0] and fig["load_average"] == [2.0, 3.0]
    assert fig["median"] == 5.0 and fig["verdict"] == "met (p95 missed)"
    assert fig["ratio"] == pytest.approx(10.08)
    rendered = report.render(tmp_path)
    assert (
        "| apply → created | 2 | 5.00 s | 5.90 s | 4.00 s – 6.00 s | 2.0, 3.0 | ≤ 5.00 s | "
        "no verdict: 2 trials | Kubeflow 50.4 s (no ratio: its trials are not in the record) |"
        in rendered
    ), "the record keeps its verdict and ratio; the rendering follows the rule (test_bench_rule)"
    assert "| never measured | 0 | not measured |  |  |  |  | not measured |  |" in rendered
    assert "#### demo" in rendered and "**per trial**" in rendered and "- a note" in rendered
    assert rendered.count("apply → created") == 2, "once in its table, once in the targets"
    assert results.markdown() in rendered.replace("#### demo", "### demo")


def test_report_splices_between_markers_only() -> None:
    doc = f"intro\n{report.BEGIN}\nold\n{report.END}\noutro\n"
    assert report.splice(doc, "new\n") == f"intro\n{report.BEGIN}\nnew\n{report.END}\noutro\n"
    with pytest.raises(ValueError):
        report.splice("no markers", "x")


def test_log_times_of_torch_and_python_lines() -> None:
    torch_line = "I1123 07:14:32.635000 17811 torch/distributed/elastic/agent/server/api.py:941] x"
    py_line = "2026-11-23 07:14:55,492 INFO torchkube: resumed from /c/step-40 (...) in 0.73s"
    assert line_time(torch_line, 2026) == dt.datetime(2026, 11, 23, 7, 14, 32, 635000).timestamp()
    assert line_time(py_line, 1999) == dt.datetime(2026, 11, 23, 7, 14, 55, 492000).timestamp()
    assert line_time("  continuation line", 2026) is None


def test_split_recovery_finds_each_milestone() -> None:
    t = dt.datetime(2026, 11, 23, 7, 0, 0).timestamp()
    lines = [
        LogLine(t - 1, "worker-0.log", "2026 INFO torchkube: step 44/100 | loss"),
        LogLine(t + 0.8, "worker-1.log", "I.. [default] Worker group FAILED. 3/3 attempts left"),
        LogLine(t + 9.0, "worker-0.log", "I.. [default] Rendezvous complete for workers. Result:"),
        LogLine(t + 11.0, "worker-1.log", "I.. [default] Rendezvous complete for workers. Result:"),
        LogLine(t + 16.0, "worker-1.log", "x INFO torchkube: resumed from /c/step-40 (w) in 0.50s"),
        LogLine(t + 16.2, "worker-1.log", "x WARNING torchkube [rank 1]: step 41/100 | not rank 0"),
        LogLine(t + 16.3, "worker-1.log", "x INFO torchkube: step 41/100 | loss 3.1"),
    ]
    split = split_recovery(lines, t)
    assert split.detection == pytest.approx(0.8)
    assert split.rendezvous == pytest.approx(10.2)  # the surviving agent's own round
    assert split.worker_start == pytest.approx(4.5)
    assert split.checkpoint_load == pytest.approx(0.5)
    assert split.first_step == pytest.approx(0.3)
    assert split.total == pytest.approx(16.3)
    assert (split.resumed_step, split.first_new_step) == (40, 41)


def test_split_recovery_names_the_missing_milestone() -> None:
    line = LogLine(1.0, "worker-1.log", "I.. [default] Worker group FAILED. 3/3 attempts left")
    with pytest.raises(ValueError, match="Rendezvous complete"):
        split_recovery([line], 0.0)


def test_throughput_counts_from_the_warmup_step() -> None:
    points = [(0, 90.0, 0.0), (5, 100.0, 10.0), (10, 101.0, 11.5), (15, 102.0, 13.0)]
    speed = throughput(points, warmup=5, tokens_per_step=100)
    assert speed.wall == pytest.approx(1000 / 2.0)
    assert speed.cpu == pytest.approx(1000 / 3.0)
    with pytest.raises(ValueError):
        throughput(points[:2], warmup=5, tokens_per_step=100)


def test_throughput_is_the_median_window() -> None:
    """A window in which another process took the cores does not move the figure."""
    points = [(5, 100.0, 10.0), (10, 101.0, 11.0), (15, 105.0, 12.0), (20, 106.0, 13.0)]
    assert throughput(points, warmup=5, tokens_per_step=100).wall == pytest.approx(500.0)


def test_api_requests_between_two_scrapes() -> None:
    before = parse_metrics(
        'torchkube_api_requests_total{verb="create",resource="pod"} 3.0\n'
        "torchkube_reconcile_duration_seconds_count 2.0\n"
    )
    after = parse_metrics(
        'torchkube_api_requests_total{verb="create",resource="pod"} 11.0\n'
        'torchkube_api_requests_total{verb="patch",resource="trainingjobs/status"} 2.0\n'
        "torchkube_reconcile_duration_seconds_count 6.0\n"
    )
    grown = metric_delta(before, after, "torchkube_api_requests_total")
    assert grown == {
        (("resource", "pod"), ("verb", "create")): 8.0,
        (("resource", "trainingjobs/status"), ("verb", "patch")): 2.0,
    }
    reconciles = metric_delta(before, after, "torchkube_reconcile_duration_seconds_count")
    assert sum(reconciles.values()) == 4


def test_peer_requests_are_client_go_requests_of_every_verb() -> None:
    text = (
        "# TYPE rest_client_requests_total counter\n"
        'rest_client_requests_total{code="200",host="h",method="GET"} 5\n'
        'rest_client_requests_total{code="201",host="h",method="POST"} 7\n'
        "workqueue_adds_total 3\n"
    )
    assert kubeflow.requests_total(text) == 12.0


def test_guard_allows_three_times_the_recorded_median_plus_slack(tmp_path: Path) -> None:
    figure = {"name": "8 workers, idle: apply → all Running, torchkube", "median": 0.25}
    (tmp_path / "operator_scale.json").write_text(json.dumps({"figures": [figure]}))
    recorded = guard.baseline("operator_scale", figure["name"], tmp_path)
    assert recorded == 0.25
    assert guard.Check("x", 1.75, recorded).passed
    assert not guard.Check("x", 1.76, recorded).passed
    assert "GROSS REGRESSION" in guard.report([guard.Check("x", 2.0, recorded)])
    with pytest.raises(guard.MissingBaseline, match=r"bench/run\.sh operator_scale"):
        guard.baseline("operator_scale", "another figure", tmp_path)
    with pytest.raises(guard.MissingBaseline, match="cannot read"):
        guard.baseline("recovery_e2e", figure["name"], tmp_path)


def test_guard_takes_the_latest_recording_including_one_scenario_runs(tmp_path: Path) -> None:
    name = "8 workers, idle: apply → all Running, torchkube"

    def record(stem: str, date: str, median: float) -> None:
        body = {"machine": {"date": date}, "figures": [{"name": name, "median": median}]}
        (tmp_path / f"{stem}.json").write_text(json.dumps(body))

    record("operator_scale", "2026-11-23 10:54 UTC", 0.5)
    record("operator_scale_single", "2026-11-24 09:00 UTC", 0.3)
    (tmp_path / "operator_scale_fleet.json").write_text(
        json.dumps({"machine": {"date": "2026-11-25 09:00 UTC"}, "figures": []})
    )
    assert guard.baseline("operator_scale", name, tmp_path) == 0.3
    record("operator_scale", "2026-11-26 09:00 UTC", 0.4)
    assert guard.baseline("operator_scale", name, tmp_path) == 0.4


def test_scheduler_configuration_raises_the_client_rate_only_when_asked() -> None:
    plain = json.loads(scheduler_configuration(Path("k.conf"), None))
    assert plain["clientConnection"] == {"kubeconfig": "k.conf"}
    assert plain["leaderElection"] == {"leaderElect": False}
    fast = json.loads(scheduler_configuration(Path("k.conf"), 500))
    assert fast["clientConnection"] == {"kubeconfig": "k.conf", "qps": 500, "burst": 1000}


def test_plain_torchrun_gets_torchkubes_settings_or_its_own_defaults(tmp_path: Path) -> None:
    job = TrainingJob.model_validate(job_manifest("gone", steps=50, interval=10))
    ours = PlainTorchrun(job, tmp_path, "torchkube").command(host=True)
    conf = next(a for a in ours if a.startswith("--rdzv-conf="))
    assert "last_call_timeout=5" in conf and "keep_alive_interval=2" in conf
    assert conf.endswith(",is_host=true")
    assert f"--monitor-interval={TORCHRUN_MONITOR_INTERVAL}" in ours
    defaults = PlainTorchrun(job, tmp_path, "defaults").command(host=False)
    assert "--rdzv-conf=is_host=false" in defaults
    assert not any(a.startswith("--monitor-interval") for a in defaults)
    assert "--nnodes=1:2" in defaults and defaults[-2:] == ["-m", "torchkube.trainer"]


def test_back_at_step_counts_only_steps_logged_once_the_kill_was_noticed() -> None:
    """Plain torchrun's survivor logged step 31 7 ms after the kill, before its agent noticed
    the failure: that is not training back (published as 0.007 s). Both contenders go through
    this one function."""
    lines = [
        LogLine(10.0, "worker-0.log", "x INFO torchkube: step 30/50 | loss"),
        LogLine(11.007, "worker-0.log", "x INFO torchkube: step 31/50 | loss"),
        LogLine(12.0, "worker-1.log", "x INFO torchkube [rank 1]: step 31/50 | loss"),
        LogLine(13.0, "worker-0.log", "x INFO torchkube: step 25/50 | loss"),
        LogLine(14.0, "worker-0.log", "x INFO torchkube: step 30/50 | loss"),
        LogLine(15.0, "worker-0.log", "x INFO torchkube: step 31/50 | loss"),
    ]
    noticed_after = Split(0.5, 1.0, 0.5, 0.1, 0.1, 20, 21)
    assert back_at_step(lines, 11.0, 30, noticed_after) == 4.0
    assert back_at_step(lines, 11.0, 31, noticed_after) is None
    assert back_at_step(lines, 16.0, 30, noticed_after) is None


def test_the_peers_pods_carry_what_a_torchkube_worker_of_the_same_job_does() -> None:
    """Same work for both operators: the trainer's environment and the checkpoint claim (the
    scheduler checks a pod's claim on every node), not a bare template."""
    from bench.kube import CLAIM, job_body
    from torchkube.operator.builders import worker_pod

    ours = worker_pod(TrainingJob.model_validate(job_body("j", 8)), 0, "abcde")["spec"]
    ours_env = {e["name"]: e.get("value") for e in ours["containers"][0]["env"]}
    peer = kubeflow.pytorchjob_body("j", 8)["spec"]["pytorchReplicaSpecs"]
    for replica in ("Master", "Worker"):
        spec = peer[replica]["template"]["spec"]
        container = spec["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        config = "TORCHKUBE_TRAINER_CONFIG"
        assert env[config] == ours_env[config] and env.items() <= ours_env.items() | {
            ("TORCHKUBE_JOB_NAMESPACE", "default")
        }
        assert spec["volumes"] == [
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": CLAIM}}
        ]
        assert container["volumeMounts"][0]["mountPath"] == "/checkpoints"
        assert spec["nodeSelector"] == ours["nodeSelector"]


def test_where_cpu_went_splits_the_cluster_from_the_operators_and_finds_the_floor() -> None:
    from bench.operator_scale import where_cpu_went

    used = {
        "kube-apiserver": 7.0,
        "etcd": 1.0,
        "kube-scheduler": 1.5,
        "kube-controller-manager": 0.5,
        "kwok": 3.0,
        "operator": 2.0,
        "peer": 1.0,
    }
    spent = where_cpu_went(used, seconds=16.0)
    assert spent["control_plane"] == pytest.approx(10.0)
    assert (spent["kwok"], spent["operator"], spent["peer"]) == (3.0, 2.0, 1.0)
    assert spent["cores"] == pytest.approx(1.0), "16 CPU-s in 16 s: one core"
    assert spent["floor"] == pytest.approx(14.0), "everything but the operator, at one core"
    assert where_cpu_went({}, seconds=0.0)["floor"] == 0.0


def test_live_recovery_break_even_weighs_torchfts_share_against_each_loss() -> None:
    """1 % of every step is 36 s of an hour; a loss costs restart 20 s and live 2 s, so each
    saves 18 s and live repays its hour above 36 / 18 = 2 losses per hour (the bench had it
    upside down: 0.50)."""
    from bench.live_recovery import break_even_per_hour, describe_break_even

    assert break_even_per_hour(0.01, 20.0, 2.0) == pytest.approx(2.0)
    assert "wins above 2.00 losses per hour (one every 30 min)" in describe_break_even(
        "restart", 0.01, 20.0, 2.0
    )
    assert "one every 20 s" in describe_break_even("restart", 0.1, 2.0, 0.0)  # 180 an hour
    assert break_even_per_hour(0.0, 20.0, 2.0) == 0.0
    assert break_even_per_hour(0.01, 2.0, 2.0) is None


def test_each_recovery_figure_is_timed_when_it_holds_not_after_the_others() -> None:
    """Training back at t=2 while the status shows the Hang only at t=5: 'training again' is 2
    (it was published as the status's time when it was polled only after the status)."""
    from bench.real_node_recovery import first_times

    now = [0.0]

    def at(t: float) -> Callable[[], bool]:
        return lambda: now[0] >= t

    def tick(seconds: float) -> None:
        now[0] += seconds

    times = first_times(
        {"again": at(2.0), "ended": at(1.5), "recorded": at(5.0)},
        timeout=60,
        interval=0.5,
        clock=lambda: now[0],
        sleep=tick,
    )
    assert times == {"ended": 1.5, "again": 2.0, "recorded": 5.0}
    with pytest.raises(TimeoutError, match="recorded"):
        now[0] = 0.0
        first_times({"recorded": at(99.0)}, timeout=3, clock=lambda: now[0], sleep=tick)


def test_the_quickstart_sample_is_what_a_terminal_shows() -> None:
    from bench.quickstart import as_shown

    raw = (
        "running quickstart: 2 workers\r\n\rstep 10/200 [#...]  5s\033[K\rstep 70/200 [##..]  9s"
        "\033[K\r\nchaos: SIGKILL worker 0 at step 70\r\n\rstep 200/200 [####]  14s\033[K\r\n"
        "\r\nquickstart: succeeded\r\n"
    )
    assert as_shown(raw) == (
        "running quickstart: 2 workers\nstep 70/200 [##..]  9s\n"
        "chaos: SIGKILL worker 0 at step 70\nstep 200/200 [####]  14s\n\nquickstart: succeeded\n"
    )


def test_the_readme_sample_is_spliced_from_the_recording() -> None:
    body = {
        "machine": {
            "date": "2026-11-26 08:40 UTC",
            "nproc": 2,
            "cpu": "AMD EPYC",
            "load_average_at_start": [3.5, 2.0, 1.0],
            "revision": "abc1234",
        },
        "extra": {"output": "quickstart: succeeded\n"},
    }
    readme = "a\n<!-- quickstart:begin -->\nold\n<!-- quickstart:end -->\nb\n"
    spliced = report.splice(readme, report.quickstart_sample(body), *report.SAMPLE)
    assert "```\nquickstart: succeeded\n```\n<!-- quickstart:end -->\nb\n" in spliced
    assert "2026-11-26 08:40 UTC: 2 cores (AMD EPYC), 1-minute load average 3.5" in spliced
    assert "old" not in spliced


def test_kubeflow_v181_runs_with_its_fixed_client_limits_and_the_raised_peer_with_flags() -> None:
    """v1.8.1 has no client-limit flag (controller-runtime's 20/s, bursts of 30): passing one
    would stop it at start. The raised configuration is a release that has the flags."""
    assert kubeflow.DEFAULT.version == kubeflow.RELEASE
    assert kubeflow.DEFAULT.flags == []
    assert (kubeflow.DEFAULT.client_qps, kubeflow.DEFAULT.client_burst) == (20, 30)
    assert kubeflow.RAISED.version != kubeflow.RELEASE
    assert kubeflow.RAISED.flags == ["--kube-api-qps=500", "--kube-api-burst=1000"]
    assert kubeflow.RAISED.name != kubeflow.DEFAULT.name == "Kubeflow"
    build = kubeflow.Build(Path("m"), Path("b"))
    assert build.binary == Path("b/training-operator.v1")
    assert build.binary_of(kubeflow.RAISED.version) == Path("b/training-operator.v1-v1.9.3")
    assert "500 requests/s" in kubeflow.RAISED.describe()


def test_a_queued_pytorchjob_carries_kueues_queue_label_and_an_unqueued_one_none() -> None:
    from torchkube.policy.queue import QUEUE_LABEL

    queued = kubeflow.pytorchjob_body("j", 8, queue="q")
    assert queued["apiVersion"] == "kubeflow.org/v1"
    assert queued["metadata"]["labels"] == {QUEUE_LABEL: "q"}
    assert "labels" not in kubeflow.pytorchjob_body("j", 8)["metadata"]


def test_side_by_side_shows_every_peer_and_its_ratio_of_medians() -> None:
    from bench.operator_scale import side_by_side

    ours, slow, fast = Figure("a", "s"), Figure("b", "s"), Figure("c", "s")
    for value in (1.0, 2.0, 3.0):
        ours.add(value, 0.0)
        slow.add(value * 10, 0.0)
        fast.add(value * 2, 0.0)
    row = side_by_side("idle", 512, ours, [slow, fast])
    assert row[:2] == ["idle", "512"]
    assert row[2:5] == [
        "2.00 s [1.00 s – 3.00 s]",
        "20.0 s [10.0 s – 30.0 s]",
        "4.00 s [2.00 s – 6.00 s]",
    ]
    assert row[5:] == ["10.00×", "2.00×"]
    assert side_by_side("idle", 8, ours, [Figure("d", "s")])[-1] == "–"


def test_the_bench_queue_covers_every_resource_the_pods_ask_for_on_the_gpu_nodes() -> None:
    from bench.queued_start import QUEUE, is_active, queue_objects

    (flavor_plural, flavor), (queue_plural, queue) = queue_objects("group", "scale", nodes=100)
    assert (flavor_plural, queue_plural) == ("resourceflavors", "clusterqueues")
    assert flavor["spec"]["nodeLabels"] == {"group": "scale"}
    [resources] = queue["spec"]["resourceGroups"]
    assert set(resources["coveredResources"]) == {"cpu", "memory", "nvidia.com/gpu"}
    [flavor_quota] = resources["flavors"]
    assert flavor_quota["name"] == flavor["metadata"]["name"] == QUEUE
    quota = {r["name"]: r["nominalQuota"] for r in flavor_quota["resources"]}
    assert quota["nvidia.com/gpu"] == "800"
    assert is_active({"status": {"conditions": [{"type": "Active", "status": "True"}]}})
    assert not is_active({"status": {"conditions": [{"type": "Active", "status": "False"}]}})
    assert not is_active({})


def test_workload_watch_times_only_workloads_made_after_it_started() -> None:
    """A Workload left from the namespace's previous trial (still being deleted) must not be
    taken for this trial's admission."""
    from bench.kube import WorkloadWatch

    def workload(uid: str, admitted: bool) -> dict[str, object]:
        status = "True" if admitted else "False"
        return {
            "metadata": {"uid": uid, "name": uid},
            "status": {"conditions": [{"type": "Admitted", "status": status}]},
        }

    watch = WorkloadWatch(api=None, namespace="ns")
    watch._handle("ADDED", workload("old", admitted=True))
    watch._started = True
    watch._handle("MODIFIED", workload("old", admitted=True))
    watch._handle("ADDED", workload("new", admitted=False))
    assert not watch.admitted
    watch._handle("MODIFIED", workload("new", admitted=True))
    assert list(watch.admitted) == ["new"]
    assert watch.wait_admitted(1.0, "job") == watch.admitted["new"]


def test_report_check_fails_while_a_rendered_block_or_the_picture_is_not_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bench.report --check`` writes nothing and fails, naming what is stale; after
    ``bench.report`` it passes, and a sample edited by hand fails it again."""
    from bench import quickstart
    from torchkube.local.plot import Run, StepLine

    results = tmp_path / "results"
    results.mkdir()
    Results("demo", "python -m bench.demo").write(results)
    recorded = Results("quickstart", quickstart.README_COMMAND)
    run = Run("quickstart", [StepLine(1.0, 10, 20, 3.0), StepLine(2.0, 20, 20, 2.5)])
    recorded.extra.update(output="quickstart: succeeded\n", run=run.to_wire())
    recorded.write(results)
    docs = {
        "TARGET": tmp_path / "benchmarks.md",
        "README": tmp_path / "README.md",
    }
    docs["TARGET"].write_text(f"a\n{report.BEGIN}\nold\n{report.END}\n")
    docs["README"].write_text("a\n<!-- quickstart:begin -->\nold\n<!-- quickstart:end -->\n")
    for name, path in docs.items():
        monkeypatch.setattr(report, name, path)
    monkeypatch.setattr(report, "RESULTS_DIR", results)
    monkeypatch.setattr(quickstart, "IMAGE", tmp_path / "quickstart.png")

    with pytest.raises(SystemExit) as failed:
        report.main(["--check"])
    for stale in ("benchmarks.md", "README.md", "quickstart.png"):
        assert stale in str(failed.value)
    assert not (tmp_path / "quickstart.png").exists() and "old" in docs["README"].read_text()

    report.main([])
    assert (tmp_path / "quickstart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report.main(["--check"])

    readme = docs["README"].read_text()
    docs["README"].write_text(readme.replace("succeeded", "succeeded, typed by hand"))
    with pytest.raises(SystemExit) as failed:
        report.main(["--check"])
    assert "README.md" in str(failed.value) and "benchmarks.md" not in str(failed.value)


def test_a_sustained_fault_is_classed_by_what_its_victim_had_done_since_it_last_started() -> None:
    from bench.live_sustained import (
        LIGHTHOUSE_FAULT,
        STARTING_FAULT,
        TRAINING_FAULT,
        classify,
    )
    from bench.timeline import Event

    events = [
        Event(10.0, "commit", 1, "worker-0.log"),
        Event(11.0, "commit", 1, "worker-1.log"),
        Event(30.0, "commit", 5, "worker-1.log"),
    ]
    assert classify(12.0, None, events, since=0.0) == LIGHTHOUSE_FAULT
    assert classify(12.0, "worker-0.log", events, since=0.0) == TRAINING_FAULT
    # worker 0 was lost at 12 s and started again: no commit of its own since then
    assert classify(20.0, "worker-0.log", events, since=12.0) == STARTING_FAULT
    assert classify(31.0, "worker-1.log", events, since=20.0) == TRAINING_FAULT
    assert classify(25.0, "worker-1.log", events, since=20.0) == STARTING_FAULT


def test_the_bare_client_creates_torchkubes_own_worker_pods_and_nothing_claims_them() -> None:
    """The limit contender's pods are the operator's pods for the same job (containers,
    resources, claim, scheduling), with no owner for the garbage collector to follow and no
    label the operator's pod watch selects."""
    from bench.contenders import BARE_LABEL, bare_pods
    from bench.kube import job_body
    from torchkube.api import labels as lbl
    from torchkube.operator.builders import worker_pod

    pods = bare_pods("ns", "j", 8, 1, "scale")
    job = TrainingJob.model_validate(
        job_body("j", 8)
        | {
            "metadata": {
                "name": "j",
                "namespace": "ns",
                "uid": "00000000-0000-0000-0000-000000000000",
            }
        }
    )
    assert len(pods) == 8 and len({p["metadata"]["name"] for p in pods}) == 8
    assert [p["spec"] for p in pods] == [worker_pod(job, i, "bare")["spec"] for i in range(8)]
    assert all(set(p["metadata"]) == {"name", "namespace", "labels"} for p in pods)
    assert all(lbl.JOB_NAME not in p["metadata"]["labels"] for p in pods)
    assert {p["metadata"]["labels"][BARE_LABEL] for p in pods} == {"j"}


def test_the_bare_clients_workload_asks_for_its_workers_alone_and_has_no_owner() -> None:
    """Through Kueue the limit makes what torchkube makes for the same job, less the store it
    does not create: the workers' pod set, in the queue, owned by nothing (Kueue lifts the
    finalizer of such a Workload itself when it is deleted)."""
    from bench.contenders import bare_workload
    from torchkube.operator import workloads

    made = bare_workload("ns", "j", 64, 1, "scale", "bench")
    assert made["kind"] == "Workload" and made["metadata"] == {"name": "bare-j", "namespace": "ns"}
    assert made["spec"]["queueName"] == "bench"
    (pod_set,) = made["spec"]["podSets"]
    assert pod_set["name"] == workloads.WORKERS and pod_set["count"] == 64
    container = pod_set["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_contenders_take_turns_going_first() -> None:
    from bench.common import rotated

    order = [rotated(["torchkube", "bare client", "Kubeflow"], trial) for trial in range(3)]
    assert [o[0] for o in order] == ["torchkube", "bare client", "Kubeflow"]
    assert all(sorted(o) == sorted(order[0]) for o in order)


def test_a_queued_trial_starts_only_once_no_workload_holds_the_quota() -> None:
    from bench.queued_start import quota_free

    assert quota_free({"status": {"reservingWorkloads": 0, "admittedWorkloads": 0}})
    assert quota_free({})
    assert not quota_free({"status": {"reservingWorkloads": 1, "admittedWorkloads": 1}})
    assert not quota_free({"status": {"pendingWorkloads": 1}})


def test_split_handover_times_the_limit_from_the_harness_and_the_standby() -> None:
    t = dt.datetime(2026, 11, 23, 7, 0, 0).timestamp()
    lines = [
        LogLine(t - 1, "worker-0.log", "x INFO torchkube: step 45/100 | loss"),
        LogLine(t + 0.4, "worker-1.log", "x INFO torchkube: resumed from /c/step-1 (w) in 9.0s"),
        LogLine(t + 1.5, "standby.log", "x INFO torchkube: resumed from /c/step-40 (w) in 0.25s"),
        LogLine(t + 1.6, "standby.log", "x INFO torchkube: step 41/100 | loss 3.1"),
    ]
    split = split_handover(lines, t, noticed_at=t + 0.3, handed_at=t + 0.31)
    assert split.detection == pytest.approx(0.3)
    assert split.rendezvous == pytest.approx(0.01)  # the hand-over
    assert split.worker_start == pytest.approx(1.25 - 0.31)
    assert split.checkpoint_load == pytest.approx(0.25)
    assert split.first_step == pytest.approx(0.1)
    assert split.total == pytest.approx(1.6)
    assert (split.resumed_step, split.first_new_step) == (40, 41)
    with pytest.raises(ValueError, match="standby"):
        split_handover(lines[:2], t, noticed_at=t + 0.3, handed_at=t + 0.31)


def test_a_focused_sustained_run_keeps_its_undisturbed_reference() -> None:
    from bench.live_sustained import WAYS, chosen

    assert [way.key for way in chosen(["1.4"])] == ["undisturbed", "1.4"]
    assert chosen(None) == WAYS


class BusyCluster:
    """A fake clock and a cluster whose processes use ``rates[i]`` cores in the i-th second
    (the last rate on); a wait that never ends fails instead of hanging the suite."""

    def __init__(self, rates: list[float]) -> None:
        self.rates, self.now, self.used = rates, 0.0, 0.0

    def sleep(self, seconds: float) -> None:
        assert self.now < 1000, "waited for ever"
        second = min(int(self.now), len(self.rates) - 1)
        self.used += self.rates[second] * seconds
        self.now += seconds

    def cpu_seconds(self) -> float:
        return self.used

    def clock(self) -> float:
        return self.now


def test_a_trial_starts_once_the_last_teardown_has_quieted_down() -> None:
    cluster = BusyCluster([2.5, 1.4, 0.9, 0.3, 0.3])
    waited = wait_quiet(
        cluster.cpu_seconds, cores=0.5, window=1.0, clock=cluster.clock, sleep=cluster.sleep
    )
    assert waited == 4.0  # three busy seconds, then the first quiet one


def test_a_cluster_that_never_quiets_is_started_on_at_the_limit() -> None:
    cluster = BusyCluster([3.0])
    waited = wait_quiet(
        cluster.cpu_seconds,
        cores=0.5,
        window=1.0,
        limit=5.0,
        clock=cluster.clock,
        sleep=cluster.sleep,
    )
    assert waited == 5.0


def test_the_idle_rate_leaves_out_the_stacks_own_start() -> None:
    cluster = BusyCluster([1.8, 0.9, 0.7, 0.72, 0.69])
    rate = idle_rate(cluster.cpu_seconds, windows=5, clock=cluster.clock, sleep=cluster.sleep)
    assert rate == pytest.approx(0.69)


def test_quiet_counts_every_contenders_operator_above_the_clusters_idle_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: dict[str, float] = {}

    def wait(cpu_seconds: Callable[[], float], cores: float) -> float:
        asked.update(used=cpu_seconds(), cores=cores)
        return 0.0

    monkeypatch.setattr(contenders, "wait_quiet", wait)

    class Bench:
        idle_cores = 0.7

        def component_cpu_seconds(self) -> dict[str, float]:
            return {"kube-apiserver": 10.0, "kwok": 2.0}

    class Operator:
        def __init__(self, used: float) -> None:
            self.used = used

        def cpu_seconds(self) -> float:
            return self.used

    players = [Operator(3.0), Operator(0.5)]
    contenders.quiet(Bench(), players)  # type: ignore[arg-type]
    assert asked == {"used": 15.5, "cores": pytest.approx(0.7 + QUIET_MARGIN_CORES)}


def test_a_stopped_benchmark_stops_the_operator_it_restarted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import bench.kube as kube

    class FakeCluster:
        def __init__(self, config: object) -> None:
            self.stopped = False

        def start(self) -> None: ...

        def stop(self) -> None:
            self.stopped = True

        def mark_failed(self) -> None: ...

        def api_client(self) -> None:
            return None

    class FakeOperator:
        def __init__(self) -> None:
            self.stopped = False

        def stop(self) -> None:
            self.stopped = True

    started: list[FakeOperator] = []

    def start_operator(cluster: object, **env: str) -> FakeOperator:
        started.append(FakeOperator())
        return started[-1]

    monkeypatch.setattr(kube, "Cluster", FakeCluster)
    monkeypatch.setattr(kube, "install_crd", lambda api: None)
    monkeypatch.setattr(kube, "start_operator", start_operator)
    monkeypatch.setattr(kube, "widen_pod_cidr", lambda: None)
    monkeypatch.setattr(kube.signal, "signal", lambda *args: None)  # keep pytest's handler
    monkeypatch.setattr(kube.Stack, "measure_idle", lambda self: None)
    with pytest.raises(SystemExit), kube.stack([], tmp_path) as bench:
        bench.operator = start_operator(bench.cluster)  # what restart_operator leaves
        raise SystemExit(143)  # SIGTERM, as _exit_on_sigterm raises it
    assert started[-1].stopped


def test_the_bench_reads_the_operators_request_counter_alone(tmp_path: Path) -> None:
    """settle() polls the request counter twice a second while the operator's CPU is
    counted: each poll asks the operator's real exposition (prometheus_client's server, as
    the operator runs it) for that counter only, not for every family formatted."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

    from testbed.operator import OperatorProcess

    registry = CollectorRegistry()
    requests = Counter("torchkube_api_requests", "", ["verb"], registry=registry)
    requests.labels("create").inc(3)
    requests.labels("patch").inc(2)
    wide = Gauge("torchkube_job_series", "", ["job"], registry=registry)
    for job in range(100):
        wide.labels(str(job)).set(job)
    process = OperatorProcess(tmp_path / "kubeconfig", tmp_path / "operator.log")
    server, thread = start_http_server(0, "127.0.0.1", registry)
    process.metrics_port = server.server_port

    class Stack:
        def metrics(self, names: Sequence[str] = ()) -> dict:
            self.text = process.metrics(names)
            return parse_metrics(self.text)

    try:
        stack = Stack()
        assert contenders.Torchkube(stack).requests() == 5.0  # type: ignore[arg-type]
        assert "torchkube_job_series" not in stack.text
        assert "torchkube_job_series" in process.metrics()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_watch_replay_hands_the_informer_every_event_as_the_api_server_frames_them() -> None:
    """operator_cost times the informer on a replayed watch: each event one chunk, as the API
    server streams a watch; a framing error would time a stream the informer never sees."""
    pods = [
        {"metadata": {"name": f"w-{i}", "namespace": "ns", "resourceVersion": str(i + 1)}}
        for i in range(3)
    ]
    events = [json.dumps({"type": "MODIFIED", "object": pod}).encode() + b"\n" for pod in pods]
    seen: list[Any] = []
    position = informer.Position("0")
    response = operator_cost.replayed(events)
    lines = informer.stream_lines(response.stream(amt=None, decode_content=False))
    informer.follow(lines, position, seen.append)
    assert [change.pod["metadata"]["name"] for change in seen] == ["w-0", "w-1", "w-2"]
    assert position.version == "3"


def test_a_quick_run_writes_its_record_where_the_docs_are_not_rendered_from() -> None:
    """A smoke run (``--quick``: one trial of each) replaced the record of the same name, and
    ``bench.report`` then rendered one trial into the docs; its record goes to a folder git
    ignores and the report does not read."""
    quick = record_dir(quick=True)
    assert record_dir(quick=False) == RESULTS_DIR
    assert quick != RESULTS_DIR and quick.parent == RESULTS_DIR, "report reads *.json only"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(quick / "recovery_e2e.json")], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0, f"{quick} must be ignored by git"


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("operator_scale", ["--only", "single", "--sizes", "8"]),
        ("operator_scale", ["--only", "single", "--no-peers"]),
        ("operator_scale", ["--only", "single", "--conditions", "idle"]),
        ("queued_start", ["--sizes", "8,64"]),
        ("queued_start", ["--no-limit"]),
        ("recovery_e2e", ["--cases", "gone"]),
        ("operator_recovery", ["--no-peers"]),
    ],
)
def test_a_run_that_leaves_part_of_its_scope_out_does_not_replace_the_record(
    module: str, argv: list[str]
) -> None:
    """A run of fewer sizes, cases or contenders than its record holds wrote over the record
    (and ``bench.report`` then failed on the missing figures, the record restored by hand):
    such a run's record goes where a quick one's does."""
    parsed = importlib.import_module(f"bench.{module}").parse_args
    assert record_dir_of(parsed(argv)) == QUICK_RESULTS_DIR
    assert record_dir_of(parsed([*argv[:2]] if module == "operator_scale" else [])) == (RESULTS_DIR)


def test_the_crd_copies_keep_only_the_rules_they_are_measured_without() -> None:
    """operator_cost's floor of a TrainingJob write: a copy of the CRD with no CEL rule, and
    one with every rule but the immutability rules."""
    crd = yaml.safe_load(CRD_MANIFEST.read_text())

    def rules(node: Any) -> list[dict[str, str]]:
        if isinstance(node, dict):
            own = list(node.get("x-kubernetes-validations", []))
            return own + [r for value in node.values() for r in rules(value)]
        if isinstance(node, list):
            return [r for value in node for r in rules(value)]
        return []

    every = rules(crd)
    fixed = [rule for rule in every if operator_cost.immutability(rule)]
    assert fixed and len(fixed) < len(every)
    assert {"self == oldSelf", "has(self.managedBy) == has(oldSelf.managedBy)"} <= {
        rule["rule"] for rule in fixed
    }
    assert (
        rules(operator_cost.with_rules(crd, operator_cost.COPIES[operator_cost.NO_RULES_GROUP]))
        == []
    )
    mutable = operator_cost.with_rules(crd, operator_cost.COPIES[operator_cost.MUTABLE_GROUP])
    assert rules(mutable) == [rule for rule in every if rule not in fixed]
    assert "x-kubernetes-validations" not in json.dumps(
        operator_cost.with_rules(crd, lambda rule: False)
    )
