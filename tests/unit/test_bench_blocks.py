"""The blocks README.md and docs/*.md quote their measured figures from (``bench.blocks``),
rendered from small records built here: each says what its record says, by the rule (no
ratio or verdict on fewer than three trials per contender, every trial's load), and
``bench.report --check`` fails while a block is not what the records render.
"""

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ lives beside torchkube/

from bench import blocks, report
from bench.common import Reference, Results, Target

PEERS = (
    "peer client limits: Kubeflow: training-operator v1.8.1, client limit 20 requests/s, "
    "bursts of 30 (no client-limit flags); Kubeflow, client 500/s: training-operator v1.9.3, "
    "client limit 500 requests/s, bursts of 1000 (--kube-api-qps=500 --kube-api-burst=1000)"
)
FIGURES = dict[str, tuple[str, list[float], list[float]]]


def record(name: str, figures: FIGURES, **parts: Any) -> dict[str, Any]:
    """A record as a benchmark writes it: ``figures`` maps a name to (unit, values, loads)."""
    results = Results(name, f"python -m bench.{name} --trials 3", config=parts.pop("config", {}))
    results.notes.append(PEERS)
    for figure_name, (unit, values, loads) in figures.items():
        figure = results.figure(figure_name, unit)
        for value, load in zip(values, loads, strict=True):
            figure.add(value, load)
    results.extra.update(parts.pop("extra", {}))
    for title, table in parts.pop("tables", {}).items():
        results.tables[title] = table
    return results.to_json()


def around(median: float, trials: int) -> list[float]:
    """``trials`` values one apart whose median is ``median``."""
    return [median + i - (trials - 1) / 2 for i in range(trials)]


def e2e(trials: int, peer_load: float = 1.0, limit: float | None = None) -> dict[str, Any]:
    figures: FIGURES = {}
    cases = {case: 10.0 * (i + 1) for i, case in enumerate(blocks.E2E_CASES)}
    if limit is not None:
        cases[blocks.E2E_LIMIT] = limit
    for case, total in cases.items():
        loads = [peer_load if case.startswith("plain") else 1.0] * trials
        for part, value in (("kill → next step", total), ("detection", 0.5)):
            figures[f"{case}: {part}"] = ("s", around(value, trials), loads)
        for part in ("re-rendezvous", "worker start"):
            figures[f"{case}: {part}"] = ("s", [1.0] * trials, loads)
    store = "plain torchrun, store's agent killed: trials where training went on"
    figures[store] = ("trials", [0.0], [1.0])
    return record("recovery_e2e", figures, config={"kill_step": 45})


def test_recovery_e2e_gives_no_ratio_on_two_trials_and_one_on_three() -> None:
    two = blocks.recovery_e2e({"recovery_e2e": e2e(2)})
    assert "| plain torchrun, its default settings | 40.0 s [39.5 s – 40.5 s] |" in two
    assert two.count("none: 2 and 2 trials") == 2 and "×" not in two
    assert "a worker SIGKILLed at step 45" in two and "0 of 1 trial" in two
    three = blocks.recovery_e2e({"recovery_e2e": e2e(3)})
    assert "| 4.00× |" in three and "| 5.00× |" in three, "theirs ÷ ours of the medians"


def test_contenders_under_different_load_are_said_so_beside_the_figure() -> None:
    shown = blocks.recovery_e2e({"recovery_e2e": e2e(3, peer_load=3.5)})
    differ = (
        "loads differ: killed, never back (1:2) at 1.0"
        " vs plain torchrun, default rendezvous settings (1:2) at 3.5"
    )
    assert f"4.00× ({differ})" in shown
    withheld = blocks.recovery_e2e({"recovery_e2e": e2e(2, peer_load=3.5)})
    assert f"none: 2 and 2 trials; {differ}" in withheld


def test_a_peer_is_named_by_its_release_and_its_client_limits() -> None:
    run = blocks.Run("x", record("x", {}))
    assert run.peer("Kubeflow") == "Kubeflow v1.8.1, default client limits"
    assert run.peer("Kubeflow, client 500/s") == "Kubeflow v1.9.3, client 500/s"


@pytest.mark.parametrize(
    ("pods", "median", "said"),
    [
        (512, 24.2, "mostly its client's throttle: ≥ 24.1 s of 24.2 s for 512 pod creates"),
        (64, 5.97, "its client's throttle: ≥ 1.70 s of 5.97 s for 64 pod creates"),
        (8, 0.9, ""),
    ],
)
def test_a_ratio_against_v181_says_how_much_of_it_is_the_throttle(
    pods: int, median: float, said: str
) -> None:
    """(requests − 30) ÷ 20: v1.8.1's client lets 30 requests through at once, then 20 a
    second, and has no flag to change that; 8 pods fit in the burst."""
    assert blocks.throttled({"median": median}, pods) == said


