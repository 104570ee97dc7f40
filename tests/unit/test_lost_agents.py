"""When a re-forming round may start without torch's last call
(torchkube/elastic/lost_agents.py): only right after a round that lost an agent."""

import time
from datetime import UTC, datetime, timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from torchkube.elastic import liveness, lost_agents, torchrun
from torchkube.elastic.lost_agents import absent_from_reform

ME, PEER, LOST, NEW = (rdzv._NodeDesc(f"10.0.0.{i}", 1, 0) for i in (1, 2, 3, 4))
LAST_ROUND = frozenset({ME, PEER, LOST})


def _forming(round_: int, *participants: rdzv._NodeDesc) -> rdzv._RendezvousState:
    state = rdzv._RendezvousState()
    state.round, state.complete = round_, False
    state.participants = {node: 0 for node in participants}
    return state


def test_the_last_rounds_agents_missing_from_the_next_are_the_ones_to_judge() -> None:
    state = _forming(5, ME, PEER)
    assert absent_from_reform(state, ME, LAST_ROUND, 4, min_nodes=1) == [LOST]


def test_a_spare_standing_by_is_expected_in_the_round_that_re_forms() -> None:
    """A survivor that was training when a spare came knew nothing of it, and started the
    re-formed round alone at once while the spare was on its way off the redundancy list
    (tests/elastic/test_spares.py: "the world must stay 2")."""
    state = _forming(5, ME)
    state.redundancy_list = {NEW}
    assert sorted(absent_from_reform(state, ME, frozenset({ME, LOST}), 4, min_nodes=1)) == sorted(
        [LOST, NEW]
    )


def test_a_round_that_lost_nobody_keeps_the_last_call() -> None:
    growing = _forming(5, ME, PEER, LOST, NEW)
    assert absent_from_reform(growing, ME, LAST_ROUND, 4, min_nodes=1) == []


def test_a_first_round_keeps_the_last_call() -> None:
    assert absent_from_reform(_forming(0, ME), ME, frozenset(), None, min_nodes=1) == []


def test_only_the_round_right_after_the_known_one_and_only_from_inside_it() -> None:
    assert absent_from_reform(_forming(6, ME), ME, LAST_ROUND, 4, min_nodes=1) == []
    assert absent_from_reform(_forming(5, PEER), ME, LAST_ROUND, 4, min_nodes=1) == []
    complete = _forming(5, ME)
    complete.complete = True
    assert absent_from_reform(complete, ME, LAST_ROUND, 4, min_nodes=1) == []


def test_a_round_below_its_minimum_never_starts() -> None:
    assert absent_from_reform(_forming(5, ME), ME, LAST_ROUND, 4, min_nodes=2) == []


class _Rendezvous:
    """One agent's view of a real shared state: torch's state holder on a real TCPStore,
    its join op with torchkube's judgement installed, and the agents' counters."""

    def __init__(self, me: rdzv._NodeDesc, settings: rdzv.RendezvousSettings) -> None:
        self.server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        backend = C10dRendezvousBackend(self.server, settings.run_id)
        self.holder = rdzv._BackendRendezvousStateHolder(backend, settings)
        self.me, self.settings = me, settings
        torchrun.track()
        lost_agents.judge_as(me, self.server, self.holder, silence=0.0)

    def beat(self, *nodes: rdzv._NodeDesc) -> None:
        for node in nodes:
            self.server.add(liveness.beat_key(self.settings.run_id, node), 1)

    def join(self, state: rdzv._RendezvousState) -> rdzv._Action:
        self.holder._state = state
        ctx = rdzv._RendezvousContext(self.me, self.holder.state, self.settings)
        return rdzv._RendezvousJoinOp()(ctx, time.monotonic() + 60)


def _settings(min_nodes: int, max_nodes: int) -> rdzv.RendezvousSettings:
    return rdzv.RendezvousSettings(
        "job",
        min_nodes,
        max_nodes,
        rdzv.RendezvousTimeout(last_call=timedelta(seconds=30)),
        keep_alive_interval=timedelta(seconds=2),
        keep_alive_max_attempt=3,
    )


def _complete(
    round_: int, participants: list[rdzv._NodeDesc], **lists: set
) -> rdzv._RendezvousState:
    state = _forming(round_, *participants)
    state.complete = True
    state.participants = {node: rank for rank, node in enumerate(participants)}
    state.last_heartbeats = {node: datetime.now(UTC) for node in participants}
    state.wait_list = lists.get("wait", set())
    state.redundancy_list = lists.get("spares", set())
    return state


def test_a_spare_never_drops_a_participant_of_a_whole_round_that_trains() -> None:
    """Beats delayed past the silence (lost packets, a stalled node) must not restart a
    healthy job: torch's expiry tolerates seconds there."""
    rendezvous = _Rendezvous(NEW, _settings(2, 2))
    rendezvous.beat(ME, PEER)
    state = _complete(3, [ME, PEER], spares={NEW})
    for _ in range(3):  # the counters stand still through every look
        rendezvous.join(state)
    assert set(state.participants) == {ME, PEER}


def test_a_survivor_waiting_drops_the_silent_participant_and_the_round_starts_again() -> None:
    rendezvous = _Rendezvous(ME, _settings(1, 3))
    rendezvous.beat(PEER, LOST)
    state = _complete(3, [PEER, LOST], wait={ME})  # ME left the broken round, PEER not yet
    assert rendezvous.join(state) != rdzv._Action.KEEP_ALIVE, "first look: nobody judged"
    rendezvous.beat(PEER)
    assert rendezvous.join(state) == rdzv._Action.KEEP_ALIVE, "then written, LOST dropped"
    assert set(rendezvous.holder.state.participants) == {PEER}


def test_a_round_of_three_that_lost_one_starts_once_the_other_survivor_is_in() -> None:
    """Agents leave a broken round one by one; what each saw of it adds up, so the agent
    that left first and dropped the lost one still expects the second survivor, and knows
    the lost one is gone."""
    rendezvous = _Rendezvous(ME, _settings(1, 3))
    rendezvous.beat(PEER, LOST)
    rendezvous.join(_complete(3, [PEER, LOST], wait={ME}))
    rendezvous.beat(PEER)
    assert rendezvous.join(_complete(3, [PEER, LOST], wait={ME})) == rdzv._Action.KEEP_ALIVE
    rendezvous.beat(PEER)
    rendezvous.join(_complete(3, [PEER], wait={ME}))  # the state as written: LOST dropped
    alone = _forming(4, ME)
    alone.wait_list = {PEER}
    rendezvous.beat(PEER)
    assert rendezvous.join(alone) != rdzv._Action.MARK_RENDEZVOUS_COMPLETE, "PEER is coming"
    rendezvous.beat(PEER)
    both = _forming(4, ME, PEER)
    assert rendezvous.join(both) == rdzv._Action.MARK_RENDEZVOUS_COMPLETE, "LOST is gone"
