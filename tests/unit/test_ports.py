"""An agent's own port and probes of others' (torchkube/elastic/ports.py), with real sockets
on loopback."""

import socket

from torchkube.elastic.ports import AgentPort, Probe, probe, probeable


def test_a_held_port_answers_every_probe_and_a_closed_one_refuses() -> None:
    port = AgentPort()
    assert port.number is not None
    socket.create_connection(("127.0.0.1", port.number), timeout=1).close()
    many = {i: ("127.0.0.1", port.number) for i in range(300)}  # more than its listen queue
    assert set(probe(many, timeout=2).values()) == {Probe.ANSWERED}
    if socket.has_dualstack_ipv6():
        assert probe({"v6": ("::1", port.number)}, timeout=2) == {"v6": Probe.ANSWERED}
    port.close()
    assert probe({"gone": ("127.0.0.1", port.number)}) == {"gone": Probe.REFUSED}


def test_answers_already_in_count_when_the_prober_is_late() -> None:
    """A prober descheduled past its deadline (a loaded node) still reads the connections
    that completed meanwhile: an answer is not turned into no evidence."""
    port = AgentPort()
    assert port.number is not None
    try:
        assert probe({"held": ("127.0.0.1", port.number)}, timeout=0) == {"held": Probe.ANSWERED}
    finally:
        port.close()


def test_a_port_that_accepts_nothing_in_time_is_no_evidence() -> None:
    """A full listen queue stands for a machine that answers nothing: no refusal."""
    silent = socket.create_server(("127.0.0.1", 0), backlog=0)
    try:
        number = silent.getsockname()[1]
        held = []
        try:
            for _ in range(16):  # until the queue is full: a connection then gets no answer
                held.append(socket.create_connection(("127.0.0.1", number), timeout=0.2))
        except TimeoutError:
            pass
        answers = probe({i: ("127.0.0.1", number) for i in range(4)}, timeout=0.2)
        assert set(answers.values()) == {Probe.NO_ANSWER}
        for connection in held:
            connection.close()
    finally:
        silent.close()


def test_only_ip_addresses_are_probed() -> None:
    """A name would need a lookup, with no deadline, inside the rendezvous."""
    assert probeable("10.1.2.3") and probeable("fd00::1") and not probeable("worker-0.local")
    assert probe({"name": ("worker-0.local", 1)}) == {"name": Probe.NO_ANSWER}
