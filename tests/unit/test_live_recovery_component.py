"""Live recovery: the checkpoint folder belongs to the writer group alone. Every group of a
job that starts from the volume reads the newest checkpoint; if the group that does not
write also claimed the folder while reading, it could do so after the writer (on a loaded
machine it is a step behind), and the writer's own next save would be fenced off.

And a step whose commit vote a lost group broke is finished among the survivors with the
gradients already computed."""

import logging
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torchft.checkpointing import HTTPTransport

from torchkube.api.contract import LiveProgress
from torchkube.elastic.heartbeat import Heartbeat
from torchkube.trainer import cross_group, live
from torchkube.trainer.checkpoint import TrainState
from torchkube.trainer.live import (
    REDUCTION_QUORUMS,
    AdvertisedTransport,
    LiveRecovery,
    QuorumMembers,
    adds_gradients,
    quorum_key,
)
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
    recovery.info = SimpleNamespace(is_main=True, data_rank=0, data_size=1, world_size=1)
    recovery.progress = SimpleNamespace(enabled=False, update=lambda **_: None)
    recovery.live_env = SimpleNamespace(target=None)
    recovery.replica_id, recovery.writer, recovery.split = f"job-{rank}", False, None
    recovery.members = SimpleNamespace(slots=[0, 1], max_step=0)
    recovery.transport = SimpleNamespace(finishing=False, source_finishing=False)
    recovery.record = LiveProgress(replica_groups=0, grad_accum_steps=1)
    recovery._quorum_taken, recovery._attempt_began, recovery._start = False, None, None
    recovery._votes_lost, recovery._adds_gradients, recovery._step_loss = 0, True, None
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
    recovery.members.max_step = 64
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
    recovery.members.max_step = 64
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
    answer = SimpleNamespace(
        quorum_id=4,
        replica_ids=["job-12:5f0c", "job-0:9a1b", "job-3:77de"],
        max_step=7,
    )
    client = SimpleNamespace(_quorum=lambda **_: answer, should_commit=lambda: True)
    manager = SimpleNamespace(_client=client)
    members = QuorumMembers.watch(manager)
    assert manager._client is members and members.slots == []
    found = manager._client._quorum(step=4)
    assert found.replica_ids == answer.replica_ids and found.quorum_id == quorum_key(answer)
    assert members.slots == [0, 3, 12] and members.max_step == 7
    assert manager._client.should_commit() is True  # everything else reaches torchft's client


def answer(quorum_id: int, groups: int, heal: bool = False) -> SimpleNamespace:
    ids = [f"job-{slot}:{slot:04x}" for slot in range(groups)]
    return SimpleNamespace(quorum_id=quorum_id, replica_ids=ids, max_step=9, heal=heal)


class Lighthouse:
    """torchft's client through a Lighthouse that is lost and started afresh: the new one
    answers the first group to ask with a quorum of its own (the others' heartbeats are not
    in yet), then, asked again, with the quorum of every group."""

    def __init__(self, *answers: Any) -> None:
        self.answers, self.asked = list(answers), 0

    def _quorum(self, **_: Any) -> Any:
        self.asked += 1
        found = self.answers.pop(0)
        if isinstance(found, Exception):
            raise found
        return found


@pytest.fixture
def no_wait_for_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "RESTARTED_LIGHTHOUSE_WAIT", timedelta(0))


def test_a_group_the_new_lighthouse_answers_alone_asks_again(no_wait_for_heartbeats: None) -> None:
    """Measured before: a Lighthouse killed mid-run came back in a second, answered the first
    of eight groups with a quorum of one, and that group trained a step alone — eight
    groups' micro-batches, 32 s — while the seven others waited for it. Asked again at once,
    it got the same quorum of one: the others' heartbeats were not in yet."""
    lone = answer(1, 1)
    lighthouse = Lighthouse(answer(7, 8), RuntimeError("tcp connect error"), lone, lone)
    lighthouse.answers.append(answer(2, 8))
    members = QuorumMembers.watch(SimpleNamespace(_client=lighthouse))
    assert len(members._quorum(step=3).replica_ids) == 8
    with pytest.raises(RuntimeError):
        members._quorum(step=4)
    assert len(members._quorum(step=4).replica_ids) == 8 and lighthouse.asked == 5
    assert members.slots == list(range(8))


@pytest.fixture
def quick_first_quorum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "FIRST_QUORUM_ASK_EVERY", timedelta(seconds=0.01))
    monkeypatch.setattr(live, "FIRST_QUORUM_WAIT", timedelta(seconds=0.2))


