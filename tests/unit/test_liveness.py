"""How an agent judges the participants it waits on by their counters in the store
(torchkube/elastic/liveness.py), against a real TCPStore in this process."""

import contextlib
import socket
import threading
import time
from collections.abc import Mapping
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from torchkube.elastic import liveness
from torchkube.elastic.ports import Probe, probe


@pytest.fixture(scope="module")
def store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_beats_are_fast_for_small_rounds_and_bounded_in_total_for_large_ones() -> None:
    assert liveness.beat_seconds(2, keep_alive_seconds=2) == liveness.FASTEST_BEAT_SECONDS
    assert liveness.beat_seconds(512, keep_alive_seconds=2) == pytest.approx(0.5)
    assert liveness.beat_seconds(8192, keep_alive_seconds=2) == 2, "never slower than torch"
    assert liveness.silence_seconds(0.1) == liveness.SHORTEST_SILENCE_SECONDS
    assert liveness.silence_seconds(0.5) == pytest.approx(2.5)


def test_only_a_counter_that_stood_still_for_the_whole_silence_is_dead(store: TCPStore) -> None:
    beating, still, absent = "t1.beating", "t1.still", "t1.absent"
    store.add(beating, 1)
    store.add(still, 1)
    watch = liveness.Watch(silence=0.5)
    keys = [beating, still, absent]
    assert watch.dead(store, keys, now=10.0) == [], "first seen: nobody is judged yet"
    store.add(beating, 1)
    assert watch.dead(store, keys, now=10.3) == []
    store.add(beating, 1)
    assert watch.dead(store, keys, now=10.6) == [still], "a key with no counter is never judged"
    store.add(still, 1)
    assert watch.dead(store, keys, now=10.7) == [], "a counter that moves again is alive"


def test_beats_count_in_the_store_until_stopped(store: TCPStore) -> None:
    beats = liveness.Beats(liveness.connect_beside(store), "t2.agent", period=0.05)
    beats.start()
    assert store.add("t2.agent", 0) >= 1, "the first beat is sent before start returns"
    watch = liveness.Watch(silence=0.3)
    assert watch.dead(store, ["t2.agent"], now=0.0) == []
    time.sleep(0.5)
    assert watch.dead(store, ["t2.agent"], now=1.0) == [], "it beat meanwhile"
    beats.stop()
    time.sleep(0.2)
    watch.dead(store, ["t2.agent"], now=2.0)
    assert watch.dead(store, ["t2.agent"], now=2.4) == ["t2.agent"]


def test_beats_go_on_while_the_agents_own_client_waits_for_a_key(store: TCPStore) -> None:
    """torch's agent waits on its client for keys (a round's master address, the exit
    barrier); a counter sent through that client would stand still meanwhile."""
    agents_client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=3))
    beats = liveness.Beats(liveness.connect_beside(agents_client), "t3.agent", period=0.05)

    def wait_for_a_key_nobody_sets() -> None:
        with contextlib.suppress(Exception):  # it times out
            agents_client.get("t3.never")

    waiting = threading.Thread(target=wait_for_a_key_nobody_sets)
    beats.start()
    before = store.add("t3.agent", 0)
    waiting.start()
    time.sleep(1.0)
    during = store.add("t3.agent", 0)
    beats.stop()
    waiting.join()
    assert during >= before + 2, f"{during - before} beats in 1 s while the agent waited"


