"""The measured figures README.md and docs/*.md quote, each in a block rendered from the
records (``bench/results/<name>.json``) by ``python -m bench.report``, so that no figure is
typed by hand and ``--check`` fails when a block is not what its records say.

A block lies between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` in one document; the
prose around it is written by hand and holds no measured figure. Every renderer follows the
rule of :mod:`bench.common`: a median with its range, the trials behind it and each trial's
load; no ratio and no verdict on fewer than :data:`~bench.common.MIN_TRIALS` trials per
contender; contenders whose loads differ said so beside the figure.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench import live_recovery_docs, watchers
from bench.common import (
    FIGURE_HEADERS,
    LIMIT,
    figure_rows,
    fmt,
    loads_differ,
    loads_of,
    markdown_table,
    ruled_verdict,
    short_of_trials,
    spread_of,
    trials_text,
)

Body = dict[str, Any]


class Run:
    """One record: its figures by name, and where and when it ran."""

    def __init__(self, name: str, body: Body) -> None:
        self.name, self.body = name, body
        self.figures = {f["name"]: f for f in body["figures"]}
        self.machine = body["machine"]
        self.cores = int(self.machine.get("nproc", 2))

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self.figures[name]

    def stamp(self) -> str:
        """``name`` at its revision and date, on its machine, and the load over its trials."""
        m = self.machine
        loads = [x for f in self.body["figures"] for x in f.get("load_average", [])]
        load = f"; load {min(loads):.1f}–{max(loads):.1f} over its trials" if loads else ""
        return (
            f"`{self.name}` at revision {m.get('revision', '?')}, {m['date']}, "
            f"{m['nproc']} cores ({m['cpu']}){load}"
        )

    def peer(self, contender: str) -> str:
        """A Kubeflow contender's name with its release (from the record's notes) and its
        client limits: v1.8.1 runs with its client's default throttle, which has no flag."""
        notes = " ".join(self.body["notes"])
        found = re.search(re.escape(contender) + r": training-operator (v[\d.]+)", notes)
        release = found.group(1) if found else "?"
        if contender == "Kubeflow":
            return f"Kubeflow {release}, default client limits"
        return f"Kubeflow {release}{contender.removeprefix('Kubeflow')}"


def trials(figure: dict[str, Any]) -> str:
    return str(len(figure["values"]))


def shown(figure: dict[str, Any]) -> str:
    """``median [min – max]``; a single trial's value alone."""
    if len(figure["values"]) == 1:
        return fmt(figure["values"][0], figure["unit"])
    return spread_of(figure)


def throttled(theirs: dict[str, Any], pods: int) -> str:
    """What Kubeflow v1.8.1's client throttle alone takes of its median: at least the time
    its limit (controller-runtime's default, which v1.8.1 cannot change) needs for the
    ``pods`` creates; "mostly" where that is half its median or more."""
    from bench import kubeflow

    floor = throttle(pods, kubeflow.DEFAULT.client_qps, kubeflow.DEFAULT.client_burst)
    if floor <= 0:
        return ""
    mostly = "mostly " if floor >= theirs["median"] / 2 else ""
    median, creates = fmt(theirs["median"], "s"), f"{pods:,} pod creates"
    return f"{mostly}its client's throttle: ≥ {fmt(floor, 's')} of {median} for {creates}"


def versus(
    ours: dict[str, Any], theirs: dict[str, Any], cores: int, pods: int | None = None
) -> str:
    """Theirs ÷ ours of the medians where both have enough trials, otherwise why not; and
    whether their loads differ. ``pods``: theirs is Kubeflow v1.8.1 creating that many pods,
    and the ratio says how much of its time its client's throttle takes."""
    behind = [ours, theirs]
    differ = loads_differ(behind, cores)
    if short_of_trials(behind):
        return f"none: {trials_text(behind)}" + (f"; {differ}" if differ else "")
    notes = [note] if pods and (note := throttled(theirs, pods)) else []
    notes += [differ] if differ else []
    ratio = fmt(theirs["median"] / ours["median"], "x")
    return ratio + (f" ({'; '.join(notes)})" if notes else "")


def verdict_line(run: Run, name: str) -> str:
    """``figure: median [min – max] against its target: verdict`` (by the rule)."""
    figure = run[name]
    verdict = ruled_verdict(figure, run.body["figures"])
    return f"{name}: {shown(figure)}, target {figure['target']}: {verdict}"


def figure_table(run: Run, names: Sequence[str], label: Callable[[str], str] = str) -> str:
    """The named figures: median [min – max], trials and each trial's load."""
    rows = [[label(n), shown(run[n]), trials(run[n]), loads_of(run[n])] for n in names]
    return markdown_table(["", "median [min – max]", "trials", "load per trial"], rows)


def throttle(requests: int, qps: int, burst: int) -> float:
    """Seconds a client limited to ``qps`` after a burst of ``burst`` needs for ``requests``."""
    return max(0.0, (requests - burst) / qps)


# ----------------------------------------------------------------------------- starting jobs
SIZES = (8, 64, 512)
CONDITIONS = ("idle", "loaded")


def scale(records: dict[str, Body]) -> str:
    """operator_scale's single jobs: every operator's all-Running time beside torchkube's."""
    from bench import kubeflow

    run = Run("operator_scale_single", records["operator_scale_single"])
    names = ["torchkube", "Kubeflow", "Kubeflow, client 500/s"]
    if f"8 workers, idle: apply → all Running, {LIMIT}" in run.figures:
        names.insert(1, LIMIT)
    has_all_pods = "8 workers, idle: apply → all pods Running, torchkube" in run.figures
    rows = []
    has_closed = counts_closed_watches(run)
    for condition in CONDITIONS:
        for n in SIZES:
            key = f"{n} workers, {condition}: apply → all Running, "
            ours = run[key + "torchkube"]
            for name in names:
                figure = run[key + name]
                label = contender_label(run, name)
                ratio = ratio_against(run, name, ours, figure, n)
                if name == LIMIT and not ratio.startswith("none"):
                    figure_part, _, note = ratio.partition(" (")
                    ratio = f"torchkube is {figure_part} it" + (f" ({note}" if note else "")
                all_pods = (
                    [shown(run[f"{n} workers, {condition}: apply → all pods Running, {name}"])]
                    if has_all_pods
                    else []
                )
                closed = closed_per_trial(run, "single", name, condition, n, figure)
                rows.append(
                    [
                        str(n),
                        condition,
                        label,
                        shown(figure),
                        *all_pods,
                        trials(figure),
                        loads_of(figure),
                        *([closed or ""] if has_closed else []),
                        ratio,
                    ]
                )
    running = ["apply → all workers Running", "all pods Running"] if has_all_pods else []
    headers = [
        "workers",
        "",
        "pods of",
        *(running or ["apply → all Running"]),
        "trials",
        "load per trial",
        *(["pod watches closed per trial"] if has_closed else []),
    ]
    qps, burst = kubeflow.DEFAULT.client_qps, kubeflow.DEFAULT.client_burst
    floors = []
    trial_keys = ["all Running"] + (["all pods Running"] if has_all_pods else [])
    for n in SIZES:
        pods, both = throttle(n, qps, burst), throttle(2 * n, qps, burst)
        each = [
            "; ".join(
                ", ".join(
                    fmt(v, "s") for v in run[f"{n} workers, {c}: apply → {k}, Kubeflow"]["values"]
                )
                for c in CONDITIONS
            )
            for k in trial_keys
        ]
        floors.append([str(n), fmt(pods, "s"), fmt(both, "s"), *each])
    targets = [
        "8 workers, idle: apply → all Running, torchkube",
        "512 workers, idle: apply → all created, torchkube",
        "512 workers, loaded: apply → all created, torchkube",
        *(
            f"{n} workers, {condition}: torchkube ÷ {LIMIT}, all Running"
            for condition in CONDITIONS
            for n in SIZES
            if LIMIT in names
        ),
    ]
    return "\n".join(
        [
            f"{run.stamp()}.",
            "",
            markdown_table([*headers, "÷ torchkube"], rows),
            "",
            *([split, ""] if (split := start_split(run, names)) else []),
            f"{run.peer('Kubeflow')}: its client's throttle ({qps} requests/s after a burst "
            f"of {burst}) alone needs (requests − {burst}) ÷ {qps} seconds:",
            "",
            markdown_table(
                [
                    "workers",
                    "N pod creates",
                    "N pods and N Services",
                    *(
                        ["its trials, all Workers (idle; loaded)", "its trials, all pods"]
                        if has_all_pods
                        else ["its trials (idle; loaded)"]
                    ),
                ],
                floors,
            ),
            "",
            "Targets: " + "; ".join(verdict_line(run, name) for name in targets) + ".",
            "",
        ]
    )


