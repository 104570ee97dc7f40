"""How often a waiting agent reads the rendezvous state (torchkube/elastic/torchrun.py): every
hand-over of a re-forming round waits for a poll, so torch's one-second poll cost a recovery
seconds. Two real rendezvous handlers on a loopback TCPStore, as two launchers would be."""

import inspect
import threading
import time
from typing import Any

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters, utils
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

from torchkube.elastic import torchrun


def test_the_poll_is_short_for_small_rounds_and_torchs_for_large_ones() -> None:
    assert torchrun.poll_seconds(2) == torchrun.FASTEST_POLL_SECONDS
    assert torchrun.poll_seconds(64) == pytest.approx(0.25)
    assert torchrun.poll_seconds(256) == torchrun.poll_seconds(4096) == 1.0


def _handler(server: TCPStore, run_id: str = "job", nodes: int = 2) -> Any:
    """An agent's handler with its own connection to the store, as each launcher has, in a
    round of ``nodes`` agents (one: each ``next_rendezvous`` forms the next round alone)."""
    store = TCPStore("127.0.0.1", server.port, is_master=False)
    params = RendezvousParameters(
        backend="c10d",
        endpoint=f"127.0.0.1:{server.port}",
        run_id=run_id,
        min_nodes=nodes,
        max_nodes=nodes,
        join_timeout=30,
        last_call_timeout=1,
        keep_alive_interval=2,
    )
    return create_handler(store, C10dRendezvousBackend(store, run_id), params)


def test_an_agent_waiting_for_the_round_reads_the_state_at_the_short_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torchrun.track()
    waits: list[float | tuple[float, float]] = []
    sleep = utils._delay

    def recorded(seconds: float | tuple[float, float]) -> None:
        waits.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(utils, "_delay", recorded)
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    first, second = _handler(server), _handler(server)
    done: list[Any] = []
    waiting = threading.Thread(target=lambda: done.append(first.next_rendezvous()))
    waiting.start()
    time.sleep(0.5)  # the first agent polls for the second one meanwhile
    done.append(second.next_rendezvous())
    waiting.join(timeout=10)
    try:
        assert len(done) == 2, "both agents are in the round"
        poll = torchrun.poll_seconds(2)
        assert first._state_holder._cache_duration == poll
        assert poll in waits and torchrun.TORCH_POLL_SECONDS not in waits, waits
    finally:
        for handler in (first, second):
            handler.shutdown()


def test_a_rejoining_agent_skips_torchs_first_round_skew(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch delays a join by a random 0–0.3 s while the rendezvous is in round 0 — still the
    case when a job's first loss sends its survivors back: the first recovery of every job
    waited for it. An agent's first join keeps it (it spreads a job's first arrivals), a
    re-join does not."""
    torchrun.track()
    waits: list[float | tuple[float, float]] = []
    monkeypatch.setattr(utils, "_delay", waits.append)
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    handler = _handler(server, "alone", nodes=1)
    try:
        handler.next_rendezvous()
        assert torchrun.TORCH_FIRST_ROUND_SKEW in waits, waits
        waits.clear()
        assert handler._state_holder.state.round == 0
        handler.next_rendezvous()  # as after a failure: round 0 left, round 1 formed
        assert handler._state_holder.state.round == 1
        assert torchrun.TORCH_FIRST_ROUND_SKEW not in waits, waits
    finally:
        handler.shutdown()


def test_a_rendezvous_reads_no_source_to_name_its_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step of torch's rendezvous named an event (dropped unless a handler is set) after
    its caller with ``inspect.stack()``, twice: the source line of every frame read at every
    step of every re-rendezvous. The same names come from the frames."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    torchrun.track()

    def record() -> tuple[str, str]:
        """As torch's ``_record`` names its event; beside it, torch's own reading of it."""
        return dynamic_rendezvous.get_method_name(), inspect.stack()[1].function

    def step() -> tuple[str, str]:
        return record()

    named, by_torchs_reading = step()
    assert named == by_torchs_reading == "step"
    stacks: list[int] = []
    stack = inspect.stack
    monkeypatch.setattr(inspect, "stack", lambda *a, **k: stacks.append(1) or stack(*a, **k))
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    handler = _handler(server, "alone", nodes=1)
    try:
        handler.next_rendezvous()
        handler.next_rendezvous()
        assert not stacks, f"inspect.stack() called {len(stacks)} times"
    finally:
        handler.shutdown()