def test_a_still_counter_whose_port_is_refused_is_dead_before_the_silence(store: TCPStore) -> None:
    """A process that is gone while its machine is up (a pod deleted, SIGKILLed, OOM-killed)
    refuses a connection to its port: dead after two missed beats, not the whole silence. A
    port that answers (alive, slow to beat), no answer (a lost machine), or a refusal from a
    port that never answered (a network rejecting the probes) leaves it to the silence."""
    hosts = {"t4.gone": "10.0.0.1", "t4.hung": "10.0.0.2", "t4.rejected": "10.0.0.3"}
    for key in hosts:
        store.add(key, 1)
        store.set(liveness.port_key(key), "1234")
    answers = {"t4.gone": Probe.ANSWERED, "t4.hung": Probe.ANSWERED, "t4.rejected": Probe.REFUSED}
    probed: list[set[str]] = []

    def probe(targets: Mapping[str, tuple[str, int]]) -> dict[str, Probe]:
        assert all(port == 1234 and hosts[key] == host for key, (host, port) in targets.items())
        probed.append(set(targets))
        return {key: answers[key] for key in targets}

    watch = liveness.Watch(silence=0.5, probe_after=0.2, probe=probe)
    watch.learn(store, hosts)  # the round just formed: all alive
    answers["t4.gone"] = Probe.REFUSED
    keys = list(hosts)
    assert watch.dead(store, keys, now=10.0, hosts=hosts) == ["t4.gone"], "tried at first look"
    assert probed[1] == {"t4.gone", "t4.hung"}, "a port that never answered is not evidence"
    assert watch.refused == {"t4.gone"}
    assert watch.dead(store, keys, now=10.1, hosts=hosts) == ["t4.gone"] and len(probed) == 2
    assert watch.dead(store, keys, now=10.25, hosts=hosts) == ["t4.gone"]
    assert probed[2] == {"t4.hung"}, "still for two beats: tried again"
    assert watch.dead(store, keys, now=10.4, hosts=hosts) == ["t4.gone"]
    assert len(probed) == 3, "each port is tried once while its counter stands still"
    assert watch.dead(store, keys, now=10.5, hosts=hosts) == keys, "the silence: all"
    store.add("t4.hung", 1)
    assert watch.dead(store, keys, now=10.6, hosts=hosts) == ["t4.gone", "t4.rejected"]
    assert watch.dead(store, keys, now=10.8, hosts=hosts) == ["t4.gone", "t4.rejected"]
    assert probed[3] == {"t4.hung"} and len(probed) == 4, "still again, at a new value"
    store.add("t4.hung", 1)
    assert watch.dead(store, keys, now=20.0, hosts=hosts) == ["t4.gone", "t4.rejected"]
    assert probed[4] == {"t4.hung"}, "a look after a while tries the port at once"


def test_an_agent_still_dying_at_the_first_look_is_refused_at_the_next_probe(
    store: TCPStore,
) -> None:
    """The survivor's workers see a peer's loss (a reset connection) and its agent looks at
    once, while the killed agent's process may still be tearing down and holding its port:
    that answer must not spare it the probe two missed beats later."""
    key, hosts = "t6.dying", {"t6.dying": "10.0.0.1"}
    store.add(key, 1)
    store.set(liveness.port_key(key), "1234")
    answer = [Probe.ANSWERED]
    probed: list[set[str]] = []

    def probe(targets: Mapping[str, tuple[str, int]]) -> dict[str, Probe]:
        probed.append(set(targets))
        return {key: answer[0] for key in targets}

    watch = liveness.Watch(silence=0.5, probe_after=0.2, probe=probe)
    watch.learn(store, hosts)
    assert watch.dead(store, [key], now=10.0, hosts=hosts) == [], "still holding its port"
    answer[0] = Probe.REFUSED  # its process is gone now
    assert watch.dead(store, [key], now=10.1, hosts=hosts) == []
    assert watch.dead(store, [key], now=10.25, hosts=hosts) == [key], "before the silence"
    assert len(probed) == 3 and watch.refused == {key}


def test_an_agents_port_is_written_beside_its_counter_and_closed_when_it_stops(
    store: TCPStore,
) -> None:
    beats = liveness.Beats(liveness.connect_beside(store), "t5.agent", period=0.05)
    beats.start()
    port = int(store.get(liveness.port_key("t5.agent")))
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    beats.stop()
    assert probe({"t5": ("127.0.0.1", port)}) == {"t5": Probe.REFUSED}