def ratio_against(
    run: Run, name: str, ours: dict[str, Any], theirs: dict[str, Any], pods: int | None
) -> str:
    """The ratio a contender's figure ``theirs`` stands in against torchkube's ``ours``:
    torchkube ÷ the limit for the bare client, the peer ÷ torchkube for a peer (for Kubeflow
    v1.8.1 with its throttle's share of ``pods`` creates), none for torchkube itself."""
    if name == "torchkube":
        return ""
    if name == LIMIT:
        return versus(theirs, ours, run.cores)
    return versus(ours, theirs, run.cores, pods if name == "Kubeflow" else None)


def contender_label(run: Run, name: str) -> str:
    """How a table names a contender: Kubeflow's with release and client limits, the bare
    client as what it is."""
    if name == LIMIT:
        return f"{LIMIT}: the same pods, no operator (the limit)"
    return name if name == "torchkube" else run.peer(name)


def where_the_time_goes(records: dict[str, Body]) -> str:
    """operator_scale's single jobs of 512 workers: where the CPU went until all Running."""
    run = Run("operator_scale_single", records["operator_scale_single"])
    (title,) = [t for t in run.body["tables"] if t.startswith("where the CPU went")]
    table = run.body["tables"][title]
    rows = [row for row in table["rows"] if row[1] == "512"]
    cells = {(row[0], row[2]): row for row in rows}
    lines = []
    for condition in CONDITIONS:
        mine = cells[(condition, "torchkube")]
        running = run[f"512 workers, {condition}: apply → all Running, torchkube"]
        lines.append(
            f"{condition}: the control plane {mine[3]}, KWOK {mine[4]}, the operator {mine[5]}; "
            f"all of them got {mine[7]} cores, at which everything but the operator needed "
            f"{mine[8]}; all Running took {shown(running)}"
        )
    n = trials(run["512 workers, idle: apply → all Running, torchkube"])
    return "\n".join(
        [
            f"{run.stamp()}; CPU seconds from apply to all Running, medians of {n} trials:",
            "",
            markdown_table(table["headers"], rows),
            "",
            "A 512-worker torchkube job, " + "; ".join(lines) + ".",
            "",
        ]
    )


def fast_scheduler(records: dict[str, Body]) -> str:
    """operator_scale's 512 workers with kube-scheduler's client at 500 requests/s."""
    from bench import kubeflow

    run = Run("operator_scale_fast-scheduler", records["operator_scale_fast-scheduler"])
    scenario = "scheduler at 500 req/s"
    key = f"512 workers, {scenario}, idle: apply → all {{}}, {{}}"
    rows = []
    names = ["torchkube", "Kubeflow"]
    if key.format("Running", LIMIT) in run.figures:
        names.insert(1, LIMIT)
    closed_column = ["pod watches closed per trial"] if counts_closed_watches(run) else []
    for name in names:
        label = contender_label(run, name)
        figures = [run[key.format(what, name)] for what in ("created", "bound", "Running")]
        rows.append([label, *(shown(f) for f in figures)])
        closed = closed_per_trial(run, scenario, name, "idle", 512, figures[-1])
        rows[-1] += [trials(figures[-1]), loads_of(figures[-1])]
        rows[-1] += [closed or ""] if closed_column else []
    ours, theirs = run[key.format("Running", "torchkube")], run[key.format("Running", "Kubeflow")]
    qps, burst = kubeflow.DEFAULT.client_qps, kubeflow.DEFAULT.client_burst
    each = ", ".join(fmt(v, "s") for v in theirs["values"])
    (title,) = [t for t in run.body["tables"] if t.startswith("where the CPU went")]
    cpu = {row[2]: row for row in run.body["tables"][title]["rows"]}["torchkube"]
    limit = []
    if LIMIT in names:
        versus_limit = versus(run[key.format("Running", LIMIT)], ours, run.cores)
        limit = [f"torchkube ÷ the limit, all Running: {versus_limit}.", ""]
    return "\n".join(
        [
            f"{run.stamp()}; idle:",
            "",
            markdown_table(
                [
                    "pods of",
                    "all created",
                    "all bound",
                    "all Running",
                    "trials",
                    "load per trial",
                    *closed_column,
                ],
                rows,
            ),
            "",
            *limit,
            f"{run.peer('Kubeflow')} ÷ torchkube, all Running: {versus(ours, theirs, run.cores)}"
            f" — mostly that client's throttle: its trials took {each}, where {burst} requests "
            f"pass at once and then {qps} a second: (512 − {burst}) ÷ {qps} = "
            f"{fmt(throttle(512, qps, burst), 's')} for its pods, (1,024 − {burst}) ÷ {qps} = "
            f"{fmt(throttle(1024, qps, burst), 's')} with a Service each. Where the CPU went "
            f"in this run (medians): the control plane {cpu[3]}, KWOK {cpu[4]}, torchkube's "
            f"operator {cpu[5]}; all of them got {cpu[7]} cores, at which everything but the "
            f"operator needed {cpu[8]}.",
            "",
        ]
    )


def fleet_contenders(run: Run) -> tuple[str, list[str]]:
    """The fleet's figure prefix and its contenders: torchkube, the peer, the limit."""
    config = run.body["config"]
    prefix = f"{config['jobs']} jobs × {config['per_job']} workers, "
    found = [
        f["name"].removeprefix(prefix).removesuffix(": all Running")
        for f in run.body["figures"]
        if f["name"].startswith(prefix) and f["name"].endswith(": all Running")
    ]
    order = {"torchkube": 0, LIMIT: 2}
    return prefix, sorted(found, key=lambda name: order.get(name, 1))