def test_a_jobs_first_quorum_waits_for_the_groups_it_trains(quick_first_quorum: None) -> None:
    """Measured before: in every run of eight groups, the first to start formed the first
    quorum alone and trained step 1 with all 24 micro-batches (32 s) while the seven others,
    started a moment later, waited for it."""
    lighthouse = Lighthouse(answer(1, 1), answer(2, 3), answer(3, 8), answer(4, 8))
    members = QuorumMembers.watch(SimpleNamespace(_client=lighthouse), target=8)
    assert len(members._quorum().replica_ids) == 8 and lighthouse.asked == 3
    assert len(members._quorum().replica_ids) == 8 and lighthouse.asked == 4


def test_only_a_starting_jobs_first_quorum_waits_and_not_past_its_last_call(
    quick_first_quorum: None,
) -> None:
    """A replacement joining a job that trains (a peer ahead: it heals) takes the quorum at
    once; a job whose missing groups never come starts without them after the wait."""
    joining = Lighthouse(answer(5, 7, heal=True))
    members = QuorumMembers.watch(SimpleNamespace(_client=joining), target=8)
    assert len(members._quorum().replica_ids) == 7 and joining.asked == 1
    lone = Lighthouse(*[answer(1, 1)] * 1000)
    members = QuorumMembers.watch(SimpleNamespace(_client=lone), target=8)
    began = time.monotonic()
    assert len(members._quorum().replica_ids) == 1
    assert 0.2 <= time.monotonic() - began < 2 and lone.asked > 1


def test_a_restarted_lighthouse_whose_id_is_the_same_still_gets_a_new_process_group(
    no_wait_for_heartbeats: None,
) -> None:
    """Measured before: a Lighthouse started afresh answered six of eight groups with quorum id
    1 — the id their last quorum of eight had under the Lighthouse before it — so torchft kept
    the group of eight, and the six's reduction waited for the two others until it timed out
    (30 s). The id torchft sees changes with the members, and only with them or the id."""
    eight, six = answer(1, 8), answer(1, 6)
    six.replica_ids = eight.replica_ids[:6]
    asks = live.RESTARTED_LIGHTHOUSE_ASKS
    lighthouse = Lighthouse(eight, answer(1, 8), *[six] * (1 + asks))
    members = QuorumMembers.watch(SimpleNamespace(_client=lighthouse))
    first = members._quorum().quorum_id
    assert members._quorum().quorum_id == first  # the same quorum: the same group
    assert members._quorum().quorum_id != first and not lighthouse.answers
    assert members.slots == list(range(6))
    again = answer(1, 8)
    again.replica_ids = list(reversed(again.replica_ids))
    assert quorum_key(again) == first  # every member computes the same id


def test_a_smaller_quorum_is_taken_from_the_same_lighthouse_or_after_asking_again(
    no_wait_for_heartbeats: None,
) -> None:
    """Groups lost for good: the answers asked again are the small one, and it is taken."""
    small = [answer(1, 2)] * (1 + live.RESTARTED_LIGHTHOUSE_ASKS)
    lighthouse = Lighthouse(answer(7, 8), answer(8, 3), *small)
    members = QuorumMembers.watch(SimpleNamespace(_client=lighthouse))
    assert len(members._quorum().replica_ids) == 8
    assert len(members._quorum().replica_ids) == 3  # the same Lighthouse: groups lost
    assert len(members._quorum().replica_ids) == 2 and not lighthouse.answers


class Votes:
    """A Manager through a step whose group is lost during the reduction: the reduction
    scribbles on its buffer and the vote is lost ``lost`` times; each quorum after one has a
    group fewer, and its reduction sums with that quorum's other survivor's message (``peer``:
    gradients of 2.0, a loss of 4.0)."""

    def __init__(self, lost: int, ahead: bool = False, peer_computed: bool = True) -> None:
        self.lost, self.quorums, self.groups = lost, 0, 3
        self.step, self.ahead, self.peer_computed = 5, ahead, peer_computed
        self.sent: list[torch.Tensor] = []
        self.errors: list[Exception] = []

    def report_error(self, error: Exception) -> None:
        self.errors.append(error)  # torchft: this group's next vote is lost
        self.lost = max(self.lost, 1)

    def start_quorum(self) -> None:
        self.quorums += 1
        self.groups = 2
        if self.ahead:  # a peer committed the step: this group copies its state
            self.step += 1

    def allreduce(self, tensor: Any, reduce_op: Any) -> Any:
        assert reduce_op == dist.ReduceOp.SUM
        self.sent.append(tensor.clone())
        if self.lost:
            tensor.add_(1000.0)
        elif self.peer_computed:
            tensor.add_(peer_message(tensor))
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