def single(trials: int) -> dict[str, Any]:
    figures: FIGURES = {}
    for condition in blocks.CONDITIONS:
        for n in blocks.SIZES:
            for name, scale in (
                ("torchkube", 1.0),
                ("Kubeflow", 2.0),
                ("Kubeflow, client 500/s", 1.5),
            ):
                for what in ("all Running", "all created"):
                    key = f"{n} workers, {condition}: apply → {what}, {name}"
                    values = around(scale * n / 64, trials)
                    figures[key] = ("s", values, [1.0] * trials)
    body = record("operator_scale_single", figures)
    for f in body["figures"]:
        if f["name"] in blocks_targets():
            f["target"], f["verdict"] = "≤ 5.00 s", "met"
    cpu = ["load", "workers", "job of", "cp", "kwok", "op", "other", "cores", "floor"]
    rows = [
        [c, "512", name, "12.0 s", "2.52 s", "2.30 s", "0.025 s", "1.47", "10.7 s"]
        for c in blocks.CONDITIONS
        for name in ("torchkube", "Kubeflow")
    ]
    body["tables"]["where the CPU went, apply → all Running: CPU seconds, medians"] = {
        "headers": cpu,
        "rows": rows,
    }
    return body


def blocks_targets() -> set[str]:
    return {
        "8 workers, idle: apply → all Running, torchkube",
        "512 workers, idle: apply → all created, torchkube",
        "512 workers, loaded: apply → all created, torchkube",
    }


def test_starting_jobs_gives_no_ratio_or_verdict_on_two_trials() -> None:
    shown = blocks.scale({"operator_scale_single": single(2)})
    assert (
        "| 512 | idle | Kubeflow v1.8.1, default client limits | 16.0 s [15.5 s – 16.5 s] | 2 |"
        in shown
    )
    assert "×" not in shown and "none: 2 and 2 trials" in shown
    assert "target ≤ 5.00 s: no verdict: 2 trials" in shown and ": met" not in shown
    assert "| 512 | 24.1 s | 49.7 s | 15.5 s, 16.5 s; 15.5 s, 16.5 s |" in shown
    three = blocks.scale({"operator_scale_single": single(3)})
    assert "2.00× (mostly its client's throttle: ≥ 24.1 s of 16.0 s" in three
    assert "target ≤ 5.00 s: met" in three


def test_a_ratio_to_the_limit_reads_as_a_sentence_with_its_note_after_it() -> None:
    figures: FIGURES = {}
    for condition in blocks.CONDITIONS:
        for n in blocks.SIZES:
            for name, scale, load in (
                ("torchkube", 2.0, 1.0),
                (blocks.LIMIT, 1.0, 3.0),
                ("Kubeflow", 4.0, 1.0),
                ("Kubeflow, client 500/s", 3.0, 1.0),
            ):
                for what in ("all Running", "all created"):
                    key = f"{n} workers, {condition}: apply → {what}, {name}"
                    figures[key] = ("s", [scale * k for k in (1, 2, 3)], [load] * 3)
            ratio = f"{n} workers, {condition}: torchkube ÷ {blocks.LIMIT}, all Running"
            figures[ratio] = ("x", [2.0], [1.0])
    body = record("operator_scale_single", figures)
    for f in body["figures"]:
        f["target"], f["verdict"] = "≤ 9.00", "met"
    cpu = ["load", "workers", "job of", "cp", "kwok", "op", "other", "cores", "floor"]
    body["tables"]["where the CPU went, apply → all Running: CPU seconds, medians"] = {
        "headers": cpu,
        "rows": [],
    }
    shown = blocks.scale({"operator_scale_single": body})
    differ = f"loads differ: {blocks.LIMIT} at 3.0 vs torchkube at 1.0"
    assert f"| torchkube is 2.00× it ({differ}) |" in shown, shown


