"""The rule every rendered figure follows (``bench.common``): no ratio and no verdict on fewer
than three trials per contender, a verdict on the median beside its range, every trial's load
shown, and contenders whose loads differ said so; a record's header carries the arguments its
run used.

Small records built here, nothing measured.
"""

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ lives beside torchkube/

from bench.common import (
    MIN_TRIALS,
    Figure,
    Reference,
    Results,
    Target,
    arguments,
    cells_of_table,
    distinct_names,
    figure_rows,
    loads_differ,
    markdown_of,
    spread,
)


def record(
    ours: list[float],
    theirs: list[float],
    loads: tuple[float, float] = (1.0, 1.0),
    command: str = "python -m bench.demo --trials 3",
) -> dict[str, Any]:
    """A two-contender record as a benchmark writes it: our figure with a target and the
    peer's same-run median as its reference, the peer's figure, and the ratio of medians."""
    results = Results("demo", command, config={"trials": len(ours)})
    mine = results.figure("apply → Running, torchkube", "s", target=Target(5.0))
    peer = results.figure("apply → Running, Kubeflow", "s")
    for value in ours:
        mine.add(value, load=loads[0])
    for value in theirs:
        peer.add(value, load=loads[1])
    assert mine.stats and peer.stats
    mine.reference = Reference(peer.stats.median, f"Kubeflow, same run: {peer.stats.median} s")
    ratio = results.figure("Kubeflow ÷ torchkube, Running", "x", target=Target(2.0, "min"))
    ratio.add(peer.stats.median / mine.stats.median, load=loads[0])
    results.tables["side by side"] = (
        ["torchkube", "Kubeflow", "Kubeflow ÷ torchkube"],
        [[spread(mine), spread(peer), f"{peer.stats.median / mine.stats.median:.2f}×"]],
    )
    return results.to_json()


def rows(body: dict[str, Any]) -> dict[str, list[str]]:
    return {row[0]: row for row in figure_rows(body["figures"], body["machine"]["nproc"])}


