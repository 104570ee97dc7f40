"""docs/trainer.md's measurements of live recovery are rendered from bench.live_recovery's
records (bench.live_recovery_docs, through bench.report): every heading's number is a
recorded median."""

from typing import Any

from bench import live_recovery_docs as docs
from bench.common import Results

LOST = {"kill_at": 250, "replace_after": 20.0, "checkpoint_interval": 500, "crash": False}


def record(config: dict[str, Any], figures: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A record with three trials of each figure (the value, +1, +2) and one loss trial."""
    results = Results("live_recovery", "python -m bench.live_recovery", config=config)
    for way, values in figures.items():
        for key, value in values.items():
            title, unit = docs.ROWS[key]
            figure = results.figure(f"{docs.LABELS[way]}: {title}", unit)
            for k in range(3):
                figure.add(value + k, load=10.0 + k)
    results.extra["loss_trials"] = [{"way": "live"}]
    return results.to_json()


def test_the_heading_says_what_was_measured_with_the_medians() -> None:
    body = record(
        LOST,
        {
            "live": {
                "survivors_pause_seconds": 2.0,
                "steps_computed_twice": 0,
                "back_past_loss_step_seconds": 5.0,
            },
            "restart": {"back_past_loss_step_seconds": 90.0, "steps_computed_twice": 249},
            "torchrun": {"back_past_loss_step_seconds": 60.0, "steps_computed_twice": 249},
        },
    )
    head = docs.loss_head(body)
    assert "A worker lost for good at step 250, its replacement started 20 s later" in head
    assert "the survivors pause 3.00 s" in head, "the median of 2, 3, 4"
    assert "compute 1 step twice" in head
    assert "`recovery: restart` is back after 91.0 s with 250 steps computed twice" in head
    assert "plain torchrun after 61.0 s with 250 steps" in head


def test_the_crash_heading_says_whether_live_saved_anything() -> None:
    crash = {**LOST, "crash": True, "kill_at": 60}
    same = {w: {"back_past_loss_step_seconds": 2.0} for w in docs.WAYS}
    assert "live saves nothing per loss of this kind" in docs.loss_head(record(crash, same))
    slower = {**same, "restart": {"back_past_loss_step_seconds": 5.0}}
    assert "live saves 3.00 s per loss of this kind" in docs.loss_head(record(crash, slower))


def test_a_missing_figure_is_said_to_be_not_measured() -> None:
    body = record(LOST, {"live": {"steps_computed_twice": 0}})
    assert "after not measured" in docs.loss_head(body)