def fleet(records: dict[str, Body]) -> str:
    """operator_scale's fleet: 64 jobs × 64 workers, the contenders one after the other."""
    run = Run("operator_scale_fleet", records["operator_scale_fleet"])
    prefix, names = fleet_contenders(run)
    ours_head = f"{prefix}torchkube: "
    whats = [
        f["name"].removeprefix(ours_head)
        for f in run.body["figures"]
        if f["name"].startswith(ours_head)
    ]
    rows = []
    for what in whats:
        row = [what]
        for name in names:
            figure = run.figures.get(f"{prefix}{name}: {what}")
            if figure is None:
                row.append("")
            elif "÷" in what and short_of_trials([figure]):
                row.append(f"{shown(figure)} ({trials_text([figure])}: no verdict)")
            else:
                row.append(shown(figure))
        rows.append(row)
    ours = run[f"{ours_head}all Running"]
    counts = {name: len(run[f"{prefix}{name}: all Running"]["values"]) for name in names}
    if len(set(counts.values())) == 1:
        trial_counts = trials_text([ours]) + (" per contender" if len(names) > 1 else "")
    else:
        trial_counts = "; ".join(
            f"{n} trials of {contender_label(run, c)}" for c, n in counts.items()
        )
    pods = run.body["config"]["jobs"] * run.body["config"]["per_job"]
    lines = []
    for name in names[1:]:
        ratio = ratio_against(run, name, ours, run[f"{prefix}{name}: all Running"], pods)
        said = "torchkube ÷ the limit" if name == LIMIT else f"{run.peer(name)} ÷ torchkube"
        lines.append(f"{said}, all Running: {ratio}.")
    return "\n".join(
        [
            f"{run.stamp()}:",
            "",
            markdown_table(["", *(contender_label(run, n) for n in names)], rows),
            "",
            f"{trial_counts.capitalize()}, in an order that rotates trial by trial"
            f"{warmed_up_by(run)}; the steady state after each operator's first trial only.",
            "",
            *(part for line in lines for part in (line, "")),
            *fleet_trials(run, prefix),
        ]
    )


def warmed_up_by(run: Run) -> str:
    """Who started the whole fleet once before the trials, not counted (nothing for a record
    without that start)."""
    warm_up = run.body["extra"].get("fleet_warm_up")
    if warm_up is None:
        return ""
    name = warm_up["operator"]
    who = f"the {LIMIT}" if name == LIMIT else contender_label(run, name)
    return f", after one warm-up start of every job by {who}, not counted"


SPLIT = {"answered": "apply → answered", "first worker created": "apply → first worker seen"}
"""The parts of a small job's start before its pods are all created (see :func:`start_split`)."""


def start_split(run: Run, names: Sequence[str]) -> str:
    """Where an 8-worker job's start goes first, for a record that splits it: the apply's
    answer — for an operator the job's own create, a request the limit does not make (the bare
    client's apply is its pods' creates, so its first pod can come before its answer) — and the
    first worker pod seen (an operator's reaction to its job). Empty for a record without
    them: then the all-created column is the only split."""
    head = "8 workers, idle: apply → "
    splits = [n for n in names if all(f"{head}{part}, {n}" in run.figures for part in SPLIT)]
    if not splits:
        return ""
    rows = [
        [
            contender_label(run, name),
            *(shown(run[f"{head}{part}, {name}"]) for part in SPLIT),
            trials(run[f"{head}answered, {name}"]),
            loads_of(run[f"{head}answered, {name}"]),
        ]
        for name in splits
    ]
    return "8 workers, idle, before the pods:\n\n" + markdown_table(
        ["", *SPLIT.values(), "trials", "load per trial"], rows
    )


def closed_cell(trial: dict[str, Any], unit: bool = True) -> str:
    """The pod watches the API server closed in a trial (with ``unit``: "4 watches"), and
    whose where the record names them (``bench.watchers``)."""
    closed = trial["closed_pod_watches"]
    closers = trial.get("closed_pod_watchers")
    whose = f" ({watchers.said(closers)})" if closers else ""
    return (fmt(closed, "watches") if unit else f"{closed:.0f}") + whose


def counts_closed_watches(run: Run) -> bool:
    """Whether the record's start-up trials count the pod watches the API server closed."""
    return any("closed_pod_watches" in trial for trial in run.body["extra"].get("trials", []))


def closed_per_trial(
    run: Run, scenario: str, name: str, condition: str, workers: int, times: dict[str, Any]
) -> str | None:
    """A start-up scenario's trials of one contender: "none" where the API server closed no
    pod watch in any, else each trial's time (``times``: its figure) beside the watches
    closed in it, in the order they ran; None for a record that did not count them."""
    found = [
        trial
        for trial in run.body["extra"].get("trials", [])
        if (trial.get("scenario", "single"), trial["operator"], trial["condition"])
        == (scenario, name, condition)
        and trial["workers"] == workers
    ]
    if not found or any("closed_pod_watches" not in trial for trial in found):
        return None
    if not any(trial["closed_pod_watches"] for trial in found):
        return "none"
    return ", ".join(
        f"{fmt(time, 's')}: {closed_cell(trial, unit=False)}"
        for time, trial in zip(times["values"], found, strict=True)
    )


def fleet_trials(run: Run, prefix: str) -> list[str]:
    """The fleet's trials in the order they ran, each with the pod watches the API server
    closed in it: the trials of one contender differ by as much as the contenders do, and
    these say why; the warm-up first, what the cluster's first burst cost the one who made
    it. Nothing for a record that did not count them."""
    trials = run.body["extra"].get("fleet_trials", [])
    if not trials or any("closed_pod_watches" not in trial for trial in trials):
        return []
    earlier: Counter[str] = Counter()  # a contender's trials before this one: its index
    rows = []
    warm_up = run.body["extra"].get("fleet_warm_up")
    if warm_up is not None:
        rows.append(
            [
                "warm-up, not counted",
                contender_label(run, warm_up["operator"]),
                fmt(warm_up["running_s"], "s"),
                closed_cell(warm_up),
                fmt(warm_up["kwok_cpu_s"], "s"),
                f"{warm_up['load']:.1f}",
            ]
        )
    for order, trial in enumerate(trials, start=1):
        name = trial["operator"]
        running = run[f"{prefix}{name}: all pods Running"]["values"][earlier[name]]
        earlier[name] += 1
        rows.append(
            [
                str(order),
                contender_label(run, name),
                fmt(running, "s"),
                closed_cell(trial),
                fmt(trial["kwok_cpu_s"], "s"),
                f"{trial['load']:.1f}",
            ]
        )
    header = ["trial", "contender", "all pods Running", "pod watches closed", "KWOK CPU", "load"]
    return ["Trial by trial:", "", markdown_table(header, rows), ""]