def test_three_trials_each_give_the_verdict_and_the_ratio() -> None:
    body = record([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    ours = rows(body)["apply → Running, torchkube"]
    assert ours[7] == "met"
    assert ours[8] == "Kubeflow, same run: 5.0 s (ratio 2.50)"
    ratio = rows(body)["Kubeflow ÷ torchkube, Running (a ratio of medians)"]
    assert ratio[1:3] == ["3, 3", "2.50×"] and ratio[7] == "met"


def test_fewer_than_three_trials_give_neither_verdict_nor_ratio() -> None:
    """With two trials the median is their mean: one outlier decides it."""
    assert MIN_TRIALS == 3
    body = record([1.0, 2.0], [4.0, 50.0])
    ours = rows(body)["apply → Running, torchkube"]
    assert ours[2] == "1.50 s", "the median itself is shown"
    assert ours[7] == "no verdict: 2 trials"
    assert ours[8] == "Kubeflow, same run: 27.0 s (no ratio: 2 and 2 trials)"
    ratio = rows(body)["Kubeflow ÷ torchkube, Running (a ratio of medians)"]
    assert ratio[2] == "no ratio: 2 and 2 trials" and ratio[7] == "no verdict: 2 and 2 trials"
    assert "18.00" not in "".join(ratio)


def test_one_contender_short_of_trials_withholds_the_ratio() -> None:
    body = record([1.0, 2.0, 3.0], [4.0])
    assert rows(body)["apply → Running, torchkube"][7] == "met", "its own verdict stands"
    assert "(no ratio: 3 and 1 trials)" in rows(body)["apply → Running, torchkube"][8]


def test_a_reference_whose_trials_are_not_in_the_record_gives_no_ratio() -> None:
    results = Results("demo", "python -m bench.demo --x")
    mine = results.figure("created", "s", reference=Reference(50.4, "Kubeflow 50.4 s"))
    for value in (4.0, 5.0, 6.0):
        mine.add(value, load=1.0)
    (row,) = figure_rows(results.to_json()["figures"])
    assert row[8] == "Kubeflow 50.4 s (no ratio: its trials are not in the record)"


def test_every_trials_load_is_shown_and_differing_loads_are_said() -> None:
    body = record([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], loads=(1.5, 3.0))
    ours = rows(body)["apply → Running, torchkube"]
    assert ours[5] == "1.5, 1.5, 1.5"
    differ = "loads differ: torchkube at 1.5 vs Kubeflow at 3.0"
    assert ours[8] == f"Kubeflow, same run: 5.0 s (ratio 2.50; {differ})"
    assert differ in rows(body)["Kubeflow ÷ torchkube, Running (a ratio of medians)"][5]
    close = record([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], loads=(1.5, 2.5))
    assert "differ" not in rows(close)["apply → Running, torchkube"][8], "within 1.0 on 2 cores"
    assert loads_differ(body["figures"][:2], cores=4) == "", "the margin grows with the cores"


def test_more_than_six_trials_show_the_load_range() -> None:
    figure = Figure("x", "s")
    for i in range(7):
        figure.add(1.0, load=float(i))
    (row,) = figure_rows([figure.to_json()])
    assert row[5] == "0.0–6.0"


def test_a_single_trial_ratio_or_overhead_is_not_shown() -> None:
    """A per-pair ratio and an overhead against a reference are comparisons too."""
    results = Results("demo", "python -m bench.demo --x")
    results.figure("trainer ÷ plain loop (CPU time)", "x", values=[1.19], loads=[0.7])
    results.figure("trainer overhead (wall time)", "%", target=Target(3.0)).add(-20.3, 0.7)
    results.figure("trainer MFU", "%").add(40.4, 0.7)
    cpu, overhead, mfu = figure_rows(results.to_json()["figures"])
    assert cpu[2] == "no ratio: 1 trial" and "1.19" not in "".join(cpu)
    assert overhead[2] == "no ratio: 1 trial" and overhead[7] == "no verdict: 1 trial"
    assert mfu[2] == "40.4 %", "a figure of its own is shown"


def test_a_recorded_tables_ratio_cells_follow_the_rule() -> None:
    two = record([1.0, 2.0], [4.0, 50.0])
    (row,) = cells_of_table(*two["tables"]["side by side"].values(), two["figures"])
    assert (
        row[2] == "none: 2 trials each" and row[:2] == two["tables"]["side by side"]["rows"][0][:2]
    )
    three = record([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    (row,) = cells_of_table(*three["tables"]["side by side"].values(), three["figures"])
    assert row[2] == "2.50×"
    (row,) = cells_of_table(["a", "ratio"], [["no figure here", "3.00×"]], three["figures"])
    assert row[1] == "none: no figure in the row"


@pytest.mark.parametrize(
    ("command", "config", "shown"),
    [
        (
            "python -m bench.demo",
            {"trials": 2, "sizes": [8, 64]},
            "`python -m bench.demo` with trials=2, sizes=8,64",
        ),
        ("python -m bench.demo --trials 2", {"trials": 2}, "`python -m bench.demo --trials 2`"),
        ("./hack/torchkube run x.yaml --fresh", {}, "`./hack/torchkube run x.yaml --fresh`"),
    ],
)
def test_the_header_carries_the_arguments_the_run_used(
    command: str, config: dict[str, Any], shown: str
) -> None:
    """A command recorded without its flags says the configuration it ran with (a header that
    named the bare command claimed the default trial count)."""
    body = {"command": command, "config": config}
    assert arguments(body) == shown


def test_the_rendered_record_applies_the_rule_throughout() -> None:
    text = markdown_of(record([1.0, 2.0], [4.0, 50.0], command="python -m bench.demo"))
    assert "`python -m bench.demo` with trials=2 —" in text
    assert "no verdict: 2 trials" in text and "none: 2 trials each" in text
    assert "| met |" not in text and "18.00" not in text and "ratio 18" not in text


def test_a_benchmark_records_the_arguments_it_was_started_with() -> None:
    from bench.common import command_line

    assert command_line("bench.demo", ["--only", "single", "--trials-small", "2"]) == (
        "python -m bench.demo --only single --trials-small 2"
    )
    assert command_line("bench.demo", []) == "python -m bench.demo"


def test_the_fleet_records_notes_describe_the_fleet() -> None:
    """The fleet runs its operators one after the other after one warm-up start of the whole
    fleet, idle only: its record said what the single-job scenario does (alternating jobs, a
    warm-up job per operator, loaded)."""
    from bench.operator_scale import notes, parse_args

    fleet = " ".join(notes(parse_args(["--only", "fleet"])))
    assert "one after the other in an order that rotates trial by trial" in fleet
    assert "after each operator's first trial only" in fleet
    assert "one warm-up start of every job by the bare client, not counted" in fleet
    alone = " ".join(notes(parse_args(["--only", "fleet", "--no-limit"])))
    assert "one warm-up start of every job by torchkube, not counted" in alone
    assert "alternating" not in fleet and "loaded" not in fleet and "warm-up job per" not in fleet
    assert "v1.9.3, client limit 500 requests/s" in fleet, "the raised peer, by default"
    single = " ".join(notes(parse_args(["--only", "single"])))
    assert "jobs alternating" in single and "fleet" not in single
    assert "fleet:" in " ".join(notes(parse_args([]))), "a run of every scenario says both"


def test_the_recorded_fleet_says_what_ran() -> None:
    import json

    from bench.common import RESULTS_DIR

    recorded = json.loads((RESULTS_DIR / "operator_scale_fleet.json").read_text())
    assert not any("alternating" in note for note in recorded["notes"])


def test_a_figure_named_for_more_than_it_measures_is_rendered_as_what_it_is(
    tmp_path: Path,
) -> None:
    """live_recovery's "goodput over the run" is steps × the median step time ÷ wall time,
    which slower steps raise: it is rendered under that name, its record untouched."""
    from bench import report

    results = Results("demo", "python -m bench.demo --x")
    results.figure("recovery: live: goodput over the run", "%").add(57.5, 2.0)
    results.tables["runs"] = (["run", "goodput over the run"], [["live", "57.5 %"]])
    results.write(tmp_path)
    rendered = report.render(tmp_path)
    assert "goodput" not in rendered
    assert "| recovery: live: steps × median step time ÷ wall time | 1 | 57.5 % |" in rendered
    assert "goodput over the run" in (tmp_path / "demo.json").read_text()


def test_a_one_trial_ratio_equal_to_one_is_no_ratio_of_a_figure_and_its_twin() -> None:
    """The fleet's steady-state flatness of 1.00, measured once, was taken for the ratio of
    two recorded figures with the same medians — all workers Running and all pods Running of
    one contender, the same trials — and rendered "3, 3 … met": a verdict on one trial; again
    when one trial's last pod was a store, so that the series differed in one value but not
    in their medians. Two figures of one median divided compare nothing."""
    for store in (0.0, 0.56):  # the last pod a worker in every trial, or a store in one
        results = Results("demo", "python -m bench.demo")
        for name, late in (("all Running", 0.0), ("all pods Running", store)):
            figure = results.figure(f"fleet, Kubeflow: {name}", "s")
            for value in (174.47, 202.43, 210.2):
                figure.add(value + (late if value < 200 else 0.0), load=1.0)
        flat = results.figure("steady state, last third ÷ first third", "x", target=Target(1.25))
        flat.add(1.0, load=1.0)
        (row,) = [r for n, r in rows(results.to_json()).items() if n.startswith("steady")]
        assert row[2] == "no ratio: 1 trial" and row[7] == "no verdict: 1 trial", (store, row)


def test_no_recorded_fleet_start_is_the_clusters_first() -> None:
    """A fresh API server gives each pod watch a buffer sized from the events it has seen
    (10 on a new cluster): the first fleet start on it meets watches that close under the
    burst, whoever starts it. One start no contender is judged on comes first — by the limit,
    which has no operator of its own to warm — then every contender's trials in rotation."""
    from bench.operator_scale import fleet_starts

    players = ["torchkube", "Kubeflow", "bare client"]
    starts = fleet_starts(players, trials=3, steady_minutes=6.0, warm_up="bare client")
    assert starts[0] == ("bare client", False, 0.0), "the warm-up: not counted, no steady state"
    counted = [(who, steady) for who, record, steady in starts[1:] if record]
    assert len(counted) == len(starts) - 1 == 9
    assert [who for who, _ in counted[:3]] == players
    assert [who for who, _ in counted[3:6]] == ["Kubeflow", "bare client", "torchkube"]
    assert {who: [s for w, s in counted if w == who] for who in players} == {
        "torchkube": [6.0, 0.0, 0.0],
        "Kubeflow": [6.0, 0.0, 0.0],
        "bare client": [6.0, 0.0, 0.0],
    }, "the steady state after each contender's first counted trial only"


def test_the_single_jobs_trials_follow_a_large_start_that_is_not_counted() -> None:
    """After the 8-worker warm-ups (an operator's first use), one start of the largest size
    by the limit: the first large burst on a fresh API server closes its pod watches,
    whoever makes it, and in a scratch run the first 512-worker trial was its run's slowest."""
    from types import SimpleNamespace

    from bench.operator_scale import notes, parse_args, warmer

    players = [SimpleNamespace(name=n) for n in ("torchkube", "Kubeflow", "bare client")]
    assert warmer(players).name == "bare client"
    assert warmer(players[:2]).name == "torchkube", "no limit: torchkube warms"
    single = " ".join(notes(parse_args(["--only", "single"])))
    assert "nor one job of the largest size by the bare client after them" in single
    assert "pod watches the API server closed: per trial in the JSON" in single


def test_queued_trials_follow_a_large_start_that_is_not_counted() -> None:
    """Through Kueue too, the 8-worker warm-ups leave the API server's pod watches with the
    ten-event buffers a fresh cluster gives them: one start of the largest size comes next."""
    from bench.queued_start import parse_args, warm_ups

    said = warm_ups(parse_args([]))
    assert "nor one job of 512 workers by the bare client after them" in said
    assert "by torchkube" in warm_ups(parse_args(["--no-limit"]))


def test_differing_loads_name_their_contenders_by_what_sets_their_figures_apart() -> None:
    """The note beside a ratio names whose load is whose: a bare "3.7 vs 2.6" read in the
    ratio's order where its figures came in the other."""
    assert distinct_names(
        [
            "512 workers, idle: apply → all Running, bare client",
            "512 workers, idle: apply → all Running, torchkube",
        ]
    ) == ["bare client", "torchkube"]
    assert distinct_names(
        [
            "64 jobs × 64 workers, torchkube: all Running",
            "64 jobs × 64 workers, Kubeflow: all Running",
        ]
    ) == ["torchkube", "Kubeflow"]
    assert distinct_names(["8 workers: x, Kubeflow", "8 workers: x, Kubeflow, client 500/s"]) == [
        "Kubeflow",
        "Kubeflow, client 500/s",
    ], "a name that is the other's start keeps its last word"
    assert distinct_names(["killed, never back: total", "the limit: a standby: total"]) == [
        "killed, never back",
        "the limit: a standby",
    ]
    assert distinct_names(["same", "same"]) == ["same", "same"]
