"""A dead agent found in a fraction of a second, not after torch's keep-alive expiry.

When an agent dies without leaving the rendezvous (its node lost, its pod's processes
SIGKILLed, the OOM killer), it stays among the participants of the last round until its
keep-alive expires: ``keep_alive_interval × keep_alive_max_attempt`` after its last
keep-alive (6 s with torchkube's defaults). Until then the survivors cannot form a round
without it, and a replacement that already arrived waits beside them — most of a recovery.
torch's keep-alive cannot simply beat faster: each one rewrites the whole shared state (every
participant's entry) by compare-and-set, against every other agent's writes.

Here each agent also beats on a counter of its own in the store (:class:`Beats`, one
``add`` of a few bytes every :func:`beat_seconds`), and an agent waiting for a round judges
the participants it waits on by their counters (:class:`Watch`): a counter that has not moved
for :func:`silence_seconds` belongs to a dead agent, which the waiting agent then drops from
the state as torch's own expiry would (:mod:`torchkube.elastic.lost_agents`). Counters are
compared by the judge's own clock, so agents' clocks never matter. A participant with no
counter (the store was replaced and lost them) is never judged: torch's expiry still covers
it.
"""

import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

FASTEST_BEAT_SECONDS = 0.1
BEATS_PER_SECOND = 1024
"""The beats a job's agents send the store per second at most, whatever the job's size."""
SILENT_BEATS = 5
"""Beats missed in a row before a participant is judged dead."""
SHORTEST_SILENCE_SECONDS = 0.5
CONNECT_SECONDS = 2.0
"""How long a beat may wait for the store to accept its connection."""


def beat_seconds(max_nodes: int, keep_alive_seconds: float) -> float:
    """How often an agent of a round of ``max_nodes`` beats: at most ``BEATS_PER_SECOND``
    beats a second from the round's agents, never slower than torch's keep-alive."""
    return min(keep_alive_seconds, max(FASTEST_BEAT_SECONDS, max_nodes / BEATS_PER_SECOND))


def silence_seconds(beat: float) -> float:
    """How long a participant's counter must stand still before it is judged dead."""
    return max(SHORTEST_SILENCE_SECONDS, SILENT_BEATS * beat)


def beat_key(run_id: str, node: object) -> str:
    """The store key of an agent's counter; ``node`` is torch's descriptor (its ``repr``:
    address, pid, id)."""
    return f"torchkube.alive.{run_id}.{node!r}"


class Beats:
    """An agent's counter in the store, incremented every ``period`` by a thread of its own,
    over a connection of its own: torch's agent blocks on its connection while it waits for
    a key (a round's master address, the other agents' ranks, the exit barrier), and beats
    sent through it would stop meanwhile, as a dead agent's do. The first beat is sent
    before :meth:`start` returns, so an agent enters the shared state with a counter
    whenever the store answers."""

    def __init__(self, connect: Callable[[], Any], key: str, period: float) -> None:
        self._connect, self._key, self._period = connect, key, period
        self._store: Any = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchkube-beats", daemon=True)

    def start(self) -> None:
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self._period):
            self._beat()

    def _beat(self) -> None:
        try:
            if self._store is None:
                self._store = self._connect()
            self._store.add(self._key, 1)
        except Exception:  # the store is away: the launcher sees to that; connect again later
            self._store = None


def connect_beside(store: Any) -> Callable[[], Any]:
    """How to open a second client of the TCPStore ``store`` is a client of."""
    from torch.distributed import TCPStore

    host, port = store.host, store.port
    timeout = timedelta(seconds=CONNECT_SECONDS)
    return lambda: TCPStore(host, port, is_master=False, timeout=timeout)


class Watch:
    """A waiting agent's judgement of the participants it waits on, from their counters."""

    def __init__(self, silence: float) -> None:
        self.silence = silence
        self._seen: dict[str, tuple[bytes, float]] = {}
        """Each key's last value and since when (the judge's monotonic clock) it holds it."""

    def dead(self, store: Any, keys: Sequence[str], now: float) -> list[str]:
        """Those of ``keys`` whose counter stood still for the whole silence."""
        values = _read(store, keys)
        silent = []
        for key, value in zip(keys, values, strict=True):
            if value is None:
                continue
            last = self._seen.get(key)
            if last is None or last[0] != value:
                self._seen[key] = (value, now)
            elif now - last[1] >= self.silence:
                silent.append(key)
        return silent


def _read(store: Any, keys: Sequence[str]) -> list[bytes | None]:
    """Each key's value, None where it has none (a plain ``get`` would wait for it)."""
    if not keys:
        return []
    try:
        if store.check(list(keys)):
            return list(store.multi_get(list(keys)))
        return [store.get(key) if store.check([key]) else None for key in keys]
    except Exception:  # the store is away: nobody can be judged now
        return [None for _ in keys]


def keys_of(run_id: str, nodes: Iterable[object]) -> dict[str, object]:
    """Each node's counter key, to the node."""
    return {beat_key(run_id, node): node for node in nodes}