def test_each_trial_of_a_single_job_shows_the_pod_watches_closed_in_it_and_whose() -> None:
    """A slow start-up trial is the one whose API server closed pod watches (the relists that
    follow): each contender's trials show their time beside how many, in the order they ran,
    and whose where the record names them; a record without the counts shows no column."""
    body = single(3)
    closed = {"torchkube": [0, 4, 3], "Kubeflow": [0, 0, 0], "Kubeflow, client 500/s": [1, 0, 0]}
    whose = {(1, "torchkube"): {"kube-scheduler": 3, "KWOK": 1}}
    body["extra"]["trials"] = [
        {
            "scenario": "single",
            "operator": name,
            "condition": condition,
            "workers": n,
            "closed_pod_watches": float(closed[name][k] if n == 512 else 0),
            **(
                {"closed_pod_watchers": whose.get((k, name), {})}
                if n == 512 and condition == "idle"
                else {}
            ),
        }
        for k in range(3)
        for condition in blocks.CONDITIONS
        for n in blocks.SIZES
        for name in closed
    ]
    for f in body["figures"]:  # trials in the order they ran, not sorted
        f["values"] = [f["values"][k] for k in (1, 2, 0)]
    shown = blocks.scale({"operator_scale_single": body})
    assert "| pod watches closed per trial |" in shown.splitlines()[2]
    (row,) = [r for r in shown.splitlines() if r.startswith("| 512 | idle | torchkube |")]
    assert "| 8.00 s: 0, 9.00 s: 4 (kube-scheduler 3, KWOK 1), 7.00 s: 3 |" in row, row
    (row,) = [r for r in shown.splitlines() if r.startswith("| 512 | loaded | torchkube |")]
    assert "| 8.00 s: 0, 9.00 s: 4, 7.00 s: 3 |" in row, row
    (row,) = [r for r in shown.splitlines() if r.startswith("| 512 | idle | Kubeflow v1.8.1")]
    assert "| none |" in row, row
    assert "pod watches closed" not in blocks.scale({"operator_scale_single": single(3)})


def test_where_the_time_goes_quotes_the_records_own_table() -> None:
    """The paragraph once pointed at a table whose numbers had changed under it."""
    shown = blocks.where_the_time_goes({"operator_scale_single": single(2)})
    assert "idle: the control plane 12.0 s, KWOK 2.52 s, the operator 2.30 s" in shown
    assert "everything but the operator needed 10.7 s" in shown and "medians of 2 trials" in shown


def test_fast_scheduler_floors_come_from_its_own_run() -> None:
    key = "512 workers, scheduler at 500 req/s, idle: apply → all {}, {}"
    figures: FIGURES = {
        key.format(what, name): ("s", values, [2.0, 3.0, 3.5])
        for name, values in (("torchkube", [12.3, 13.2, 11.4]), ("Kubeflow", [49.7, 24.2, 24.2]))
        for what in ("created", "bound", "Running")
    }
    table = (
        ["load", "workers", "job of", "cp", "kwok", "op", "other", "cores", "floor"],
        [["idle", "512", "torchkube", "16.6 s", "3.38 s", "2.83 s", "0.800 s", "1.91", "10.8 s"]],
    )
    body = record(
        "operator_scale_fast-scheduler",
        figures,
        tables={"where the CPU went, apply → all Running, scheduler at 500 req/s": table},
    )
    shown = blocks.fast_scheduler({"operator_scale_fast-scheduler": body})
    assert "÷ torchkube, all Running: 1.97× — mostly that client's throttle" in shown
    assert "its trials took 49.7 s, 24.2 s, 24.2 s" in shown
    assert "(512 − 30) ÷ 20 = 24.1 s" in shown and "(1,024 − 30) ÷ 20 = 49.7 s" in shown
    assert "the control plane 16.6 s" in shown and "needed 10.8 s" in shown
    assert "pod watches closed" not in shown
    closed = {"torchkube": [0, 4, 0], "Kubeflow": [0, 0, 0]}
    body["extra"]["trials"] = [
        {
            "scenario": "scheduler at 500 req/s",
            "operator": name,
            "condition": "idle",
            "workers": 512,
            "closed_pod_watches": float(closed[name][k]),
            "closed_pod_watchers": {"kube-scheduler": 4} if closed[name][k] else {},
        }
        for k in range(3)
        for name in closed
    ]
    rows = blocks.fast_scheduler({"operator_scale_fast-scheduler": body}).splitlines()
    assert rows[2].endswith("| load per trial | pod watches closed per trial |")
    assert rows[4].endswith("| 12.3 s: 0, 13.2 s: 4 (kube-scheduler 4), 11.4 s: 0 |"), rows[4]
    assert rows[5].endswith("| none |"), rows[5]


