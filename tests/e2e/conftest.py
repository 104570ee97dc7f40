"""The e2e tier's session: the real-node cluster and its trainer image start in the background
at its first test when real-node tests will run (tests/real_nodes_start.py says why)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from real_nodes_start import RealNodesStart, say_past_capture


def _real_node_tests_selected(session: pytest.Session) -> bool:
    return any(item.get_closest_marker("realnodes") for item in session.items)


@pytest.fixture(scope="session", autouse=True)
def real_nodes_start(request: pytest.FixtureRequest) -> Iterator[RealNodesStart | None]:
    """Begins at the first e2e test when real-node tests will run; stops at the session's end."""
    if not _real_node_tests_selected(request.session):
        yield None
        return
    starter = RealNodesStart()
    starter.start()
    try:
        # The engine first, so that no module's fixture starts (and later stops) one of its own.
        starter.wait_for("docker", say_past_capture(request, "real nodes"), timeout=120)
        yield starter
    finally:
        starter.stop(failed=request.session.testsfailed > 0)
