"""The pod informer's logic: the index it keeps from events and lists, the stream's lines, and
what it does with each event (no cluster; the watch itself is tested against a real apiserver in
tests/integration/test_pod_informer.py)."""

import json
from collections.abc import Iterator
from typing import Any

import pytest

from torchkube.api import labels as lbl
from torchkube.operator.informer import (
    Changed,
    Listed,
    PodIndex,
    Position,
    WatchError,
    follow,
    group_by_job,
    stream_lines,
)


def _pod(name: str, job: str | None = "demo", ns: str = "ns", phase: str = "Pending") -> Any:
    labels = {} if job is None else {lbl.JOB_NAME: job}
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "status": {"phase": phase},
    }


def _names(index: PodIndex, key: tuple[str, str]) -> list[str]:
    return sorted(pod["metadata"]["name"] for pod in index.get(key, []))


def test_events_add_replace_and_remove_a_jobs_pods() -> None:
    index = PodIndex()
    assert index.apply(Changed("ADDED", _pod("w-0"))) == ("ns", "demo")
    index.apply(Changed("ADDED", _pod("w-1")))
    index.apply(Changed("MODIFIED", _pod("w-1", phase="Running")))
    assert _names(index, ("ns", "demo")) == ["w-0", "w-1"]
    assert {p["status"]["phase"] for p in index[("ns", "demo")]} == {"Pending", "Running"}
    index.apply(Changed("DELETED", _pod("w-0")))
    index.apply(Changed("DELETED", _pod("w-1")))
    assert ("ns", "demo") not in index, "a job without pods leaves the index"
    assert index.apply(Changed("ADDED", _pod("stray", job=None))) is None
    assert len(index) == 0


def test_a_deleted_pod_the_index_never_had_changes_nothing() -> None:
    index = PodIndex()
    index.apply(Changed("DELETED", _pod("w-0")))
    assert len(index) == 0


def test_a_list_replaces_its_namespace_only_and_names_the_jobs_it_changed() -> None:
    index = PodIndex()
    for pod in [_pod("a-0", "a"), _pod("b-0", "b"), _pod("c-0", "c", ns="other")]:
        index.apply(Changed("ADDED", pod))
    listed = Listed("ns", group_by_job([_pod("a-0", "a"), _pod("d-0", "d")]))
    changed = index.replace(listed)
    assert changed == {("ns", "b"), ("ns", "d")}, "a unchanged, b gone, d new"
    assert sorted(index) == [("ns", "a"), ("ns", "d"), ("other", "c")]


def test_a_cluster_wide_list_replaces_everything() -> None:
    index = PodIndex()
    index.apply(Changed("ADDED", _pod("c-0", "c", ns="other")))
    changed = index.replace(Listed(None, group_by_job([_pod("a-0", "a")])))
    assert changed == {("other", "c"), ("ns", "a")}
    assert list(index) == [("ns", "a")]


def test_a_list_that_shows_a_pod_changed_wakes_its_job() -> None:
    index = PodIndex()
    index.apply(Changed("ADDED", _pod("a-0", "a")))
    assert index.replace(Listed("ns", group_by_job([_pod("a-0", "a", phase="Failed")]))) == {
        ("ns", "a")
    }


def test_stream_lines_join_chunks_split_mid_line() -> None:
    events = [{"type": "ADDED", "object": _pod(f"w-{i}")} for i in range(3)]
    raw = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    chunks = [raw[:7], raw[7:50], raw[50:51], raw[51:]]
    assert [json.loads(line) for line in stream_lines(chunks)] == events
    assert list(stream_lines([b'{"a": 1}'])) == [b'{"a": 1}'], "a last line without newline"
    assert list(stream_lines([b"\n", b"  \n"])) == []


def _event(kind: str, version: str) -> bytes:
    body = _pod("w-0")
    body["metadata"]["resourceVersion"] = version
    return json.dumps({"type": kind, "object": body}).encode()


def test_a_watch_moves_its_position_past_every_event_bookmarks_included() -> None:
    posted: list[Changed] = []
    position = Position("9")
    follow([_event("ADDED", "10"), _event("MODIFIED", "11")], position, posted.append)
    assert position.version == "11"
    follow([_event("BOOKMARK", "15")], position, posted.append)
    assert position.version == "15"
    assert [c.type for c in posted] == ["ADDED", "MODIFIED"], "a bookmark is no pod event"
    assert posted[0].pod["metadata"]["name"] == "w-0"
    follow([], position, posted.append)
    assert position.version == "15", "an empty watch resumes where it began"


def test_a_stream_that_breaks_midway_resumes_after_what_it_delivered() -> None:
    position = Position("9")

    def broken() -> Iterator[bytes]:
        yield _event("ADDED", "10")
        raise ConnectionResetError("peer went away")

    with pytest.raises(ConnectionResetError):
        follow(broken(), position, lambda change: None)
    assert position.version == "10", "not 9: replaying would show older pod states"


def test_a_watch_too_old_lists_again_and_other_errors_raise() -> None:
    posted: list[Changed] = []
    position = Position("9")
    gone = json.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
    follow([_event("ADDED", "10"), gone.encode()], position, posted.append)
    assert position.version is None, "410: list again"
    assert len(posted) == 1, "what came before the error still counts"
    position = Position("9")
    other = json.dumps({"type": "ERROR", "object": {"code": 500, "message": "etcd"}})
    with pytest.raises(WatchError, match="etcd"):
        follow([other.encode()], position, posted.append)
    assert position.version == "9", "an overloaded server is watched again from the same place"


def test_a_stopping_informer_leaves_the_watch_after_the_current_event() -> None:
    posted: list[Changed] = []
    position = Position("9")
    lines = [_event("ADDED", "10"), _event("MODIFIED", "11")]
    follow(lines, position, posted.append, stopping=lambda: True)
    assert (len(posted), position.version) == (1, "10")