def test_the_fleet_on_one_trial_each_gives_no_ratio_and_says_the_loads_differ() -> None:
    figures: FIGURES = {}
    for name, load, scale in (("torchkube", 2.2, 1.0), ("Kubeflow", 4.7, 3.0)):
        head = f"64 jobs × 64 workers, {name}: "
        figures[head + "all Running"] = ("s", [139.5 * scale], [load])
        figures[head + "steady state, reconcile rate last third ÷ first third"] = (
            "x",
            [0.7],
            [load],
        )
    body = record("operator_scale_fleet", figures, config={"jobs": 64, "per_job": 64})
    shown = blocks.fleet({"operator_scale_fleet": body})
    assert "| all Running | 139.5 s | 418.5 s |" in shown and "1 trial per contender" in shown
    assert shown.count("0.70× (1 trial: no verdict)") == 2
    differ = "loads differ: torchkube at 2.2 vs Kubeflow at 4.7"
    assert f"÷ torchkube, all Running: none: 1 and 1 trials; {differ}" in shown


def test_the_fleet_on_three_rotated_trials_sets_torchkube_between_the_limit_and_the_peer() -> None:
    """Three trials per contender: torchkube ÷ the bare client and the peer ÷ torchkube, of
    the medians; the bare client has no operator rows, and the steady state's one trial per
    operator is shown without a verdict."""
    figures: FIGURES = {}
    peer = "Kubeflow, client 500/s"
    for name, running in (("torchkube", 120.0), (peer, 180.0), ("bare client", 100.0)):
        head = f"64 jobs × 64 workers, {name}: "
        figures[head + "all Running"] = ("s", [running - 5, running, running + 5], [1.0] * 3)
        if name != "bare client":
            figures[head + "operator CPU per pod"] = ("ms", [5.0, 6.0, 7.0], [1.0] * 3)
            figures[head + "steady state, reconcile rate last third ÷ first third"] = (
                "x",
                [0.9],
                [1.0],
            )
    body = record("operator_scale_fleet", figures, config={"jobs": 64, "per_job": 64})
    shown = blocks.fleet({"operator_scale_fleet": body})
    header = next(line for line in shown.splitlines() if line.startswith("|  |"))
    assert header.index("torchkube") < header.index("Kubeflow v1.9.3") < header.index("bare")
    assert "| operator CPU per pod | 6 ms [5 ms – 7 ms] | 6 ms [5 ms – 7 ms] |  |" in shown
    assert "3 trials per contender, in an order that rotates" in shown
    assert "torchkube ÷ the limit, all Running: 1.20×." in shown
    assert "Kubeflow v1.9.3, client 500/s ÷ torchkube, all Running: 1.50×." in shown
    assert "0.90× (1 trial: no verdict)" in shown


def test_the_fleets_trials_are_shown_in_the_order_they_ran_with_the_watches_closed() -> None:
    """Each contender's figures hold its trials in its own order; the table interleaves
    them as they ran, so a slow trial stands beside the watches its API server closed."""
    figures: FIGURES = {}
    runs = {"torchkube": [205.4, 109.4], "bare client": [95.8, 96.6]}
    for name, values in runs.items():
        head = f"64 jobs × 64 workers, {name}: "
        for what in ("all Running", "all pods Running"):
            figures[head + what] = ("s", values, [1.0, 2.0])
    order = [("torchkube", 337, 110.8), ("bare client", 18, 38.5)]
    order += [("bare client", 8, 36.2), ("torchkube", 4, 31.7)]
    trials = [
        {"operator": name, "load": 1.5, "closed_pod_watches": closed, "kwok_cpu_s": kwok}
        for name, closed, kwok in order
    ]
    trials[0]["closed_pod_watchers"] = {"KWOK": 300, "kube-scheduler": 37}
    extra = {"fleet_trials": trials}
    body = record("operator_scale_fleet", figures, config={"jobs": 64, "per_job": 64}, extra=extra)
    rows = blocks.fleet({"operator_scale_fleet": body}).splitlines()
    trial_rows = rows[rows.index("Trial by trial:") + 4 :]
    assert trial_rows[0] == (
        "| 1 | torchkube | 205.4 s | 337 watches (KWOK 300, kube-scheduler 37) | 110.8 s | 1.5 |"
    )
    assert trial_rows[3].startswith("| 4 | torchkube | 109.4 s | 4 watches | 31.7 s |")
    assert trial_rows[1].startswith("| 2 | bare client: the same pods, no operator (the limit) |")
    assert "| 96.6 s | 8 watches |" in trial_rows[2]
    older = record("operator_scale_fleet", figures, config={"jobs": 64, "per_job": 64})
    assert "Trial by trial" not in blocks.fleet({"operator_scale_fleet": older})


