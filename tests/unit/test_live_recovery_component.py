"""Live recovery: the checkpoint folder belongs to the writer group alone. Every group of a
job that starts from the volume reads the newest checkpoint; if the group that does not
write also claimed the folder while reading, it could do so after the writer (on a loaded
machine it is a step behind), and the writer's own next save would be fenced off.

And a step whose commit vote a lost group broke is finished among the survivors with the
gradients already computed."""

import logging
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from torchkube.api.contract import LiveProgress
from torchkube.elastic.heartbeat import Heartbeat
from torchkube.trainer.checkpoint import TrainState
from torchkube.trainer.live import REDUCTION_QUORUMS, LiveRecovery, QuorumMembers
from torchkube.trainer.recovery import Place


class Folder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def claim(self) -> None:
        self.calls.append("claim")

    def load(self) -> bool:
        self.calls.append("read")
        return False


def recovery_at_start(rank: int) -> Any:
    """A group at its first quorum (step 0, no peer ahead), its place in the quorum ``rank``."""
    recovery: Any = LiveRecovery.__new__(LiveRecovery)
    recovery.manager = SimpleNamespace(
        start_quorum=lambda: None,
        current_step=lambda: 0,
        num_participants=lambda: 2,
        participating_rank=lambda: rank,
    )
    recovery.live = SimpleNamespace(copied_step=None, state=TrainState())
    recovery.spec = SimpleNamespace(global_batch_size=4, micro_batch_size=2)
    recovery.info = SimpleNamespace(is_main=True, data_rank=0, data_size=1)
    recovery.progress = SimpleNamespace(enabled=False, update=lambda **_: None)
    recovery.live_env = SimpleNamespace(target=None)
    recovery.replica_id, recovery.writer, recovery.split = f"job-{rank}", False, None
    recovery.members = SimpleNamespace(slots=[0, 1], max_step=0)
    recovery.record = LiveProgress(replica_groups=0, grad_accum_steps=1)
    recovery._quorum_taken, recovery._attempt_began, recovery._start = False, None, None
    recovery.heartbeat = Heartbeat(None)  # no launcher: a pause is a no-op
    return recovery


def test_only_the_writer_group_claims_the_folder_when_a_job_starts_from_the_volume() -> None:
    for rank, calls in ((1, ["read"]), (0, ["read", "claim"])):
        recovery, folder = recovery_at_start(rank), Folder()
        recovery.join(folder, restore=folder.load)
        assert folder.calls == calls, f"quorum rank {rank}"
        assert recovery.place() == Place(data_rank=rank, data_size=2, writer=rank == 0)
        assert recovery.begin_step() == recovery.place()  # the first step has its quorum
        assert folder.calls == calls, f"quorum rank {rank}"


def test_a_joiner_whose_copy_broke_off_does_not_take_the_checkpoint() -> None:
    """Its peer lost while serving the copy (tests/local/test_live_phase_kills.py), the group
    is still at step 0 with nothing copied — but the quorum is at step 64, not a job that
    starts: reading the checkpoint of step 60 would say "no live peer ahead" and train from
    there. It keeps what it has, its step is not committed, and it copies at the next
    quorum."""
    recovery, folder = recovery_at_start(1), Folder()
    recovery.members = SimpleNamespace(slots=[0, 1], max_step=64)
    recovery.join(folder, restore=folder.load)
    assert folder.calls == []
    recovery, folder = recovery_at_start(1), Folder()
    recovery.join(folder, restore=folder.load)  # max_step 0: every group starts
    assert folder.calls == ["read"]


def test_a_joiner_whose_copy_broke_off_starts_when_no_group_is_ahead_any_more() -> None:
    """Two groups, the one serving the copy lost: the joiner is then alone, at step 0, with
    not even its starting weights; at the first quorum of groups all at step 0 it takes them
    (the checkpoint, else the weights or the initialisation), as a job that starts does —
    once, and not while a peer is still ahead."""
    recovery, folder = recovery_at_start(1), Folder()
    recovery.members = SimpleNamespace(slots=[0, 1], max_step=64)
    recovery.join(folder, restore=folder.load)
    recovery.begin_step()  # the first step: join's own quorum
    recovery.begin_step()  # a peer still ahead: it copies, or tries again
    assert folder.calls == []
    recovery.members.max_step = 0
    recovery.begin_step()
    recovery.begin_step()
    assert folder.calls == ["read"]