# ----------------------------------------------------------------------------- through Kueue
def queued(records: dict[str, Body]) -> str:
    """queued_start: every contender through Kueue, admitted and all Running."""
    run = Run("queued_start", records["queued_start"])
    names = ["torchkube", "Kubeflow", "Kubeflow, client 500/s"]
    if f"8 workers through Kueue: apply → all Running, {LIMIT}" in run.figures:
        names.append(LIMIT)
    has_all_pods = "8 workers through Kueue: apply → all pods Running, torchkube" in run.figures
    rows = []
    for n in SIZES:
        key = f"{n} workers through Kueue: apply → {{}}, {{}}"
        ours = run[key.format("all Running", "torchkube")]
        for name in names:
            admission, running = (
                run[key.format(what, name)] for what in ("Workload admitted", "all Running")
            )
            label = contender_label(run, name)
            ratio = ratio_against(run, name, ours, running, n)
            if name == LIMIT:
                ratio = f"torchkube ÷ the limit: {ratio}"
            all_pods = [shown(run[key.format("all pods Running", name)])] if has_all_pods else []
            rows.append([str(n), label, shown(admission), shown(running), *all_pods])
            rows[-1] += [trials(running), loads_of(running), ratio]
    trial_rows = run.body["extra"]["trials"]
    slowest = max(trial_rows, key=lambda t: t["admitted_s"])
    admitted = [t["admitted_s"] for t in trial_rows]
    kueue = [t["kueue_cpu_s"] for t in trial_rows if t["workers"] == 512]
    label = slowest["operator"]
    if label not in ("torchkube", LIMIT):
        label = run.peer(label)
    return "\n".join(
        [
            f"{run.stamp()} (each trial's load at its start):",
            "",
            markdown_table(
                [
                    "workers",
                    "job of",
                    "apply → Workload admitted",
                    *(
                        ["apply → all workers Running", "all pods Running"]
                        if has_all_pods
                        else ["apply → all Running"]
                    ),
                    "trials",
                    "load per trial",
                    "÷ torchkube, all Running",
                ],
                rows,
            ),
            "",
            f"Admitted {fmt(min(admitted), 's')} to {fmt(max(admitted), 's')} after the apply "
            f"over all {len(admitted)} trials (the slowest: {label}, {slowest['workers']} "
            f"workers); Kueue's process spent {fmt(min(kueue), 's')} to {fmt(max(kueue), 's')} "
            "of CPU on a 512-worker start.",
            "",
        ]
    )


# ----------------------------------------------------------------------------- healing
def operator_recovery(records: dict[str, Body]) -> str:
    """operator_recovery: a worker's replacement, and a lost node's workers: torchkube, the
    peer, and (where recorded) the limit — the bare client's replacer."""
    run = Run("operator_recovery", records["operator_recovery"])
    limited = f"worker Failed → replacement created, {LIMIT}" in run.figures
    rows = []
    for what in (
        "worker Failed → replacement created",
        "worker Failed → replacement Running",
        "worker force-deleted → replacement created",
        "worker force-deleted → replacement Running",
    ):
        ours, theirs = run[f"{what}, torchkube"], run[f"{what}, Kubeflow"]
        shown_all = [ours, theirs, *([run[f"{what}, {LIMIT}"]] if limited else [])]
        rows.append([what, *(shown(f) for f in shown_all), trials_text(shown_all)])
        rows[-1] += ["; ".join(loads_of(f) for f in shown_all), versus(ours, theirs, run.cores)]
        if limited:
            rows[-1].append(versus(run[f"{what}, {LIMIT}"], ours, run.cores))
    headers = ["", "torchkube", run.peer("Kubeflow")]
    headers += [f"the limit ({LIMIT})"] if limited else []
    headers += ["trials", "load per trial", "Kubeflow ÷ torchkube"]
    headers += ["torchkube ÷ the limit"] if limited else []
    node = "node loss: NotReady → all 5 workers Running on healthy nodes"
    healthy = "node loss: workers Running on healthy nodes 125 s after NotReady"
    ours, theirs = run[f"{node}, torchkube"], run[f"{healthy}, Kubeflow"]
    limit_line = (
        f"; the limit: {shown(run[f'{node}, {LIMIT}'])} (load {loads_of(run[f'{node}, {LIMIT}'])})"
        if limited
        else ""
    )
    return "\n".join(
        [
            f"{run.stamp()}:",
            "",
            markdown_table(headers, rows),
            "",
            f"A lost node (grace {run.body['config']['grace']} s): "
            f"{verdict_line(run, f'{node}, torchkube')} (load {loads_of(ours)}){limit_line}; "
            f"Kubeflow had {theirs['median']:g} of 5 workers on healthy nodes 125 s after "
            f"NotReady ({trials_text([theirs])}).",
            "",
        ]
    )


E2E_CASES = {
    "killed, never back (1:2)": "torchkube: the worker never returns",
    "killed, replaced (2:2)": "torchkube: the worker is replaced",
    "trainer crashed, restarted in place (2:2)": "torchkube: only its trainer crashed",
    "plain torchrun, default rendezvous settings (1:2)": "plain torchrun, its default settings",
    "plain torchrun, torchkube's rendezvous settings (1:2)": "plain torchrun, torchkube's settings",
}
NEVER_BACK = "killed, never back (1:2)"
E2E_LIMIT = "the limit: the survivor alone at once, a standby with torch imported (1:2)"
E2E_LIMIT_SAID = "the limit: a static world, the survivor's end hands over to a warm standby"


def recovery_e2e(records: dict[str, Body], parts: bool = True) -> str:
    """recovery_e2e: kill → training again, torchkube's three cases and plain torchrun."""
    run = Run("recovery_e2e", records["recovery_e2e"])
    ours = run[f"{NEVER_BACK}: kill → next step"]
    what = ["kill → next step", *(("detection", "re-rendezvous", "worker start") if parts else ())]
    rows = []
    cases = dict(E2E_CASES)
    if f"{E2E_LIMIT}: kill → next step" in run.figures:  # limit rows with it, after torchkube's
        cases = {NEVER_BACK: cases.pop(NEVER_BACK), E2E_LIMIT: E2E_LIMIT_SAID, **cases}
    for case, label in cases.items():
        total = run[f"{case}: kill → next step"]
        if case == E2E_LIMIT:
            ratio = f"torchkube ÷ it: {versus(total, ours, run.cores)}"
        else:
            ratio = versus(ours, total, run.cores) if case.startswith("plain") else ""
        rows.append([label, *(shown(run[f"{case}: {w}"]) for w in what)])
        rows[-1] += [trials(total), loads_of(total), ratio]
    store = run["plain torchrun, store's agent killed: trials where training went on"]
    return "\n".join(
        [
            f"{run.stamp()}; a worker SIGKILLed at step {run.body['config']['kill_step']}:",
            "",
            markdown_table(
                ["", *what, "trials", "load per trial", "÷ torchkube (never returns)"], rows
            ),
            "",
            f"Plain torchrun with its store's agent killed: training went on in "
            f"{fmt(store['median'], '')} of {trials_text([store])}.",
            "",
        ]
    )


def torchrun(records: dict[str, Body]) -> str:
    """docs/operator.md: the same, without the split."""
    return recovery_e2e(records, parts=False)