def test_the_fleets_warm_up_is_shown_before_its_trials_and_counted_in_no_figure() -> None:
    """The warm-up start shows what a cold API server does to the first start on it (the
    watches it closes), beside trials that met a warm one; no figure or ratio holds it."""
    figures: FIGURES = {}
    for name, values in {"torchkube": [110.0, 120.0], "bare client": [96.0, 98.0]}.items():
        for what in ("all Running", "all pods Running"):
            figures[f"64 jobs × 64 workers, {name}: {what}"] = ("s", values, [1.0, 2.0])
    order = [("torchkube", 4), ("bare client", 8), ("bare client", 9), ("torchkube", 5)]
    trials = [
        {"operator": name, "load": 1.0, "closed_pod_watches": closed, "kwok_cpu_s": 30.0}
        for name, closed in order
    ]
    warm_up = {
        "operator": "bare client",
        "load": 0.7,
        "closed_pod_watches": 301,
        "kwok_cpu_s": 95.0,
        "running_s": 171.2,
    }
    extra = {"fleet_trials": trials, "fleet_warm_up": warm_up}
    body = record("operator_scale_fleet", figures, config={"jobs": 64, "per_job": 64}, extra=extra)
    shown = blocks.fleet({"operator_scale_fleet": body})
    rows = shown.splitlines()
    trial_rows = rows[rows.index("Trial by trial:") + 4 :]
    assert trial_rows[0] == (
        "| warm-up, not counted | bare client: the same pods, no operator (the limit) "
        "| 171.2 s | 301 watches | 95.0 s | 0.7 |"
    )
    assert trial_rows[1].startswith("| 1 | torchkube | 110.0 s | 4 watches |")
    assert "after one warm-up start of every job by the bare client" in shown
    assert "171.2" not in shown.split("Trial by trial:")[0], "in no figure above the trials"


def queued_record(*extra: str) -> dict[str, Any]:
    """``extra``: contenders beside torchkube and both Kubeflow configurations."""
    figures: FIGURES = {}
    trials = []
    for n in blocks.SIZES:
        count = 2 if n == 512 else 3
        for name in ("torchkube", "Kubeflow", "Kubeflow, client 500/s", *extra):
            admitted = [0.1 + i / 100 for i in range(count)]
            if n == 512 and name == "Kubeflow, client 500/s":
                admitted[0] = 2.34
            running = [n / 16 + i for i in range(count)]
            key = f"{n} workers through Kueue: apply → {{}}, {name}"
            figures[key.format("Workload admitted")] = ("s", admitted, [9.0] * count)
            figures[key.format("all Running")] = ("s", running, [9.0] * count)
            trials += [
                {"operator": name, "workers": n, "admitted_s": a, "kueue_cpu_s": 0.8 + a / 10}
                for a in admitted
            ]
    return record("queued_start", figures, extra={"trials": trials})


def test_queued_names_the_slowest_admission_instead_of_a_range_that_missed_it() -> None:
    """ "admitted in 0.06–0.46 s for every contender" while one took 2.34 s."""
    shown = blocks.queued({"queued_start": queued_record()})
    assert "Admitted 0.100 s to 2.34 s after the apply over all 24 trials" in shown
    assert "(the slowest: Kubeflow v1.9.3, client 500/s, 512 workers)" in shown
    assert "| 8 | Kubeflow v1.8.1, default client limits |" in shown and "| 1.00× |" in shown
    rows_512 = [line for line in shown.splitlines() if line.startswith("| 512 | Kubeflow")]
    assert all(line.endswith("| none: 2 and 2 trials |") for line in rows_512)


def test_queued_sets_torchkube_beside_the_limit_through_the_same_kueue() -> None:
    """The bare client (a Workload, then its pods once admitted, no operator) is a row of its
    own whose ratio reads torchkube ÷ the limit, the other way round from a peer's."""
    shown = blocks.queued({"queued_start": queued_record("bare client")})
    (row,) = [line for line in shown.splitlines() if line.startswith("| 8 | bare client")]
    assert "the same pods, no operator (the limit)" in row
    assert row.endswith("| torchkube ÷ the limit: 1.00× |")


def real_record() -> dict[str, Any]:
    figures: FIGURES = {}
    for fault, parts in (
        ("worker pod deleted", ("training again",)),
        ("worker SIGSTOPped", ("training again", "pod ended (detection)", "Hang in the status")),
    ):
        for spare, value in (("no spare", 35.9), ("1 spare", 1.91)):
            for part in parts:
                figures[f"{fault}, {spare}: {part}"] = ("s", [value], [8.0])
    body = record("real_node_recovery", figures)
    spare = next(f for f in body["figures"] if f["name"].startswith("worker pod deleted, 1"))
    spare |= {"target": "≤ 10.0 s", "verdict": "met", "reference": "no spare 35.9 s"}
    spare |= {"reference_value": 35.9, "ratio": 18.8}
    return body


