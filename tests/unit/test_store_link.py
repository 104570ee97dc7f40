"""The boards' link to the rendezvous store, against a real c10d TCPStore that goes away
and comes back on the same port (the store pod restarted behind its Service)."""

import time
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import TCPStore

from torchkube.elastic.store_link import StoreLink
from torchkube.local.ports import free_port


def serve(port: int = 0) -> Any:
    return TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )


def read(store: Any) -> bytes | None:
    return store.get("k") if store.check(["k"]) else None


def write(store: Any) -> bool:
    store.set("k", "v")
    return True


def test_without_an_endpoint_every_call_falls_back() -> None:
    assert StoreLink(None, 1.0).call(write, False) is False


def test_a_store_that_went_away_falls_back_once_and_the_next_call_reaches_its_successor() -> None:
    server = serve()
    port = server.port
    link = StoreLink(f"127.0.0.1:{port}", 1.0)
    assert link.call(write, False) is True
    assert link.call(read, None) == b"v"

    del server
    assert link.call(read, b"away") == b"away"

    successor = serve(port)
    assert link.call(read, b"away") is None  # reconnected: a new store, without the key
    assert link.call(write, False) is True
    assert successor.get("k") == b"v"


def test_an_endpoint_where_nothing_listens_falls_back() -> None:
    server = serve()
    port = server.port
    del server
    assert StoreLink(f"127.0.0.1:{port}", 0.5).call(write, False) is False


def test_a_store_not_listening_yet_is_fallen_back_from_without_a_word(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """``torchkube run`` reads its restart board while the store it started is still
    importing torch: c10d's client printed its connect timeout with a C++ stack trace on the
    quick start's terminal, on every poll until the store listened."""
    port = free_port()
    assert StoreLink(f"127.0.0.1:{port}", 0.5).call(write, False) is False
    assert capfd.readouterr().err == ""


def test_after_a_failed_call_the_link_falls_back_at_once_for_a_while() -> None:
    """recovery live: the writer group posts the quorum's size after its steps, and workers
    train on while the store pod is replaced. Each call to a store that is away waited for
    torch's client to give up on a refused connection (2 to 6 s for a 2 s timeout): every
    step took that long more until the store was back. Now a refused connection fails at
    once, and after a failed connect the link falls back at once for ``retry_after``
    seconds, then tries again."""
    server = serve()
    port = server.port
    del server
    link = StoreLink(f"127.0.0.1:{port}", 2.0, retry_after=3.0)
    began = time.monotonic()
    assert link.call(write, False) is False
    assert link.call(write, False) is False
    assert time.monotonic() - began < 0.5, "waited for the absent store"
    successor = serve(port)
    assert link.call(write, False) is False, "tried again before retry_after"
    time.sleep(3.0)
    assert link.call(write, False) is True
    assert successor.get("k") == b"v"
