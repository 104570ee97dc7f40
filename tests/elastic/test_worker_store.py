"""A rank that reaches the round's process-group store before rank 0 serves it joins as soon
as it listens, through torch's own store creation (what ``init_process_group`` runs), not
after torch's half-second back-off; and a store that never comes still ends in torch's error."""

import importlib
import inspect
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import DistError

from torchkube.elastic import warm, worker_store
from torchkube.local.ports import free_port

RANK_0_LATE_SECONDS = 0.05
rendezvous = importlib.import_module("torch.distributed.rendezvous")


@pytest.fixture
def prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's store creation wrapped for the test only, from torch's own as a new process
    has it."""
    unpatched = inspect.unwrap(rendezvous._create_c10d_store)
    monkeypatch.setattr(rendezvous, "_create_c10d_store", unpatched)
    worker_store.connect_promptly()


@pytest.mark.usefixtures("prompt")
def test_a_rank_early_to_the_store_connects_once_it_listens() -> None:
    port, joined = free_port(), {}

    def rank_1() -> None:
        rendezvous._create_c10d_store("127.0.0.1", port, 1, 2, timedelta(seconds=30))
        joined["at"] = time.monotonic()

    client = threading.Thread(target=rank_1, daemon=True)
    client.start()
    time.sleep(RANK_0_LATE_SECONDS)
    serving = time.monotonic()  # its store waits for rank 1 before it returns
    server = rendezvous._create_c10d_store("127.0.0.1", port, 0, 2, timedelta(seconds=30))
    client.join(timeout=30)
    assert "at" in joined, "rank 1 never connected"
    waited = joined["at"] - serving
    assert waited < 0.15, f"rank 1 connected {waited:.2f}s after rank 0's store began to serve"
    del server


@pytest.mark.usefixtures("prompt")
def test_a_store_that_never_listens_still_fails_as_torch_says() -> None:
    began = time.monotonic()
    with pytest.raises(DistError):
        rendezvous._create_c10d_store("127.0.0.1", free_port(), 1, 2, timedelta(seconds=1))
    assert time.monotonic() - began < 10


@pytest.mark.parametrize("world_size", [2, 8, 100, 101, 4096, 65536])
def test_a_worlds_tries_stay_within_the_budget_from_the_first(world_size: int) -> None:
    """Every client starts at the same moment after a restart: the first waits, not only the
    longest, must spread a large world's refused tries; a small world's first is prompt."""
    first, longest = worker_store.retry_waits(world_size)
    assert first <= longest
    assert world_size / first <= worker_store.TRIES_PER_SECOND * 1.0001
    if world_size <= 4:
        assert first == worker_store.FIRST_RETRY_SECONDS


def test_a_warm_worker_connects_promptly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "probe_worker.py").write_text(
        "import importlib, pathlib, sys\n"
        "rendezvous = importlib.import_module('torch.distributed.rendezvous')\n"
        "prompt = getattr(rendezvous._create_c10d_store, '_torchkube_prompt', False)\n"
        "pathlib.Path(sys.argv[1]).write_text(str(prompt))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    unpatched = inspect.unwrap(rendezvous._create_c10d_store)  # as a new process has it
    monkeypatch.setattr(rendezvous, "_create_c10d_store", unpatched)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    warm.run_module("probe_worker", str(tmp_path / "seen"))
    assert (tmp_path / "seen").read_text() == "True"