def test_hot_spares_on_one_trial_each_get_no_verdict() -> None:
    """The target was once "met" at 18.8× on one loaded trial each."""
    shown = blocks.real_nodes({"real_node_recovery": real_record()})
    assert "target ≤ 10.0 s: no verdict: 1 trial" in shown
    assert "at most half the time without one: no verdict: 1 and 1 trials" in shown
    assert "18.8" not in shown and ": met" not in shown
    assert "Without a spare ÷ with one: none: 1 and 1 trials" in blocks.spares(
        {"real_node_recovery": real_record()}
    )


def test_trainer_md_takes_the_gradient_sizes_from_the_memory_records_notes() -> None:
    """The sizes the memory difference is read against were typed beside the record."""
    now = "FSDP2, reduce-scatter every micro-step: peak RSS per rank"
    before = "FSDP2, gradient sync off until the last micro-step (before): peak RSS per rank"
    body = record(
        "trainer_memory",
        {now: ("MiB", around(900.0, 3), [1.0] * 3), before: ("MiB", around(923.0, 3), [1.0] * 3)},
    )
    body["notes"].append("a full fp32 gradient of this model is 41.3 MiB")
    shown = blocks.memory_noted({"trainer_memory": body})
    assert "23.0 MiB less per rank now (medians).\n\n- " in shown
    assert shown.endswith("- a full fp32 gradient of this model is 41.3 MiB\n")


def test_the_emergency_save_is_held_against_the_budget_the_code_gives_a_default_job() -> None:
    """torchrun's --shutdown-timeout as the worker pods get it (the grace period less the
    launcher's margin), and what the run's median and slowest sync save write in it."""
    figures: FIGURES = {
        "sync save: training blocked": ("s", around(2.5, 3), [1.0] * 3),
        "emergency save, nothing in flight": ("s", around(3.0, 3), [1.0] * 3),
        "emergency save, an async save of the step before in flight": ("s", [0.4] * 3, [1.0] * 3),
        "save throughput (sync)": ("MB/s", [400.0, 500.0, 600.0], [1.0] * 3),
    }
    shown = blocks.emergency_save({"checkpoint_cost": record("checkpoint_cost", figures)})
    assert "| emergency save, nothing in flight | 3.00 s [2.00 s – 4.00 s] | 3 |" in shown
    assert "training blocked" not in shown, "only the emergency rows and the throughput"
    budget = "`terminationGracePeriodSeconds` 120 s less 2 s for the launcher's report, 118 s"
    assert budget in shown
    assert "writes 59.0 GB (its median) or 47.2 GB (its slowest trial)" in shown


def test_report_splices_every_block_whose_records_are_there_and_check_guards_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "real_node_recovery.json").write_text(json.dumps(real_record()))
    docs = {name: tmp_path / f"{name}.md" for name in ("TARGET", "README", "OPERATOR", "QUEUEING")}
    docs["TARGET"].write_text(
        f"{report.BEGIN}\n{report.END}\n<!-- real-nodes:begin -->\nold\n<!-- real-nodes:end -->\n"
    )
    docs["OPERATOR"].write_text("a\n<!-- spares:begin -->\nold\n<!-- spares:end -->\nb\n")
    docs["README"].write_text("no block needs this one: its records are not there\n")
    for name, path in docs.items():
        monkeypatch.setattr(report, name, path)
    rendered = report.documents(results)
    assert set(rendered) == {docs["TARGET"], docs["OPERATOR"]}
    assert "| worker pod deleted | 1 spare | 1.91 s |" in rendered[docs["TARGET"]]
    assert rendered[docs["OPERATOR"]].startswith(
        "a\n<!-- spares:begin -->\n`real_node_recovery` at"
    )
    assert rendered[docs["OPERATOR"]].endswith("<!-- spares:end -->\nb\n")

    monkeypatch.setattr(report, "RESULTS_DIR", results)
    monkeypatch.setattr(report, "quickstart_picture", lambda: None)
    for path, text in rendered.items():
        path.write_text(text)
    edited = docs["OPERATOR"].read_text().replace("1.91 s", "1.5 s")
    docs["OPERATOR"].write_text(edited)
    with pytest.raises(SystemExit) as failed:
        report.main(["--check"])
    assert "OPERATOR.md" in str(failed.value) and "TARGET.md" not in str(failed.value)


