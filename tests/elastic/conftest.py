"""The rendezvous store process every elastic test's agents meet through."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import Store


@pytest.fixture
def store_process(tmp_path: Path) -> Iterator[Store]:
    process = Store(tmp_path)
    process.start()
    yield process
    if process.proc is not None and process.proc.poll() is None:
        assert process.stop() == 0


@pytest.fixture
def store(store_process: Store) -> int:
    return store_process.port
