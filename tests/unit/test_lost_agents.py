"""When a re-forming round may start without torch's last call
(torchkube/elastic/lost_agents.py): only right after a round that lost an agent."""

from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

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
