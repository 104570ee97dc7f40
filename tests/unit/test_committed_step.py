"""The pod's word on whether its workers committed a step since its last failure: the
``COMMITTED_STEP`` line of its termination message (torchkube/elastic/termination.py), written
by the heartbeat's first beat, kept by the launcher's report and taken into its in-place
restart record. The operator reads it to tell a crash-looping replica group from one lost now
and then (tests/unit/test_failure_policy.py)."""

from pathlib import Path
from typing import Any

import pytest

from torchkube.api.contract import (
    COMMITTED_STEP,
    Env,
    InPlaceRestart,
    committed_step,
    committed_step_line,
    without_committed_step,
)
from torchkube.elastic import launch, termination, torchrun
from torchkube.elastic.heartbeat import Heartbeat


@pytest.fixture
def message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The worker's termination-message file, as ``torchkube run`` points a worker at it."""
    path = tmp_path / "worker-1.termination"
    monkeypatch.setenv(Env.TERMINATION_LOG, str(path))
    monkeypatch.delenv(Env.HEARTBEAT_DIR, raising=False)
    return path


@pytest.mark.parametrize(
    ("text", "step", "rest"),
    [
        ("", None, ""),
        ("exit code 1: boom\n", None, "exit code 1: boom\n"),
        (f"{COMMITTED_STEP} 41\n", 41, ""),
        (f"boom\n{COMMITTED_STEP} 7\n", 7, "boom\n"),
        (f"boom\n{COMMITTED_STEP} 7", 7, "boom\n"),
        ("torchkube: committed step soon\n", None, "torchkube: committed step soon\n"),
    ],
)
def test_the_committed_step_line_is_read_and_taken_out(
    text: str, step: int | None, rest: str
) -> None:
    assert committed_step(text) == step
    assert without_committed_step(text) == rest


def test_the_first_beat_of_local_rank_0_says_the_committed_step(
    message: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No heartbeat folder (the watchdog off): still said, once, at the first step."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    heartbeat = Heartbeat.from_env()
    assert not message.exists(), "nothing before a step is committed"
    heartbeat.beat(12)
    heartbeat.beat(13)
    assert message.read_text() == f"{committed_step_line(12)}\n"
    heartbeat.close()


def test_other_local_ranks_leave_the_message_alone(
    message: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    heartbeat = Heartbeat.from_env()
    heartbeat.beat(12)
    assert not message.exists()
    heartbeat.close()


def test_the_launchers_report_keeps_the_committed_step_under_it(message: Path) -> None:
    termination.mark_committed(5)
    launch._report("workers failed with exit code 1: RuntimeError: boom")
    text = message.read_text()
    assert text == f"workers failed with exit code 1: RuntimeError: boom\n{COMMITTED_STEP} 5\n"
    assert committed_step(text) == 5
    launch._report("x" * 10_000)
    kept = message.read_text()
    assert len(kept) <= termination.LIMIT and committed_step(kept) == 5, len(kept)


def test_a_report_without_a_committed_step_is_the_report_alone(message: Path) -> None:
    launch._report("workers failed with exit code 1: boom")
    assert message.read_text() == "workers failed with exit code 1: boom\n"
    assert committed_step(message.read_text()) is None


def test_an_in_place_restart_takes_the_rounds_committed_step_into_its_record(
    message: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record says the failed round committed from step 5; the next round starts with no
    line of its own, so a round that crashes before a step says so."""
    posted: list[InPlaceRestart] = []

    def post(_board: Any, record: InPlaceRestart) -> bool:
        posted.append(record)
        return True

    monkeypatch.setattr(launch.RestartBoard, "post", post)
    monkeypatch.setenv(Env.RENDEZVOUS_ENDPOINT, "")  # the launcher sets it: restored after
    monkeypatch.setattr(torchrun._Tracked, "restarted", None)
    launch._report_in_place_restarts(["--rdzv-endpoint=127.0.0.1:1", "--rdzv-id=job"])
    restarted = torchrun._Tracked.restarted
    assert restarted is not None
    termination.mark_committed(5)
    restarted(1, {})
    assert committed_step(message.read_text()) is None, "taken: the next round says its own"
    restarted(2, {})
    assert [(r.restart, r.committed_step) for r in posted] == [(1, 5), (2, None)]