def test_a_document_without_a_blocks_markers_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "real_node_recovery.json").write_text(json.dumps(real_record()))
    target = tmp_path / "benchmarks.md"
    target.write_text(f"{report.BEGIN}\n{report.END}\n")
    monkeypatch.setattr(report, "TARGET", target)
    monkeypatch.setattr(report, "OPERATOR", target)
    with pytest.raises(ValueError, match="real-nodes:begin"):
        report.documents(results)


def test_every_block_renders_from_the_committed_records() -> None:
    """What ``bench.report --check`` compares in CI: each block of each document, once."""
    names = [(block.document, block.name) for block in blocks.BLOCKS]
    assert len(names) == len(set(names))
    rendered = report.documents()
    for block in blocks.BLOCKS:
        for marker in block.markers:
            assert rendered[getattr(report, block.document)].count(marker) == 1, block.name


def test_records_keep_their_verdicts_the_rendering_withholds_them() -> None:
    """The record is what the run computed: a reference and a verdict stay in the JSON."""
    results = Results("demo", "python -m bench.demo --x")
    figure = results.figure("x", "s", target=Target(5.0), reference=Reference(9.0, "peer 9 s"))
    figure.add(1.0, 1.0)
    body = results.to_json()
    assert body["figures"][0]["verdict"] == "met" and body["figures"][0]["ratio"] == 9.0


def topology_record(trials: int) -> dict[str, Any]:
    """A topology_placement record: one size, the four ways, packed only when asked, and a
    fragmentation trial per way and what held the racks."""
    from bench import topology_placement as tp

    job = "4 workers, required rack"
    figures: FIGURES = {}
    placement = []
    for way in tp.WAYS:
        asks = way in (tp.WITHOUT, tp.KUEUE)
        seconds = 2.0 if asks else 1.0
        figures[f"{job}, {way}: apply → all Running"] = (
            "s",
            around(seconds, trials),
            [1.0] * trials,
        )
        figures[f"{job}, {way}: racks the workers ran in"] = (
            "",
            [1.0 if asks else 3.0] * trials,
            [1.0] * trials,
        )
        placement += [{"way": way, "size": job, "in_one_domain": asks}] * trials
    fragmentation = [
        {"way": tp.WITHOUT, "held_by": tp.JOB_HOLDS, "message": "1 of 4 workers cannot be "
         "scheduled ... free a node in b0-r0", "workers_running_while_waiting": 3,
         "freed_to_all_running_s": 0.5, "cap_s": 300},
        {"way": tp.KUEUE, "held_by": tp.POD_HOLDS, "message": "topology \"t\" allows to fit "
         "only 3 out of 4 pod(s)", "workers_running_while_waiting": 0,
         "freed_to_all_running_s": None, "cap_s": 90},
    ]  # fmt: skip
    extra = {
        "sizes": [{"job": job, "level": tp.RACK, "room": True}],
        "placement": placement,
        "fragmentation": fragmentation,
    }
    return record("topology_placement", figures, extra=extra)


def test_topology_counts_the_packed_trials_and_gives_no_ratio_on_two() -> None:
    two = blocks.topology({"topology_placement": topology_record(2)})
    assert "| 4 workers, required rack | without Kueue, topology | 2 of 2 |" in two
    assert "| 4 workers, required rack | Kueue, none | 0 of 2 | 3 [3 – 3] |" in two
    assert two.count("none: 2 and 2 trials") == 2 and "×" not in two
    assert "free a node in b0-r0”; 1 of 1 started within 300 s" in two
    assert "racks held by pods outside Kueue" in two and "0 of 1 started within 90 s" in two
    three = blocks.topology({"topology_placement": topology_record(3)})
    assert three.count("| 2.00× |") == 2, "asking ÷ the same path without, of the medians"


def recovery(limit: bool) -> dict[str, Any]:
    """An operator_recovery record of three trials a contender, with the limit or without."""
    figures: FIGURES = {}
    names = {"torchkube": 0.05, "Kubeflow": 0.04, **({"bare client": 0.02} if limit else {})}
    for fault in ("Failed", "force-deleted"):
        for what in ("replacement created", "replacement Running"):
            for name, median in names.items():
                values = [median * f for f in (0.9, 1.0, 1.1)]
                figures[f"worker {fault} → {what}, {name}"] = ("s", values, [1.0] * 3)
    node = "node loss: NotReady → all 5 workers Running on healthy nodes"
    for name in ("torchkube", *(["bare client"] if limit else [])):
        figures[f"{node}, {name}"] = ("s", [4.5, 4.7, 5.1], [1.0] * 3)
    healthy = "node loss: workers Running on healthy nodes 125 s after NotReady, Kubeflow"
    figures[healthy] = ("pods", [1.0, 1.0, 1.0], [1.0] * 3)
    body = record("operator_recovery", figures, config={"grace": 5})
    ours = next(f for f in body["figures"] if f["name"] == f"{node}, torchkube")
    ours |= {"target": "≤ grace + 5 s = 10 s", "verdict": "met"}
    return body


