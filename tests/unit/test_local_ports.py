"""Where ``torchkube run`` puts its servers (the rendezvous store, the Lighthouse, each worker's
metrics): on ports distinct from one another and below the kernel's ephemeral range. Two picks
of ``bind(0)`` may return the same port (the Lighthouse once failed every start with "Address
already in use", its port the store's), and a server started again on its port after a loss
(the store, the Lighthouse) must not find it taken as the source port of one of the workers'
own outgoing connections, which the kernel draws from the ephemeral range."""

import io
import random
import socket
from pathlib import Path

from training_jobs import training_job

from torchkube.local import ports
from torchkube.local.runner import LocalRun


def test_a_local_run_serves_on_distinct_ports_below_the_ephemeral_range(tmp_path: Path) -> None:
    job = training_job(replicas={"min": 4, "max": 4}, failurePolicy={"recovery": "live"})
    runs = [LocalRun(job, tmp_path / str(n), out=io.StringIO()) for n in range(8)]
    chosen = [p for r in runs for p in (r.store_port, r.lighthouse_port, *r.metrics_ports)]
    assert len(set(chosen)) == len(chosen) == 8 * 6
    low, high = ports.ephemeral_range()
    assert not [port for port in chosen if low <= port <= high]


def test_candidate_range_stays_below_ephemeral_range() -> None:
    assert ports.candidate_range((32768, 60999)) == (ports.LOW_PORT, 32767)
    assert ports.candidate_range((1024, 60000)) == (60001, 65535)
    assert ports.candidate_range((1024, 65535)) == (ports.LOW_PORT, 65535)


def test_ephemeral_range_reads_proc_format(tmp_path: Path) -> None:
    path = tmp_path / "range"
    path.write_text("32768\t60999\n")
    assert ports.ephemeral_range(path) == (32768, 60999)
    assert ports.ephemeral_range(tmp_path / "missing") == (32768, 60999)


def test_free_ports_are_distinct_and_bindable() -> None:
    rng = random.Random(7)
    chosen = [ports.free_port(rng) for _ in range(20)]
    assert len(set(chosen)) == 20
    low, high = ports.candidate_range()
    for port in chosen:
        assert low <= port <= high
        assert ports.is_port_free(port)


def test_busy_port_is_not_free() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not ports.is_port_free(sock.getsockname()[1])


def test_free_port_never_repeats_even_with_same_seed() -> None:
    first = ports.free_port(random.Random(1))
    second = ports.free_port(random.Random(1))
    assert first != second
