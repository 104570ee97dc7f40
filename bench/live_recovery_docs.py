"""What docs/trainer.md shows of live recovery's cost and saving, rendered from the records
``bench.live_recovery`` wrote (``live_recovery.json``: the steady state and a worker lost for
good; ``live_recovery_steady.json``: the steady state at a longer step;
``live_recovery_crash.json``: a crash restarted in place). Every figure and every heading's
number is read from them; a record that is missing leaves its part out.

The names of the ways and of the figures are defined here, once, for the bench and the docs.
"""

from __future__ import annotations

from typing import Any

from bench.common import fmt, markdown_table

WAYS = ("restart", "live", "torchrun")
LABELS = {"restart": "recovery: restart", "live": "recovery: live", "torchrun": "plain torchrun"}
STEADY = ("restart", "live")
LOSS_TITLES = {"lost": "a worker lost for good", "crash": "a crash restarted in place"}

ROWS = {
    "back_past_loss_step_seconds": ("the loss → training back past the loss step", "s"),
    "survivors_pause_seconds": ("the survivors' pause", "s"),
    "training_stopped_seconds": ("no step trained around the loss", "s"),
    "steps_computed_twice": ("steps computed twice", "steps"),
    "discarded_attempts": ("attempts discarded (live)", "steps"),
    "replacement_trains_seconds": ("the loss → the replacement trains", "s"),
    "goodput": ("goodput (the run's timeline)", "%"),
    "first_to_last_step_seconds": ("the first step → the last", "s"),
    "final_loss": ("final loss", ""),
}
SPLIT = {
    "wall_seconds": "wall: launch → the last step",
    "startup_seconds": "start-up",
    "trained_seconds": "trained, kept",
    "redone_seconds": "redone",
    "training_stopped_seconds": "the loss's pause",
    "checkpoint_blocked_seconds": "checkpoint saves",
    "other_seconds": "other pauses",
}
"""Where each run's wall time went (seconds, from its timeline)."""

FIGURE_NOTES = [
    "the loss → training back past the loss step: the kill → the first 'step N' log line past "
    "the step it happened at; logged every 10 steps, so it includes up to 10 steps, alike for "
    "the three ways.",
    "the survivors' pause: live, the writer group's longest step, from its first attempt "
    "(the progress record's live.longestStepSeconds: detection, the attempt the loss broke, "
    "the next quorum); restart and torchrun, whose survivors stop and start again with the "
    "new round: no step trained around the loss.",
    "no step trained around the loss: the first stretch after the kill in which no process "
    "trained, from the end of the last step before it to the first time one began to train "
    "again (a new round's start after its checkpoint load; live, the survivor's first step "
    "in the smaller quorum), from the log lines.",
    "steps computed twice: for every step, the rounds that computed it less one, from the log "
    "lines (bench/timeline.py); 'rounds started after the loss' and 'resumed from' (a "
    "checkpoint loaded) in the last table are read from the same logs. Live's attempts "
    "discarded are the progress record's live.discardedSteps.",
    "the loss → the replacement trains: live, the kill → the replacement's start in the "
    "victim's log (after it copied a live peer's state); restart and torchrun, the kill → the "
    "new round's start (after its checkpoint load).",
    "goodput: the time the job spent training steps that were kept (the union over the "
    "processes of the log windows whose steps no later round computed again, less the "
    "checkpoint saves' 'training blocked' seconds) ÷ the wall time from the launch to the end "
    "of the final step. The operator's status.goodput is not used: no operator runs here.",
    "the first step → the last: the run's wall time less its start-up; a survivor training "
    "alone (twice the accumulation, the same global batch) is slower per step: that shows "
    "here, not in the goodput, which counts time.",
    "final loss: not the same quantity: restart and torchrun record the mean over both ranks "
    "of the last 10 steps, live the writer group's half of the batch.",
]