def test_recovery_puts_the_limit_beside_torchkube_when_recorded() -> None:
    with_limit = blocks.operator_recovery({"operator_recovery": recovery(limit=True)})
    assert "the limit (bare client)" in with_limit and "torchkube ÷ the limit" in with_limit
    row = next(
        line for line in with_limit.splitlines() if "worker Failed → replacement created" in line
    )
    assert "2.50×" in row, row  # torchkube 0.05 s ÷ the limit's 0.02 s
    assert "; the limit: " in with_limit
    without = blocks.operator_recovery({"operator_recovery": recovery(limit=False)})
    assert "the limit" not in without


def test_recovery_e2e_sets_the_limit_beside_torchkube_when_recorded() -> None:
    shown = blocks.recovery_e2e({"recovery_e2e": e2e(3, limit=2.0)})
    rows = [line for line in shown.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| torchkube: the worker never returns |"), rows
    assert rows[2].startswith(f"| {blocks.E2E_LIMIT_SAID} |"), rows
    assert rows[2].endswith("| torchkube ÷ it: 5.00× |"), "torchkube's 10 s ÷ the limit's 2 s"
    assert blocks.E2E_LIMIT_SAID not in blocks.recovery_e2e({"recovery_e2e": e2e(3)})


def spread3(median: float) -> list[float]:
    return [median / 2, median, median * 1.5]


def test_a_small_jobs_start_is_split_at_the_apply_and_the_first_worker_seen() -> None:
    """At 8 workers torchkube's gap to the limit is tens of milliseconds, and part of it is a
    request the limit never makes: the job's own create. The record splits each start at the
    apply's answer and at the first worker pod seen, and the block says both."""
    body = single(3)
    assert "first worker" not in blocks.scale({"operator_scale_single": body})
    figures: FIGURES = {}
    for name, apply, first in (("torchkube", 0.02, 0.07), ("Kubeflow", 0.03, 0.10)):
        for condition in blocks.CONDITIONS:
            head = f"8 workers, {condition}: "
            figures[f"{head}apply → answered, {name}"] = ("s", spread3(apply), [1.0] * 3)
            figures[f"{head}apply → first worker created, {name}"] = (
                "s",
                spread3(first),
                [1.0] * 3,
            )
    body["figures"] += record("operator_scale_single", figures)["figures"]
    shown = blocks.scale({"operator_scale_single": body})
    assert "8 workers, idle, before the pods:" in shown
    assert "| apply → answered | apply → first worker seen | trials |" in shown
    assert "| torchkube | 0.020 s [0.010 s – 0.030 s] | 0.070 s [0.035 s – 0.105 s] | 3 |" in shown
    one = {f["name"]: f for f in body["figures"]}
    del one["8 workers, idle: apply → answered, Kubeflow"]
    body["figures"] = list(one.values())
    partial = blocks.scale({"operator_scale_single": body})
    assert "| Kubeflow v1.8.1" not in partial.split("before the pods:")[1].split("\n\n")[1]


def api_record(trials: int) -> dict[str, Any]:
    writes = {
        blocks.STATUS_WRITE: 16.0,
        blocks.RULE_FREE: 8.0,
        blocks.MUTABLE: 10.0,
        blocks.POD_CREATE: 4.0,
    }
    return record(
        "operator_cost",
        {
            blocks.API_WRITE + what: ("ms", around(ms, trials), [1.0] * trials)
            for what, ms in writes.items()
        },
    )


def test_the_api_servers_cost_per_write_sets_a_status_write_beside_its_floor() -> None:
    rendered = blocks.api_writes({"operator_cost": api_record(3)})
    assert "| TrainingJob status merge patch | 16.0 ms [15.0 ms – 17.0 ms] | 3 |" in rendered
    assert "| worker pod create (no scheduler picks it up) | 4 ms [3 ms – 5 ms] |" in rendered
    assert (
        "A TrainingJob status write ÷ the same write without the CEL rules: 2.00×; ÷ the same "
        "write without the immutability rules: 1.60×; ÷ a worker pod's create: 4.00×."
    ) in rendered
    assert "without the CEL rules: none: 2 and 2 trials" in blocks.api_writes(
        {"operator_cost": api_record(2)}
    )