def linear() -> nn.Module:
    return nn.Linear(2, 1)


def peer_message(like: torch.Tensor) -> torch.Tensor:
    """Another group's message for :func:`linear`'s parameters: gradients of 2.0, loss 4.0."""
    shapes = [p.detach() for p in linear().parameters()]
    message = cross_group.outgoing(
        shapes, [torch.full_like(p, 2.0) for p in shapes], torch.tensor(4.0), contributes=True
    )
    assert message.shape == like.shape
    return message


def recovery_reducing(lost: int, ahead: bool = False) -> tuple[Any, nn.Module]:
    recovery = recovery_at_start(0)
    recovery.manager = Votes(lost, ahead)
    recovery.pg, recovery.ckpt = None, Folder()
    recovery.live.state.step = 5
    model = linear()
    model(torch.ones(3, 2)).sum().backward()
    return recovery, model


def test_a_lost_vote_is_taken_again_after_the_same_reduction_among_the_survivors() -> None:
    """The step's gradients are not computed again: the next quorum reduces the ones this
    group computed (not the half-summed buffer the broken reduction left) and commits."""
    recovery, model = recovery_reducing(lost=1)
    own = [p.grad.clone() for p in model.parameters()]
    recovery.reduce(model, torch.tensor(2.0))
    assert recovery.commit() is True
    assert recovery.manager.quorums == 1
    for param, mine in zip(model.parameters(), own, strict=True):
        assert param.grad is not None and param.grad.allclose((mine + 2.0) / 2)
    assert float(recovery.step_loss(torch.tensor(2.0))) == 3.0  # the two groups' mean
    assert recovery.record.discarded_steps == 1
    assert recovery.record.steps_finished_among_survivors == 1
    assert recovery.record.replica_groups == 2


def test_a_step_whose_votes_are_lost_in_every_quorum_tried_is_computed_again() -> None:
    recovery, model = recovery_reducing(lost=REDUCTION_QUORUMS)
    recovery.reduce(model, torch.tensor(2.0))
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
    recovery.reduce(model, torch.tensor(2.0))
    with caplog.at_level(logging.INFO, logger="torchkube.trainer"):
        assert recovery.commit() is False
    assert "a peer committed step" in caplog.text and "afresh" in caplog.text
    assert recovery.manager.quorums == 1
    assert recovery.record.steps_finished_among_survivors == 0
    recovery.begin_step()
    assert recovery.manager.quorums == 1


def test_only_a_group_that_joined_a_quorum_finishing_a_broken_step_adds_no_gradients() -> None:
    assert adds_gradients(copied_from_a_group_finishing=True, own_votes_lost=0) is False
    assert adds_gradients(copied_from_a_group_finishing=False, own_votes_lost=0) is True
    # a survivor that copied a peer which committed the step computes the next one afresh
    assert adds_gradients(copied_from_a_group_finishing=True, own_votes_lost=1) is True


def test_a_group_tells_the_group_that_copies_from_it_that_it_is_finishing_a_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchft's answer to a joiner does not say which groups lost their vote; the metadata
    the joiner reads from the peer it copies from does, and the copy goes to the same URL."""
    survivor = AdvertisedTransport("127.0.0.1", timedelta(seconds=5))
    joiner = AdvertisedTransport("127.0.0.1", timedelta(seconds=5))
    fetched: list[str] = []
    monkeypatch.setattr(
        HTTPTransport, "recv_checkpoint", lambda self, rank, md, step, t: fetched.append(md)
    )
    try:
        assert survivor.metadata() == survivor.address()
        survivor.finishing = True
        joiner.recv_checkpoint(0, survivor.metadata(), 12, timedelta(seconds=1))
        assert joiner.source_finishing and fetched == [survivor.address()]
        survivor.finishing = False
        joiner.recv_checkpoint(0, survivor.metadata(), 13, timedelta(seconds=1))
        assert not joiner.source_finishing and fetched[-1] == survivor.address()
    finally:
        survivor.shutdown()
        joiner.shutdown()


def test_a_joiner_in_the_quorum_finishing_a_broken_step_computes_nothing_and_takes_the_update(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The survivors of a group lost mid-step hold that step's gradients; a replacement that
    joins the quorum they finish it in copies the state and would compute the step before the
    reduction — a whole step the survivors wait — for the lost group's share of the data, and
    the average would count it. It computes nothing, sends zeros counted as no group, and takes
    the survivors' update, their mean loss with it."""
    recovery = recovery_at_start(0)
    recovery.manager = Votes(lost=0)
    transport = SimpleNamespace(finishing=False, source_finishing=False)
    recovery.transport = transport

    def copies_from_a_survivor() -> None:
        transport.source_finishing = True  # what the survivor's metadata said

    recovery.manager.start_quorum = copies_from_a_survivor
    recovery.pg, recovery.ckpt, recovery._start = None, Folder(), None
    recovery.live.copied_step, recovery.live.state.step = 5, 5
    with caplog.at_level(logging.INFO, logger="torchkube.trainer"):
        recovery.join(Folder(), lambda: False)
    assert transport.finishing is False  # it lost no vote: a group copying from it computes
    assert recovery.computes() is False
    assert "finishing step 6, which a lost group broke" in caplog.text
    model = linear()  # a joiner's parameters have no gradients: it computed none
    recovery.reduce(model, torch.zeros(()))
    assert not recovery.manager.sent[0].any(), "a joiner's message must add nothing"
    assert recovery.commit() is True
    for param in model.parameters():
        assert param.grad is not None and param.grad.eq(2.0).all()  # the survivor's, ÷ 1
    assert float(recovery.step_loss(torch.zeros(()))) == 4.0
    assert recovery.computes() is True  # its next step is a step like any other