def test_the_quorums_members_are_read_from_the_lighthouses_answer_by_slot() -> None:
    """torchft keeps only the quorum's size; the progress record names its groups' slots, so
    the operator can tell a standby spare (a running pod outside them) from a training group."""
    answer = SimpleNamespace(replica_ids=["job-12:5f0c", "job-0:9a1b", "job-3:77de"], max_step=7)
    client = SimpleNamespace(_quorum=lambda **_: answer, should_commit=lambda: True)
    manager = SimpleNamespace(_client=client)
    members = QuorumMembers.watch(manager)
    assert manager._client is members and members.slots == []
    assert manager._client._quorum(step=4) is answer
    assert members.slots == [0, 3, 12] and members.max_step == 7
    assert manager._client.should_commit() is True  # everything else reaches torchft's client


class Votes:
    """A Manager through a step whose group is lost during the reduction: the reduction
    scribbles on its buffer and the vote is lost ``lost`` times; each quorum after one has a
    group fewer, and its reduction averages with that quorum's other survivor."""

    def __init__(self, lost: int, ahead: bool = False) -> None:
        self.lost, self.quorums, self.groups = lost, 0, 3
        self.step, self.ahead = 5, ahead

    def start_quorum(self) -> None:
        self.quorums += 1
        self.groups = 2
        if self.ahead:  # a peer committed the step: this group copies its state
            self.step += 1

    def allreduce(self, tensor: Any) -> Any:
        if self.lost:
            tensor.add_(1000.0)
        else:
            tensor.add_(2.0).div_(2)
        return SimpleNamespace(wait=lambda: None)

    def should_commit(self) -> bool:
        if self.lost:
            self.lost -= 1
            return False
        return True

    def num_participants(self) -> int:
        return self.groups

    def participating_rank(self) -> int:
        return 0

    def current_step(self) -> int:
        return self.step


def recovery_reducing(lost: int, ahead: bool = False) -> tuple[Any, nn.Module]:
    recovery = recovery_at_start(0)
    recovery.manager = Votes(lost, ahead)
    recovery.pg, recovery.ckpt = None, Folder()
    recovery.live.state.step = 5
    model = nn.Linear(2, 1)
    model(torch.ones(3, 2)).sum().backward()
    return recovery, model


def test_a_lost_vote_is_taken_again_after_the_same_reduction_among_the_survivors() -> None:
    """The step's gradients are not computed again: the next quorum reduces the ones this
    group computed (not the half-summed buffer the broken reduction left) and commits."""
    recovery, model = recovery_reducing(lost=1)
    own = [p.grad.clone() for p in model.parameters()]
    recovery.reduce(model)
    assert recovery.commit() is True
    assert recovery.manager.quorums == 1
    for param, mine in zip(model.parameters(), own, strict=True):
        assert param.grad is not None and param.grad.allclose((mine + 2.0) / 2)
    assert recovery.record.discarded_steps == 1
    assert recovery.record.steps_finished_among_survivors == 1
    assert recovery.record.replica_groups == 2


def test_a_step_whose_votes_are_lost_in_every_quorum_tried_is_computed_again() -> None:
    recovery, model = recovery_reducing(lost=REDUCTION_QUORUMS)
    recovery.reduce(model)
    assert recovery.commit() is False
    assert recovery.manager.quorums == REDUCTION_QUORUMS - 1
    assert recovery.record.discarded_steps == REDUCTION_QUORUMS
    assert recovery.record.steps_finished_among_survivors == 0


def test_a_group_whose_next_quorum_is_ahead_computes_that_quorums_step_afresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A peer whose reduction had finished committed the step; this group copies its state in
    the next quorum, so the gradients it holds belong to a step it has passed: no reduction of
    them, and the step it computes next is that quorum's, with no quorum taken again — and
    the log says so, not only that the reduction would be done again."""
    recovery, model = recovery_reducing(lost=1, ahead=True)
    recovery.reduce(model)
    with caplog.at_level(logging.INFO, logger="torchkube.trainer"):
        assert recovery.commit() is False
    assert "a peer committed step" in caplog.text and "afresh" in caplog.text
    assert recovery.manager.quorums == 1
    assert recovery.record.steps_finished_among_survivors == 0
    recovery.begin_step()
    assert recovery.manager.quorums == 1
