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

The silence is what a lost node costs, whose machine answers nothing. Most losses leave the
machine up — a pod deleted or evicted, its processes SIGKILLed, the OOM killer — and then the
dead agent's own port says so at once (:mod:`torchkube.elastic.ports`): every agent also
listens on a port of its own while it lives (its number beside its counter), each agent
tries the ports of a round's participants when it joins the round, and again when it next
judges them — at once, as the round breaks up — and once a counter missed
:data:`PROBE_AFTER_BEATS` beats. A refusal from a port that answered
before is a dead agent; an answer, or none, leaves the judgement to the silence — so an agent
that is alive but slow to beat is never dropped sooner than before, and neither is one behind
a network that rejects every probe.
"""

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from torchkube.elastic.ports import AgentPort, Probe, probe, probeable

FASTEST_BEAT_SECONDS = 0.1
BEATS_PER_SECOND = 1024
"""The beats a job's agents send the store per second at most, whatever the job's size."""
SILENT_BEATS = 5
"""Beats missed in a row before a participant is judged dead."""
SHORTEST_SILENCE_SECONDS = 0.5
PROBE_AFTER_BEATS = 2
"""Beats missed in a row before a participant's port is tried: a live agent's counter rarely
stands still that long, so few probes reach agents that answer."""
PROBED_ROUND_MAX = 256
"""The largest round whose participants' ports an agent tries when it joins: one socket each,
at once."""
CONNECT_SECONDS = 2.0
"""How long a beat may wait for the store to accept its connection."""


def beat_seconds(max_nodes: int, keep_alive_seconds: float) -> float:
    """How often an agent of a round of ``max_nodes`` beats: at most ``BEATS_PER_SECOND``
    beats a second from the round's agents, never slower than torch's keep-alive."""
    return min(keep_alive_seconds, max(FASTEST_BEAT_SECONDS, max_nodes / BEATS_PER_SECOND))


def silence_seconds(beat: float) -> float:
    """How long a participant's counter must stand still before it is judged dead."""
    return max(SHORTEST_SILENCE_SECONDS, SILENT_BEATS * beat)


def probe_after_seconds(beat: float) -> float:
    """How long a participant's counter must stand still before its port is tried."""
    return PROBE_AFTER_BEATS * beat


def port_key(beat: str) -> str:
    """The store key of the port the agent of the counter ``beat`` listens on."""
    return f"{beat}.port"


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
    whenever the store answers.

    It also holds the agent's port (see the module docstring) from :meth:`start` to
    :meth:`stop`, and writes its number beside the counter at each connection to the store (a
    replaced store has lost it)."""

    def __init__(self, connect: Callable[[], Any], key: str, period: float) -> None:
        self._connect, self._key, self._period = connect, key, period
        self._store: Any = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchkube-beats", daemon=True)
        self._port = AgentPort()

    def start(self) -> None:
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        """The counter stands still and the port is closed: a probe is refused from now on."""
        self._stopped.set()
        self._port.close()

    def _run(self) -> None:
        while not self._stopped.wait(self._period):
            self._beat()

    def _beat(self) -> None:
        try:
            if self._store is None:
                store = self._connect()
                if self._port.number is not None:
                    store.set(port_key(self._key), str(self._port.number))
                self._store = store
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
    """A waiting agent's judgement of the participants it waits on, from their counters and
    ports."""

    def __init__(
        self,
        silence: float,
        probe_after: float | None = None,
        probe: Callable[[Mapping[str, tuple[str, int]]], dict[str, Probe]] = probe,
    ) -> None:
        self.silence = silence
        self.probe_after = silence if probe_after is None else probe_after
        self._probe = probe
        self._seen: dict[str, tuple[bytes, float]] = {}
        """Each key's last value and since when (the judge's monotonic clock) it holds it."""
        self._answered: set[str] = set()
        """The keys whose agent's port answered: only their refusal is evidence."""
        self._probed: dict[str, bytes] = {}
        """Each key's counter value when its port was tried for standing still: once per
        value (a look after a while tries it besides)."""
        self._looked: dict[str, float] = {}
        """When each key was last read: a key not read for twice :attr:`probe_after` (the
        polls of one judgement come more often) is tried at once."""
        self.refused: set[str] = set()
        """The keys judged dead by their refused port rather than the whole silence."""

    def learn(self, store: Any, hosts: Mapping[str, str]) -> None:
        """Try the ports of the agents of ``hosts`` (each key's agent's address), alive now:
        a round was just formed with them."""
        if len(hosts) <= PROBED_ROUND_MAX:
            answers = self._probe(self._targets(store, hosts))
            self._answered |= {key for key, answer in answers.items() if answer is Probe.ANSWERED}

    def dead(
        self, store: Any, keys: Sequence[str], now: float, hosts: Mapping[str, str] | None = None
    ) -> list[str]:
        """Those of ``keys`` whose counter stood still for the whole silence, or whose agent's
        port refused a connection (``hosts``: each key's agent's address; a key without one is
        judged by the silence alone). A port is tried at the first look at its key after a
        while — a round that just broke up: what the counter did meanwhile is not known — and
        again once the counter stood still for :attr:`probe_after`."""
        values = _read(store, keys)
        still: dict[str, tuple[bytes, float]] = {}
        fresh: set[str] = set()
        for key, value in zip(keys, values, strict=True):
            if value is None:
                continue
            looked, self._looked[key] = self._looked.get(key), now
            if looked is None or now - looked > 2 * self.probe_after:  # polls come faster
                fresh.add(key)
            last = self._seen.get(key)
            if last is None or last[0] != value:
                self._seen[key] = (value, now)
            else:
                still[key] = (value, now - last[1])
        stalled = {
            key
            for key, (value, for_how_long) in still.items()
            if for_how_long >= self.probe_after and self._probed.get(key) != value
        }
        due = fresh | stalled
        to_try = {
            key: host
            for key, host in (hosts or {}).items()
            if key in due and key in self._answered and key not in self.refused
        }
        if to_try:
            # a look after a while does not stand for the stalled counter's probe: an agent
            # killed as the round broke up may still hold its port at that first look
            self._probed.update((key, self._seen[key][0]) for key in to_try if key in stalled)
            answers = self._probe(self._targets(store, to_try))
            self.refused |= {key for key, answer in answers.items() if answer is Probe.REFUSED}
        return [
            key
            for key in keys
            if key in self.refused or (key in still and still[key][1] >= self.silence)
        ]

    def _targets(self, store: Any, hosts: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        """Each key's agent's address and port, where it has an IP address and a port."""
        keys = [key for key, host in hosts.items() if probeable(host)]
        ports = _read(store, [port_key(key) for key in keys])
        return {key: (hosts[key], int(port)) for key, port in zip(keys, ports, strict=True) if port}


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