# ----------------------------------------------------------------------------- reading a record
def figure(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The record's figure of that name, if it was measured."""
    found = next((f for f in body["figures"] if f["name"] == name), None)
    return found if found is not None and found["values"] else None


def median(body: dict[str, Any], name: str, scale: float = 1.0, unit: str | None = None) -> str:
    """The figure's median in its unit (``scale``d into ``unit``); "not measured" if none."""
    found = figure(body, name)
    if found is None:
        return "not measured"
    return fmt(found["median"] * scale, unit if unit is not None else found["unit"])


def spread(body: dict[str, Any], name: str, scale: float = 1.0, unit: str | None = None) -> str:
    """``median [min – max]`` of the figure (``scale``d into ``unit``)."""
    found = figure(body, name)
    if found is None:
        return "not measured"
    unit = unit if unit is not None else found["unit"]
    low, high = (fmt(found[k] * scale, unit) for k in ("min", "max"))
    return f"{fmt(found['median'] * scale, unit)} [{low} – {high}]"


def loads(body: dict[str, Any], names: list[str]) -> str:
    """The range of the load averages recorded with those figures' values."""
    seen = [x for name in names if (f := figure(body, name)) for x in f["load_average"]]
    return f"{min(seen):.1f}–{max(seen):.1f}" if seen else "–"


def recorded(body: dict[str, Any]) -> str:
    m = body["machine"]
    end = m.get("load_average_at_end", ["?"])[0]
    return (
        f"`{body['command']}`, {m['date']}, {m['nproc']} cores ({m['cpu']}), 1-minute load "
        f"average {m['load_average_at_start'][0]} at the start and {end} at the end, revision "
        f"{m.get('revision', 'unknown')}"
    )


# ----------------------------------------------------------------------------- the parts
def steady_part(main: dict[str, Any], longer: dict[str, Any] | None) -> list[str]:
    """torchft's steady cost, isolated: the main record's step and, if recorded, a longer one."""
    bodies = [b for b in (main, longer) if b is not None and figure(b, _SHARE)]
    if not bodies:
        return []

    def batch(body: dict[str, Any]) -> str:
        return f"global batch {body['config'].get('global_batch') or 'of the example'}"

    cost = median(bodies[0], _TORCHFT, 1000, "ms")
    shares = [
        f"{median(b, _SHARE)} of the live step at {batch(b)} "
        f"({median(b, _PACE.format(LABELS['live']))} a step)"
        for b in bodies
    ]
    head = (
        f"**Without a failure, torchft's quorum and commit vote take {cost} a step: "
        f"{' and '.join(shares)}.**"
    )
    header = ["no failure, median [min – max]"] + [
        f"{batch(b)} ({figure(b, _SHARE)['n']} runs each)"  # type: ignore[index]
        for b in bodies
    ]
    slowdown = figure(bodies[0], _SLOWDOWN)
    target = f" (target {slowdown['target']})" if slowdown and "target" in slowdown else ""

    def ms_split(body: dict[str, Any]) -> str:
        return (
            f"{spread(body, _TORCHFT, 1000, 'ms')} (quorum {median(body, _QUORUM, 1000, 'ms')}, "
            f"vote {median(body, _VOTE, 1000, 'ms')})"
        )

    def verdict(body: dict[str, Any]) -> str:
        found = figure(body, _SLOWDOWN)
        return f"{spread(body, _SLOWDOWN)}: {found.get('verdict', '')}" if found else "–"

    paces = [_PACE.format(LABELS[w]) for w in STEADY]
    rows = [
        ["seconds per step, restart / live"]
        + [" / ".join(median(b, p) for p in paces) for b in bodies],
        ["the loops whole: live ÷ restart, less 1"] + [spread(b, _LOOPS) for b in bodies],
        ["torchft per step: quorum + commit vote"] + [ms_split(b) for b in bodies],
        ["torchft's share of the live step"] + [spread(b, _SHARE) for b in bodies],
        [f"torchft's slowdown: its time ÷ the rest of the step{target}"]
        + [verdict(b) for b in bodies],
        ["the gradients' all-reduce through the Manager (not in the above: DDP has one too)"]
        + [spread(b, _ALLREDUCE, 1000, "ms") for b in bodies],
        ["load average (1 min) at the runs' ends"] + [loads(b, paces) for b in bodies],
    ]
    recorded_by = [f"- {batch(b)}: {recorded(b)}." for b in bodies]
    return [head, "", markdown_table(header, rows), "", *recorded_by, ""]


_PACE = "{}: steady seconds per step"
_LOOPS = "live loop ÷ restart loop, steady seconds per step (pairs)"
_QUORUM = "torchft per live step: the quorum"
_VOTE = "torchft per live step: the commit vote"
_TORCHFT = "torchft per live step: quorum + commit vote"
_ALLREDUCE = "gradients' all-reduce through the Manager, per live step"
_SHARE = "torchft's share of the live step"
_SLOWDOWN = "torchft's steady-state slowdown (its time ÷ the rest of the step)"


def _name(way: str, key: str) -> str:
    return f"{LABELS[way]}: {ROWS[key][0]}"


def loss_head(body: dict[str, Any]) -> str:
    """What the record measured, said with its medians."""
    config = body["config"]
    kind = "crash" if config.get("crash") else "lost"

    def m(way: str, key: str) -> str:
        return median(body, _name(way, key))

    back = {w: figure(body, _name(w, "back_past_loss_step_seconds")) for w in WAYS}
    if kind == "lost":
        every = config.get("checkpoint_interval")
        return (
            f"**A worker lost for good at step {config['kill_at']}, its replacement started "
            f"{config['replace_after']:g} s later, a checkpoint every {every} steps: under "
            f"`recovery: live` the survivors pause {m('live', 'survivors_pause_seconds')} "
            f"(the detection and the step the loss broke) and compute "
            f"{m('live', 'steps_computed_twice')} twice, back past the loss step after "
            f"{m('live', 'back_past_loss_step_seconds')}; `recovery: restart` is back after "
            f"{m('restart', 'back_past_loss_step_seconds')} with "
            f"{m('restart', 'steps_computed_twice')} computed twice, plain torchrun after "
            f"{m('torchrun', 'back_past_loss_step_seconds')} with "
            f"{m('torchrun', 'steps_computed_twice')}.**"
        )
    live, restart = back["live"], back["restart"]
    if live is None or restart is None:
        saving = "not measured"
    elif restart["median"] > live["median"]:
        saving = f"live saves {fmt(restart['median'] - live['median'], 's')} per loss of this kind"
    else:
        saving = "live saves nothing per loss of this kind"
    return (
        f"**A crash restarted in place at step {config['kill_at']}, the cheapest loss for "
        f"restart: back past the loss step after {m('live', 'back_past_loss_step_seconds')} "
        f"under `recovery: live`, {m('restart', 'back_past_loss_step_seconds')} under "
        f"`recovery: restart`, {m('torchrun', 'back_past_loss_step_seconds')} under plain "
        f"torchrun: {saving}.**"
    )


def seen_in_the_logs(body: dict[str, Any]) -> str:
    """Where each way started to train again after the loss, and what it loaded, in every
    run; the runs that failed; a live replacement that never started."""
    trials = body["extra"].get("loss_trials", [])
    said = []
    for way in WAYS:
        mine = [t for t in trials if t.get("way") == way and "failed" not in t]
        if not mine or not all("round_starts_after_loss" in t for t in mine):
            continue
        starts = sorted({s for t in mine for s in t["round_starts_after_loss"]})
        loaded = sorted({r for t in mine for r in t.get("resumed_after_loss", [])})
        what = f"a checkpoint loaded: {'; '.join(loaded)}" if loaded else "no checkpoint loaded"
        steps = ", ".join(str(s) for s in starts) or "–"
        said.append(f"{LABELS[way]} trained again from step {steps} ({what})")
    out = [f"After the loss, in every run, the logs show: {'; '.join(said)}."] if said else []
    config = body["config"]
    interval = config.get("checkpoint_interval")
    if interval and config["kill_at"] < interval:
        out.append(
            f"No checkpoint was written before the loss: the first comes at step {interval}."
        )
    failed = [t for t in trials if "failed" in t]
    if failed:
        out.append(
            f"{len(failed)} run(s) failed and are in no figure: "
            + "; ".join(f"{LABELS[t['way']]} #{t['trial']}: {t['failed']}" for t in failed)
            + "."
        )
    live = [t for t in trials if t.get("way") == "live" and "failed" not in t]
    joined = figure(body, _name("live", "replacement_trains_seconds"))
    if not config.get("crash") and live and joined is None:
        out.append(
            "No live run logged its replacement's start before its last step: the survivor "
            f"trained the {config['loss_steps'] - config['kill_at']} steps after the loss alone, "
            "so the replacement's join (its copy of the state, and the survivor's pause for "
            "it) is not in these figures."
        )
    return " ".join(out)


def loss_part(body: dict[str, Any]) -> list[str]:
    """A record's loss: its heading, the three ways side by side, every run, where its time
    went."""
    kind = "crash" if body["config"].get("crash") else "lost"
    title = LOSS_TITLES[kind]
    tables = body["tables"]
    parts = [loss_head(body), ""]
    if body["extra"].get("setup"):
        parts += [body["extra"]["setup"], ""]
    if seen := seen_in_the_logs(body):
        parts += [seen, ""]
    for name, caption in (
        (f"{title}, three ways: median [min – max]", None),
        (
            f"{title}: every run, in the order run",
            "Every run, in its trial's rotated order, with the 1-minute load average at its end:",
        ),
        (
            f"{title}: where each run's wall time went (its timeline)",
            "Where each run's wall time went (seconds, from its workers' log lines):",
        ),
    ):
        if name in tables:
            if caption:
                parts += [caption, ""]
            parts += [markdown_table(tables[name]["headers"], tables[name]["rows"]), ""]
    parts += [f"Recorded by {recorded(body)}.", ""]
    return parts


def render(
    main: dict[str, Any] | None,
    longer: dict[str, Any] | None = None,
    crash: dict[str, Any] | None = None,
) -> str:
    """docs/trainer.md's block: the steady cost, a worker lost for good, a crash restarted in
    place, how each figure is read, and the break-even."""
    parts: list[str] = []
    if main is not None:
        parts += steady_part(main, longer)
        if any(f["name"].startswith(LABELS["live"]) for f in main["figures"]):
            parts += loss_part(main) if _has_loss(main) else []
    if crash is not None and _has_loss(crash):
        parts += loss_part(crash)
    if (main is not None and _has_loss(main)) or (crash is not None and _has_loss(crash)):
        parts += ["How each figure is read:", "", *(f"- {note}" for note in FIGURE_NOTES), ""]
    notes = (main or {}).get("extra", {}).get("break_even", [])
    if notes:
        parts += [
            "**Break-even, from the figures above.** Live mode gives torchft its share of "
            "every step, that share of each hour; each loss costs the other way the time from "
            "the loss until training is back past the loss step, redone steps included, and "
            "live its own such time. Live wins above (share × 3600 s) ÷ (the saving per loss) "
            "losses an hour (`bench/live_recovery.py`'s `break_even_per_hour`):",
            "",
            *(f"- {note}" for note in notes),
            "",
        ]
    return "\n".join(parts).rstrip() + "\n"


def _has_loss(body: dict[str, Any]) -> bool:
    return bool(body.get("extra", {}).get("loss_trials"))