def saying_finishing(lost: int) -> tuple[Any, nn.Module, list[bool]]:
    """A group through a step whose vote is lost ``lost`` times, and what it says before each
    quorum it takes: whether it is finishing a step (its transfer metadata)."""
    recovery, model = recovery_reducing(lost)
    said: list[bool] = []
    start = recovery.manager.start_quorum

    def start_quorum() -> None:
        said.append(recovery.transport.finishing)
        start()

    recovery.manager.start_quorum = start_quorum
    return recovery, model, said


def test_a_survivor_says_it_is_finishing_in_the_quorum_after_its_lost_vote() -> None:
    recovery, model, said = saying_finishing(lost=1)
    recovery.reduce(model, torch.tensor(2.0))
    assert recovery.commit() is True and said == [True]


def test_the_average_counts_the_groups_that_contributed() -> None:
    shapes = [torch.zeros(2), torch.zeros(3)]
    one = cross_group.outgoing(shapes, [torch.ones(2), None], torch.tensor(1.0), True)
    two = cross_group.outgoing(shapes, [torch.full((2,), 3.0), None], torch.tensor(3.0), True)
    idle = cross_group.outgoing(shapes, [torch.full((2,), 9.0), None], torch.tensor(9.0), False)
    total = one + two + idle
    assert cross_group.contributors(total) == 2
    update = cross_group.average(total, shapes)
    assert float(update.loss) == 2.0
    assert update.grads[0] is not None and update.grads[0].eq(2.0).all()
    assert update.grads[1] is None  # no contributor had a gradient for it


def test_every_group_sends_the_same_element_type_whatever_gradients_it_holds() -> None:
    """A joiner holds no gradients; a survivor's are the parameters' type (bf16 here): two
    element types would not sum."""
    shapes = [torch.zeros(2, dtype=torch.bfloat16)]
    grads = [torch.ones(2, dtype=torch.bfloat16)]
    survivor = cross_group.outgoing(shapes, grads, torch.ones(()), True)
    joiner = cross_group.outgoing(shapes, [None], torch.zeros(()), False)
    assert survivor.dtype == joiner.dtype == torch.bfloat16 and survivor.shape == joiner.shape


def test_a_step_no_group_computed_is_not_committed() -> None:
    """A joiner whose survivors were lost before their reduction is alone with nothing to
    add: a commit would step the schedule on no gradients and skip a global batch."""
    recovery, model = recovery_reducing(lost=0)
    recovery.manager.peer_computed, recovery._adds_gradients = False, False
    before = [p.detach().clone() for p in model.parameters()]
    recovery.reduce(model, torch.zeros(()))
    assert recovery.commit() is False
    assert len(recovery.manager.errors) == REDUCTION_QUORUMS
    for param, was in zip(model.parameters(), before, strict=True):
        assert param.detach().equal(was)


def test_a_group_computing_afresh_does_not_say_it_is_finishing() -> None:
    """After its votes were lost in every quorum tried, a group computes the step again: a
    joiner copying from it then must compute too."""
    recovery, model, said = saying_finishing(lost=REDUCTION_QUORUMS)
    recovery.reduce(model, torch.tensor(2.0))
    assert recovery.commit() is False
    recovery.begin_step()
    assert said == [True] * (REDUCTION_QUORUMS - 1) + [False]
    assert recovery.computes() is True
