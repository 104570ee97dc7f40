"""torch's rendezvous decisions for an agent that arrives while a round re-forms (a replaced
pod beside a spare): once the round is full again it must stand by as a spare, never keep
the others restarting (torchkube/elastic/torchrun.py)."""

import threading
import time
from datetime import timedelta
from typing import Any

from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

from torchkube.elastic import torchrun

SETTINGS = rdzv.RendezvousSettings(
    run_id="job",
    min_nodes=2,
    max_nodes=2,
    timeout=rdzv.RendezvousTimeout(),
    keep_alive_interval=timedelta(seconds=2),
    keep_alive_max_attempt=3,
)
A, B, LATE = (rdzv._NodeDesc(f"10.0.0.{i}", 1, 0) for i in (1, 2, 3))


def _full_round_with_late_agent_waiting() -> Any:
    state = rdzv._RendezvousState()
    state.round, state.complete = 4, True
    state.participants = {A: 0, B: 1}
    state.wait_list = {LATE}
    return state


class _Holder:
    def __init__(self, state: Any) -> None:
        self.state = state

    def sync(self) -> None:
        pass


class _Handler:
    """What ``num_nodes_waiting`` reads of a DynamicRendezvousHandler."""

    def __init__(self, state: Any) -> None:
        self._heartbeat_lock = threading.Lock()
        self._state_holder = _Holder(state)
        self._settings = SETTINGS


def test_a_wait_listed_agent_of_a_full_round_moves_to_the_spares() -> None:
    torchrun.track()
    state = _full_round_with_late_agent_waiting()
    join = rdzv._RendezvousJoinOp()
    ctx = rdzv._RendezvousContext(LATE, state, SETTINGS)
    assert join(ctx, time.monotonic() + 60) == rdzv._Action.REMOVE_FROM_WAIT_LIST
    state.wait_list.discard(LATE)
    assert join(ctx, time.monotonic() + 60) == rdzv._Action.ADD_TO_REDUNDANCY_LIST


def test_a_full_round_does_not_count_it_as_waiting_but_a_round_with_room_does() -> None:
    torchrun.track()
    state = _full_round_with_late_agent_waiting()
    waiting = rdzv.DynamicRendezvousHandler.num_nodes_waiting
    assert waiting(_Handler(state)) == 0  # type: ignore[arg-type]
    del state.participants[B]  # its pod deleted: room for the waiting agent
    assert waiting(_Handler(state)) == 1  # type: ignore[arg-type]