def real_nodes(records: dict[str, Body]) -> str:
    """real_node_recovery: a worker pod deleted or hung, with and without a spare."""
    run = Run("real_node_recovery", records["real_node_recovery"])
    rows = []
    for fault in ("worker pod deleted", "worker SIGSTOPped"):
        for spare in ("no spare", "1 spare"):
            key = f"{fault}, {spare}: "
            again = run[key + "training again"]
            ended = run.figures.get(key + "pod ended (detection)")
            hang = run.figures.get(key + "Hang in the status")
            rows.append([fault, spare, shown(again)])
            rows[-1] += [shown(ended) if ended else "", shown(hang) if hang else ""]
            rows[-1] += [trials(again), loads_of(again)]
    spare = "worker pod deleted, 1 spare: training again"
    alone = run["worker pod deleted, no spare: training again"]
    return "\n".join(
        [
            f"{run.stamp()}:",
            "",
            markdown_table(
                [
                    "fault",
                    "",
                    "training again",
                    "pod ended",
                    "Hang in the status",
                    "trials",
                    "load per trial",
                ],
                rows,
            ),
            "",
            f"Targets: {verdict_line(run, spare)}; with a spare at most half the time without "
            f"one: {versus(run[spare], alone, run.cores).replace('none', 'no verdict')}.",
            "",
        ]
    )


def spares(records: dict[str, Body]) -> str:
    """docs/operator.md: a deleted worker's job, with and without a spare."""
    run = Run("real_node_recovery", records["real_node_recovery"])
    names = [f"worker pod deleted, {s}: training again" for s in ("no spare", "1 spare")]
    return "\n".join(
        [
            f"{run.stamp()}:",
            "",
            figure_table(run, names),
            "",
            f"Without a spare ÷ with one: {versus(run[names[1]], run[names[0]], run.cores)}.",
            "",
        ]
    )


def measured(records: dict[str, Body]) -> str:
    """docs/operator.md: the operator's own times, from operator_recovery and operator_scale."""
    recovery = Run("operator_recovery", records["operator_recovery"])
    scale_run = Run("operator_scale_single", records["operator_scale_single"])
    grace = recovery.body["config"]["grace"]
    rows = []
    for run, name, label in (
        (
            scale_run,
            "8 workers, idle: apply → all Running, torchkube",
            "8-worker job created → all Running",
        ),
        (
            scale_run,
            "512 workers, idle: apply → all created, torchkube",
            "512-worker job created → all created",
        ),
        (
            recovery,
            "worker Failed → replacement created, torchkube",
            "worker Failed → replacement created",
        ),
        (
            recovery,
            "worker force-deleted → replacement created, torchkube",
            "worker force-deleted → replacement created",
        ),
        (
            recovery,
            "node loss: heartbeats stop → nodes NotReady (cluster), torchkube",
            "node stops heartbeating → NotReady (the cluster's controller-manager)",
        ),
        (
            recovery,
            "node loss: NotReady → all 5 workers Running on healthy nodes, torchkube",
            f"node NotReady → all 5 workers Running elsewhere (`nodeLostGraceSeconds: {grace}`)",
        ),
    ):
        figure = run[name]
        rows.append([label, shown(figure), trials(figure), loads_of(figure), f"`{run.name}`"])
    return "\n".join(
        [
            markdown_table(["", "median [min – max]", "trials", "load per trial", "record"], rows),
            "",
            f"{scale_run.stamp()}; {recovery.stamp()}.",
            "",
        ]
    )


# ----------------------------------------------------------------------------- the trainer
def trainer(records: dict[str, Body]) -> str:
    """trainer_throughput on CPU: the trainer against a plain loop, pair by pair."""
    run = Run("trainer_throughput", records["trainer_throughput"])
    names = [f["name"] for f in run.body["figures"]]
    ratio = next(n for n in names if "trainer ÷ plain loop (wall time)" in n)
    overhead = next(n for n in names if "trainer overhead (wall time)" in n)
    note = run[ratio].get("note", "")
    return "\n".join(
        [
            f"{run.stamp()}:",
            "",
            figure_table(run, names),
            "",
            f"Targets: {verdict_line(run, ratio)}"
            + (f" ({note})" if note else "")
            + f"; {verdict_line(run, overhead)}.",
            "",
        ]
    )


def checkpoint(records: dict[str, Body]) -> str:
    """checkpoint_cost: what a save blocks, an emergency save, loads and resumes."""
    run = Run("checkpoint_cost", records["checkpoint_cost"])
    names = [f["name"] for f in run.body["figures"]]
    ratio = "async blocking ÷ sync blocking"
    return "\n".join(
        [
            f"{run.stamp()}:",
            "",
            figure_table(run, names),
            "",
            f"Target: {verdict_line(run, ratio)}.",
            "",
        ]
    )


def memory(records: dict[str, Body]) -> str:
    """trainer_memory: FSDP2's peak memory per rank with gradient accumulation."""
    run = Run("trainer_memory", records["trainer_memory"])
    now, before = (f["name"] for f in run.body["figures"])
    behind = [run[now], run[before]]
    if short_of_trials(behind):
        difference = f"no difference given: {trials_text(behind)}"
    else:
        difference = fmt(run[before]["median"] - run[now]["median"], run[now]["unit"])
        difference = f"{difference} less per rank now (medians)"
    return "\n".join(
        [f"{run.stamp()}:", "", figure_table(run, [now, before]), "", f"{difference}.", ""]
    )


def note_items(run: Run) -> list[str]:
    """The record's notes, an item each: what the run was and what its figures count."""
    return [f"- {note}" for note in run.body["notes"]]


def memory_noted(records: dict[str, Body]) -> str:
    """docs/trainer.md: :func:`memory` with the record's notes, which give the gradient sizes
    the difference is read against."""
    run = Run("trainer_memory", records["trainer_memory"])
    return "\n".join([memory(records).rstrip("\n"), "", *note_items(run), ""])


def emergency_save(records: dict[str, Body]) -> str:
    """docs/trainer.md: the emergency save (SIGTERM) beside the time a default job's workers
    get for it — torchrun's ``--shutdown-timeout`` as the worker pods pass it, taken from the
    code that sets it — and what the same run's sync save throughput writes in that time, so
    the budget is read in bytes a node can save."""
    from torchkube.api import API_VERSION, KIND, TrainingJob
    from torchkube.api.worker_launch import shutdown_timeout

    run = Run("checkpoint_cost", records["checkpoint_cost"])
    throughput = "save throughput (sync)"
    names = [name for name in run.figures if name.startswith("emergency save")]
    job = TrainingJob.model_validate(
        {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "default"}, "spec": {}}
    )
    grace, budget = job.spec.checkpoint.termination_grace_period_seconds, shutdown_timeout(job)
    speed = run[throughput]
    written = [fmt(budget * mb_s / 1000, "GB") for mb_s in (speed["median"], min(speed["values"]))]
    return "\n".join(
        [
            f"{run.stamp()}:",
            "",
            figure_table(run, [*names, throughput]),
            "",
            f"The time a default job's workers get for it: `terminationGracePeriodSeconds` "
            f"{grace} s less {grace - budget} s for the launcher's report, {budget} s. At the "
            f"sync save throughput above, that writes {written[0]} (its median) or "
            f"{written[1]} (its slowest trial).",
            "",
            *note_items(run),
            "",
        ]
    )


