"""Sustained chaos for the live-recovery benchmark: Poisson kills and stretched steps."""

import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from torchkube.local.display import LIGHTHOUSE
from torchkube.local.runner import Chaos, kill_candidates
from torchkube.trainer.chaos import ChaosHold


def kill_times(chaos: Chaos, until: float, tick: float = 0.05) -> list[float]:
    kills, last, now = [], 0.0, 0.0
    while now < until:
        now += tick
        if chaos.timed_kill_due(now, last, 0.0):
            kills.append(now)
            last = now
    return kills


def test_poisson_gaps_average_the_mean_and_vary_and_a_seed_repeats_them() -> None:
    kills = kill_times(Chaos(every_seconds=2.0, poisson_seed=7), until=2000.0)
    gaps = [b - a for a, b in zip([0.0, *kills], kills, strict=False)]
    assert 1.8 < statistics.mean(gaps) < 2.2, statistics.mean(gaps)
    assert statistics.stdev(gaps) > 1.5  # exponential: the deviation is the mean
    assert kill_times(Chaos(every_seconds=2.0, poisson_seed=7), until=2000.0) == kills
    assert kill_times(Chaos(every_seconds=2.0, poisson_seed=8), until=2000.0) != kills


def test_without_a_seed_the_kills_keep_their_fixed_interval() -> None:
    kills = kill_times(Chaos(every_seconds=2.0), until=10.0, tick=0.5)
    assert kills == [2.0, 4.0, 6.0, 8.0, 10.0]


def test_victims_are_drawn_among_the_alive_and_the_lighthouse_takes_its_share() -> None:
    chaos = Chaos(every_seconds=1.0, poisson_seed=3, lighthouse_share=0.1)
    drawn = [chaos.poisson_victim([0, 2, 3], lighthouse=True) for _ in range(5000)]
    assert set(drawn) == {0, 2, 3, LIGHTHOUSE}
    assert 0.08 < drawn.count(LIGHTHOUSE) / len(drawn) < 0.12
    assert LIGHTHOUSE not in {chaos.poisson_victim([1], lighthouse=False) for _ in range(200)}
    assert chaos.poisson_victim([], lighthouse=False) is None


def test_a_stretched_step_lasts_in_proportion_to_its_sequences_and_a_longer_one_is_kept() -> None:
    hold = ChaosHold(frozenset(), compute_seconds=1.0)
    began = time.monotonic()
    with hold.computing(sequences=2, micro_batch_size=4):  # half a micro-batch: half as long
        pass
    assert 0.5 <= time.monotonic() - began < 0.9
    began = time.monotonic()
    with hold.computing(sequences=6, micro_batch_size=4):
        time.sleep(1.7)
    assert 1.7 <= time.monotonic() - began < 2.1


def test_killing_the_lighthouse_of_a_restart_mode_job_is_refused_by_name(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from torchkube.local.cli import run_command

    example = Path(__file__).resolve().parents[2] / "examples" / "trainingjob.yaml"
    result = CliRunner().invoke(
        run_command,
        [str(example), "--workdir", str(tmp_path), "--chaos-lighthouse-at-step", "5"],
    )
    assert result.exit_code != 0
    assert "--chaos-lighthouse-at-step needs failurePolicy.recovery: live" in result.output
    assert not (tmp_path / "logs").exists()  # refused before anything started


def test_a_replacement_started_after_the_last_report_is_no_candidate_though_its_slot_is() -> None:
    """The last quorum's slots come from the writer's last progress report, which is stale
    after a loss until a step commits: the slot's replacement, still importing torch, is not
    the group that trained there, and is not killed as one."""
    reported = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    before, after = reported - timedelta(seconds=30), reported + timedelta(seconds=2)
    alive = {0: before, 1: after, 2: before, 4: before}
    assert kill_candidates(alive, slots=[0, 1, 2, 3], reported=reported) == [0, 2]
    assert kill_candidates(alive, slots=None, reported=None) == [0, 1, 2, 4]
    assert kill_candidates(alive, slots=[], reported=reported) == [0, 1, 2, 4]
