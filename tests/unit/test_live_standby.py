"""Who stands by under live recovery (torchkube/trainer/standby.py): a group beyond the
target waits while the quorum is whole or still forming, and fills a gap a loss left."""

from torchkube.trainer.standby import SHORT_GRACE_SECONDS, STALE_SECONDS, QuorumPost, stands_by

NOW = 1_000_000.0
TARGET = 2


def post(groups: int, peak: int, short_for: float | None = None, age: float = 0.5) -> QuorumPost:
    since = None if short_for is None else NOW - short_for
    return QuorumPost(groups, NOW - age, 0.05, False, peak, since)


def test_without_a_fresh_post_the_slots_below_the_target_train() -> None:
    for stale in (None, post(2, 2, age=STALE_SECONDS + 1)):
        assert [stands_by(slot, TARGET, stale, NOW) for slot in range(3)] == [False, False, True]


def test_while_the_job_starts_the_groups_join_by_slot_and_the_spare_waits() -> None:
    forming = post(1, 1, short_for=2)
    assert not stands_by(1, TARGET, forming, NOW), "a slot below the target is not a spare"
    assert stands_by(2, TARGET, forming, NOW), "the others are still starting: no gap yet"


def test_a_whole_quorum_makes_any_newcomer_a_spare() -> None:
    assert all(stands_by(slot, TARGET, post(2, 2), NOW) for slot in range(3))


def test_a_loss_is_a_gap_the_spare_fills_at_once() -> None:
    assert not stands_by(2, TARGET, post(1, 2, short_for=0.3), NOW)


def test_a_quorum_short_for_long_without_a_loss_is_a_gap_too() -> None:
    """A slot whose pod never starts (unschedulable): the spare takes its place."""
    assert not stands_by(2, TARGET, post(1, 1, short_for=SHORT_GRACE_SECONDS + 1), NOW)


def test_slow_steps_keep_a_post_fresh_for_three_of_them() -> None:
    slow = QuorumPost(2, NOW - 40, 20.0, False, 2, None)
    assert stands_by(0, TARGET, slow, NOW), "a 20 s step posts every 20 s"