def ratio_shown(run: Run, name: str) -> str:
    """A per-trial ratio's median [min – max], or why the rule withholds it."""
    figure = run[name]
    if short_of_trials([figure]):
        return f"no ratio: {trials_text([figure])}"
    return shown(figure)


def gpu(records: dict[str, Body]) -> str:
    """trainer_throughput --gpu: per variant, the trainer and the plain loop (tokens/s, MFU)
    and their ratio trial by trial; nanoGPT's own bench.py and the trainer's DDP + compile
    against it, where the run had it."""
    run = Run("trainer_throughput_gpu", records["trainer_throughput_gpu"])
    model = run.body["config"]["model"]
    variants = [
        f["name"].removesuffix(": trainer").removeprefix(f"{model} ")
        for f in run.body["figures"]
        if f["name"].endswith(": trainer")
    ]
    rows = []
    for variant in variants:
        prefix = f"{model} {variant}"
        ours, ref = run[f"{prefix}: trainer"], run[f"{prefix}: plain loop"]
        rows.append(
            [
                variant,
                shown(ours),
                shown(ref),
                ratio_shown(run, f"{prefix}: trainer ÷ plain loop (wall time)"),
                shown(run[f"{prefix}: trainer MFU"]),
                f"{trials(ours)}, {trials(ref)}",
                f"{loads_of(ours)}; {loads_of(ref)}",
            ]
        )
    headers = ["", "trainer", "plain loop", "trainer ÷ plain loop", "trainer MFU"]
    lines = [
        f"{run.stamp()}, {run.machine.get('gpu', 'GPU')}, torch {run.machine.get('torch')}:",
        "",
        markdown_table([*headers, "trials", "load per trial"], rows),
        "",
    ]
    if "nanoGPT bench.py" in run.figures:
        theirs = run["nanoGPT bench.py"]
        versus_name = f"{model} ddp + compile: trainer ÷ nanoGPT bench.py (wall time)"
        revision = run.body["extra"].get("nanogpt_revision", "?")
        lines += [
            f"nanoGPT's own `bench.py` (commit {revision}, unmodified; batch "
            f"{run.body['config']['micro_batch']} × {run.body['config']['seq_len']}, bf16, "
            f"compile, random data; one run per trial): {shown(theirs)} "
            f"(MFU {shown(run['nanoGPT bench.py MFU'])}; {trials(theirs)} trials, load "
            f"{loads_of(theirs)}). The trainer's DDP + compile against it, trial by trial: "
            f"{ratio_shown(run, versus_name)}, target {run[versus_name]['target']}: "
            f"{ruled_verdict(run[versus_name], run.body['figures'])}.",
            "",
        ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- README
def readme(records: dict[str, Body]) -> str:
    """README.md: the headline comparisons, each with its trials, loads and ratio (or none)."""
    e2e = Run("recovery_e2e", records["recovery_e2e"])
    single = Run("operator_scale_single", records["operator_scale_single"])
    fast = Run("operator_scale_fast-scheduler", records["operator_scale_fast-scheduler"])
    kueue = Run("queued_start", records["queued_start"])
    flt = Run("operator_scale_fleet", records["operator_scale_fleet"])
    real = Run("real_node_recovery", records["real_node_recovery"])
    rows: list[list[str]] = []

    def compare(what: str, run: Run, ours: str, theirs: str, peer: str, pods: int = 0) -> None:
        """``peer`` is a contender of the record: Kubeflow's get their release and limits."""
        mine, peers = run[ours], run[theirs]
        label = run.peer(peer) if peer.startswith("Kubeflow") else peer
        rows.append([what, shown(mine), f"{label}: {shown(peers)}", trials_text([mine, peers])])
        ratio = ratio_against(run, peer, mine, peers, pods)
        rows[-1] += [f"{loads_of(mine)}; {loads_of(peers)}", ratio]

    def alone(what: str, run: Run, ours: str) -> None:
        mine = run[ours]
        rows.append([what, shown(mine), "", trials_text([mine]), loads_of(mine), ""])

    def beside_limit(what: str, run: Run, ours: str, limit: str, label: str) -> None:
        """torchkube's figure ``ours`` beside the limit's: how far torchkube is from it."""
        mine, floor = run[ours], run[limit]
        rows.append([what, shown(mine), f"{label}: {shown(floor)}"])
        rows[-1] += [trials_text([mine, floor]), f"{loads_of(mine)}; {loads_of(floor)}"]
        rows[-1].append(f"torchkube ÷ limit: {ratio_against(run, LIMIT, mine, floor, None)}")

    def against_limit(what: str, run: Run, key: str) -> None:
        """The same pods created with no operator. ``key``: the figure's name with ``{}`` for
        the contender's."""
        if key.format(LIMIT) in run.figures:
            ours, limit = key.format("torchkube"), key.format(LIMIT)
            beside_limit(what, run, ours, limit, contender_label(run, LIMIT))

    total = "kill → next step"
    if f"{E2E_LIMIT}: {total}" in e2e.figures:
        beside_limit(
            "a worker SIGKILLed, never back: training again",
            e2e,
            f"{NEVER_BACK}: {total}",
            f"{E2E_LIMIT}: {total}",
            E2E_LIMIT_SAID,
        )
    compare(
        "a worker SIGKILLed, never back: training again",
        e2e,
        f"{NEVER_BACK}: {total}",
        f"plain torchrun, default rendezvous settings (1:2): {total}",
        "plain torchrun, its defaults",
    )
    compare(
        "the same",
        e2e,
        f"{NEVER_BACK}: {total}",
        f"plain torchrun, torchkube's rendezvous settings (1:2): {total}",
        "plain torchrun, torchkube's settings",
    )
    alone("a worker SIGKILLed and replaced", e2e, f"killed, replaced (2:2): {total}")
    alone("only its trainer crashed", e2e, f"trainer crashed, restarted in place (2:2): {total}")
    for condition in CONDITIONS:
        for n in SIZES:
            against_limit(
                f"{n} workers, {condition}: apply → all Running",
                single,
                f"{n} workers, {condition}: apply → all Running, {{}}",
            )
        for peer in ("Kubeflow", "Kubeflow, client 500/s"):
            key = f"512 workers, {condition}: apply → all Running, "
            compare(
                f"512 workers, {condition}: apply → all Running",
                single,
                key + "torchkube",
                key + peer,
                peer,
                pods=512,
            )
    key = "512 workers, scheduler at 500 req/s, idle: apply → all Running, "
    against_limit("the same, kube-scheduler at 500 requests/s", fast, key + "{}")
    compare(
        "the same, kube-scheduler at 500 requests/s",
        fast,
        key + "torchkube",
        key + "Kubeflow",
        "Kubeflow",
        pods=512,
    )
    key = "512 workers through Kueue: apply → all Running, "
    against_limit("512 workers through Kueue: apply → all Running", kueue, key + "{}")
    for peer in ("Kubeflow", "Kubeflow, client 500/s"):
        compare(
            "512 workers through Kueue: apply → all Running",
            kueue,
            key + "torchkube",
            key + peer,
            peer,
            pods=512,
        )
    prefix, fleet_names = fleet_contenders(flt)
    title = f"{prefix.removesuffix(', ')} at once, contenders in turn: all Running"
    key = f"{prefix}{{}}: all Running"
    against_limit(title, flt, key)
    pods = flt.body["config"]["jobs"] * flt.body["config"]["per_job"]
    for peer in fleet_names[1:]:
        if peer != LIMIT:
            compare(title, flt, key.format("torchkube"), key.format(peer), peer, pods=pods)
    for case in ("no spare", "1 spare"):
        alone(
            f"real kubelet nodes, a worker pod deleted, {case}: training again",
            real,
            f"worker pod deleted, {case}: training again",
        )
        alone(
            f"real kubelet nodes, a worker's trainer hung, {case}: training again",
            real,
            f"worker SIGSTOPped, {case}: training again",
        )
    runs = [e2e, single, fast, kueue, flt, real]
    return "\n".join(
        [
            markdown_table(
                ["", "torchkube", "peer, same run", "trials", "load per trial", "peer ÷ torchkube"],
                rows,
            ),
            "",
            "From " + "; ".join(run.stamp() for run in runs) + ".",
            "",
        ]
    )


# ----------------------------------------------------------------------------- the blocks
@dataclass(frozen=True)
class Block:
    """A rendered block: the document it lies in (an attribute of :mod:`bench.report`), its
    marker name, the records it needs (skipped while one is missing) and its renderer."""

    document: str
    name: str
    records: tuple[str, ...]
    render: Callable[[dict[str, Body]], str]

    @property
    def markers(self) -> tuple[str, str]:
        return f"<!-- {self.name}:begin -->", f"<!-- {self.name}:end -->"


LIVE_RECOVERY = ("live_recovery", "live_recovery_steady", "live_recovery_crash")


def live_recovery(records: dict[str, Body]) -> str:
    """docs/trainer.md's measurements of live recovery: the steady cost at two step lengths, a
    worker lost for good and a crash restarted in place (:mod:`bench.live_recovery_docs`)."""
    return live_recovery_docs.render(*(records[name] for name in LIVE_RECOVERY))


def sustained_outcomes(run: Run) -> list[str]:
    """Per rate, from the runs themselves: how many finished, where the others stood at the
    cap, how many failed, and the medians beside torchft's figures."""
    from bench.live_sustained import TORCHFT, UNDISTURBED, WAYS

    trials = run.body["extra"]["trials"]
    steps, cap = run.body["config"]["steps"], run.body["config"]["cap_minutes"]
    lines = []
    for way, rate in ((w.name, w.rate) for w in WAYS):
        runs = [t for t in trials if t["way"] == way]
        if rate is None or not runs:
            continue
        done = [t for t in runs if t["succeeded"]]
        capped = [t["steps"] for t in runs if t["capped"]]
        failed = len(runs) - len(done) - len(capped)
        committed = next(f for n, f in run.figures.items() if n.startswith(f"{way}: steps commit"))
        efficient = next(f for n, f in run.figures.items() if n.startswith(f"{way}: training eff"))
        share, efficiency = TORCHFT[rate]
        text = (
            f"**{way}**: {sum(t['faults'] for t in runs)} faults over {len(runs)} runs; "
            f"{len(done)} finished their {steps} steps"
        )
        if capped:
            text += (
                f", {len(capped)} were still short of them at the {cap:g}-minute cap (at step "
                f"{', '.join(map(str, capped))})"
            )
        text += f"; {failed} failed"
        if committed.get("median") is not None:
            text += f"; steps committed {fmt(committed['median'], '%')} (torchft {share} %)"
        if efficient.get("median") is not None:
            theirs = f" (torchft {efficiency} %)" if efficiency is not None else ""
            text += f", training efficiency {fmt(efficient['median'], '%')}{theirs}"
        lines.append(text + ".")
    undisturbed = [t for t in trials if t["way"] == UNDISTURBED]
    lines.append(
        f"**{UNDISTURBED}**: {sum(1 for t in undisturbed if t['succeeded'])} of "
        f"{len(undisturbed)} runs finished, the reference of each trial's efficiency."
    )
    return lines


def live_sustained(records: dict[str, Body]) -> str:
    """docs/trainer.md's sustained failures: steps committed, efficiency and the outcome at
    torchft's two rates, every run, and the faults by what their victim was doing."""
    run = Run("live_sustained", records["live_sustained"])
    body = run.body
    faults = body["tables"]["the faults injected, by what their victim was doing"]
    every = body["tables"]["every run, in the order run"]
    return "\n".join(
        [
            f"{run.stamp()}:",
            "",
            *(f"- {line}" for line in sustained_outcomes(run)),
            "",
            *(f"- {note}" for note in body["notes"]),
            "",
            markdown_table(FIGURE_HEADERS, figure_rows(body["figures"], run.cores)),
            "",
            markdown_table(faults["headers"], faults["rows"]),
            "",
            "Every run, in the order run:",
            "",
            markdown_table(every["headers"], every["rows"]),
            "",
        ]
    )


def multikueue(records: dict[str, Body]) -> str:
    """multikueue_start: a job dispatched from a MultiKueue manager against the same job
    applied on a worker cluster, all workers Running there."""
    run = Run("multikueue_start", records["multikueue_start"])
    ways = ("through MultiKueue", "directly on a worker")
    rows = []
    for n in run.body["config"]["sizes"]:
        direct = run[f"{n} workers, {ways[1]}: apply → all Running"]
        for way in ways:
            created, running = (
                run[f"{n} workers, {way}: apply → {what}"]
                for what in ("all created", "all Running")
            )
            ratio = versus(direct, running, run.cores) if way == ways[0] else ""
            rows.append([str(n), way, shown(created), shown(running), trials(running)])
            rows[-1] += [loads_of(running), ratio]
    headers = ["workers", "applied", "apply → all created", "apply → all Running", "trials"]
    headers += ["load per trial", "÷ directly on a worker, all Running"]
    return "\n".join(
        [
            f"{run.stamp()} (each trial's load at its start):",
            "",
            markdown_table(headers, rows),
            "",
            *(f"- {note}" for note in run.body["notes"]),
            "",
        ]
    )


def placement_rows(run: Run) -> list[list[str]]:
    """Per job and way: trials in one domain (or why the goal does not apply), the domains,
    apply → all Running, and the way with a topology request ÷ the same path without one."""
    from bench.topology_placement import ASKING, WAYS

    placed = run.body["extra"]["placement"]
    rows = []
    for size in run.body["extra"]["sizes"]:
        job = size["job"]
        for way in WAYS:
            mine = [t for t in placed if t["way"] == way and t["size"] == job]
            packed = f"{sum(t['in_one_domain'] for t in mine)} of {len(mine)}"
            if not size["room"]:
                packed += " (no domain has room)"
            domains = run[f"{job}, {way}: {job.rsplit(' ', 1)[1]}s the workers ran in"]
            running = run[f"{job}, {way}: apply → all Running"]
            ratio = ""
            if way in ASKING.values():
                bare = next(n for n, asking in ASKING.items() if asking == way)
                ratio = versus(run[f"{job}, {bare}: apply → all Running"], running, run.cores)
            rows.append([job, way, packed, shown(domains), shown(running), trials(running)])
            rows[-1] += [loads_of(running), ratio]
    return rows


def waits(run: Run) -> list[str]:
    """What the waiting job said, by way and by what held the racks: the last trial's words
    (the rack names change from trial to trial), and whether it started once a rack was
    freed."""
    lines = []
    seen: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for trial in run.body["extra"].get("fragmentation", []):
        seen.setdefault((trial["way"], trial["held_by"]), []).append(trial)
    for (way, held_by), mine in seen.items():
        started = [t for t in mine if t["freed_to_all_running_s"] is not None]
        last = mine[-1]
        running = last["workers_running_while_waiting"]
        text = (
            f"**{way}, racks held by {held_by}**: waited with {running} of its workers "
            f"Running, the job's condition saying “{last['message']}”; "
            f"{len(started)} of {len(mine)} started within {last['cap_s']:.0f} s of a rack "
            "being freed"
        )
        lines.append(text + ".")
    return lines


def lost_node_rows(run: Run) -> list[list[str]]:
    """Per way: trials whose workers were all in the lost node's rack after the replacement,
    the racks, and the delete → replacement Running."""
    from bench.topology_placement import WAYS

    recorded = run.body["extra"]["lost_node"]
    job = recorded[0]["job"]
    rows = []
    for way in WAYS:
        mine = [t for t in recorded if t["way"] == way]
        stayed = f"{sum(t['stayed_in_rack'] for t in mine)} of {len(mine)}"
        back = run[f"lost node, {job}, {way}: node deleted → replacement Running"]
        racks = run[f"lost node, {job}, {way}: racks after the replacement"]
        rows.append([way, stayed, shown(racks), shown(back), trials(back), loads_of(back)])
    return rows


def topology(records: dict[str, Body]) -> str:
    """topology_placement: workers in one rack or block and the time to start, with Kueue's
    topology-aware scheduling and without Kueue, against the same jobs asking for none; then
    every rack one node short: what the job waits with and how soon a freed rack starts it."""
    run = Run("topology_placement", records["topology_placement"])
    headers = ["job", "way", "in one domain", "domains", "apply → all Running", "trials"]
    headers += ["load per trial", "÷ the same path without topology"]
    short = "every rack one node short, "
    frag = [f["name"] for f in run.body["figures"] if f["name"].startswith(short)]
    shortfall = [
        "Every rack one node short, held by other queued jobs (figures), or by pods outside Kueue:",
        "",
        figure_table(run, frag, lambda name: name.removeprefix(short)),
        "",
    ]
    lost = []
    if run.body["extra"].get("lost_node"):
        job = run.body["extra"]["lost_node"][0]["job"]
        lost = [
            f"A lost node: {job}, one worker's Node deleted:",
            "",
            markdown_table(
                [
                    "way",
                    "all in the lost node's rack after",
                    "racks",
                    "deleted → replacement Running",
                    "trials",
                    "load per trial",
                ],
                lost_node_rows(run),
            ),
            "",
        ]
    return "\n".join(
        [
            f"{run.stamp()} (each trial's load at its start):",
            "",
            markdown_table(headers, placement_rows(run)),
            "",
            *lost,
            *(shortfall if frag else []),
            *(f"- {line}" for line in waits(run)),
            *(f"- {note}" for note in run.body["notes"]),
            "",
        ]
    )


API_WRITE = "API server CPU per write: "
STATUS_WRITE = "TrainingJob status merge patch"
RULE_FREE = f"{STATUS_WRITE}, the CRD without its CEL rules (the floor)"
MUTABLE = f"{STATUS_WRITE}, the CRD without its immutability rules"
POD_CREATE = "worker pod create (no scheduler picks it up)"


def api_writes(records: dict[str, Body]) -> str:
    """operator_cost: what each kind of write a start makes costs the API server's CPU."""
    run = Run("operator_cost", records["operator_cost"])
    names = [name for name in run.figures if name.startswith(API_WRITE)]
    patch = run[API_WRITE + STATUS_WRITE]
    against = {
        "the same write without the CEL rules": RULE_FREE,
        "the same write without the immutability rules": MUTABLE,
        "a worker pod's create": POD_CREATE,
    }
    return "\n".join(
        [
            f"{run.stamp()}, the operator stopped:",
            "",
            figure_table(run, names, lambda name: name.removeprefix(API_WRITE)),
            "",
            "A TrainingJob status write ÷ "
            + "; ÷ ".join(
                f"{what}: {versus(run[API_WRITE + name], patch, run.cores)}"
                for what, name in against.items()
            )
            + ".",
            "",
        ]
    )


SCALE = ("operator_scale_single",)
BLOCKS = [
    Block("TARGET", "scale", SCALE, scale),
    Block("TARGET", "where-the-time-goes", SCALE, where_the_time_goes),
    Block("TARGET", "api-writes", ("operator_cost",), api_writes),
    Block("TARGET", "fast-scheduler", ("operator_scale_fast-scheduler",), fast_scheduler),
    Block("TARGET", "fleet", ("operator_scale_fleet",), fleet),
    Block("TARGET", "queued", ("queued_start",), queued),
    Block("TARGET", "operator-recovery", ("operator_recovery",), operator_recovery),
    Block("TARGET", "recovery-e2e", ("recovery_e2e",), recovery_e2e),
    Block("TARGET", "real-nodes", ("real_node_recovery",), real_nodes),
    Block("TARGET", "trainer", ("trainer_throughput",), trainer),
    Block("TARGET", "checkpoint", ("checkpoint_cost",), checkpoint),
    Block("TARGET", "memory", ("trainer_memory",), memory),
    Block("TARGET", "gpu", ("trainer_throughput_gpu",), gpu),
    Block("QUEUEING", "queued", ("queued_start",), queued),
    Block("QUEUEING", "multikueue", ("multikueue_start",), multikueue),
    Block("QUEUEING", "topology", ("topology_placement",), topology),
    Block("OPERATOR", "torchrun", ("recovery_e2e",), torchrun),
    Block("OPERATOR", "spares", ("real_node_recovery",), spares),
    Block("OPERATOR", "measured", ("operator_recovery", *SCALE), measured),
    Block("TRAINER", "trainer", ("trainer_throughput",), trainer),
    Block("TRAINER", "memory", ("trainer_memory",), memory_noted),
    Block("TRAINER", "emergency-save", ("checkpoint_cost",), emergency_save),
    Block("TRAINER", "gpu", ("trainer_throughput_gpu",), gpu),
    Block("TRAINER", "live_recovery", LIVE_RECOVERY, live_recovery),
    Block("TRAINER", "live_sustained", ("live_sustained",), live_sustained),
    Block(
        "README",
        "benchmarks",
        (
            "recovery_e2e",
            *SCALE,
            "operator_scale_fast-scheduler",
            "queued_start",
            "operator_scale_fleet",
            "real_node_recovery",
        ),
        readme,
    ),
]
