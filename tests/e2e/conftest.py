"""The e2e tier's session: the real-node cluster and its trainer image start in the background
at its first test when real-node tests will run (tests/real_nodes_start.py says why)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from real_nodes_start import RealNodesStart, say_past_capture


@pytest.fixture(scope="session", autouse=True)
def real_nodes_start(request: pytest.FixtureRequest) -> Iterator[RealNodesStart | None]:
    """Begins at the first e2e test when real-node tests will run; stops at the session's end.
    A step that fails fails only the tests that need it (a chart test needs none)."""
    items = request.session.items
    if not any(item.get_closest_marker("realnodes") for item in items):
        yield None
        return
    trainer = any("trainer_image" in item.fixturenames for item in items)
    starter = RealNodesStart(say_past_capture(request, "real nodes"), trainer=trainer)
    starter.start()
    try:
        # The engine settled first, so that no module's fixture starts (and later stops) an
        # engine of its own under the starter's build and import.
        starter.settled("docker", timeout=120)
        yield starter
    finally:
        starter.stop(failed=request.session.testsfailed > 0)
