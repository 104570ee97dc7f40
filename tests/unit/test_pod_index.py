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
    PodInformer,
    Position,
    WatchError,
    follow,
    group_by_job,
    stream_lines,
)
from torchkube.operator.pods import RUNNING_SEEN, progress_only


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


def test_a_live_pod_moving_on_is_progress_and_an_ended_or_going_one_is_news() -> None:
    bound = _pod("w-0") | {"spec": {"nodeName": "n1"}}
    running = _pod("w-0", phase="Running")
    running["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    crashed = _pod("w-0", phase="Running")
    crashed["status"]["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {}}}]
    restarted = _pod("w-0", phase="Running")
    restarted["status"]["containerStatuses"] = [
        {"name": "store", "state": {"running": {}}, "lastState": {"terminated": {}}}
    ]
    going = _pod("w-0", phase="Running")
    going["metadata"]["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    assert all(
        progress_only(kind, pod)
        for kind, pod in [("ADDED", _pod("w-0")), ("MODIFIED", bound), ("MODIFIED", running)]
    )
    assert not any(
        progress_only(kind, pod)
        for kind, pod in [
            ("DELETED", _pod("w-0", phase="Running")),
            ("MODIFIED", going),
            ("MODIFIED", _pod("w-0", phase="Failed")),
            ("MODIFIED", _pod("w-0", phase="Succeeded")),
            ("MODIFIED", crashed),
            ("MODIFIED", restarted),
        ]
    )


def test_a_batch_wakes_each_job_once_saying_whether_it_only_progressed() -> None:
    """One of a job's pods failing among its others starting is news for the whole batch."""
    woken: list[tuple[tuple[str, str], bool]] = []
    informer = PodInformer(None, [], lambda key, progress: woken.append((key, progress)))  # type: ignore[arg-type]
    informer._inbox.extend(
        [
            Changed("ADDED", _pod("a-0", "a")),
            Changed("MODIFIED", _pod("a-1", "a", phase="Failed")),
            Changed("ADDED", _pod("a-2", "a")),
            Changed("ADDED", _pod("b-0", "b")),
            Changed("MODIFIED", _pod("b-0", "b", phase="Running")),
        ]
    )
    informer._drain()
    assert sorted(woken) == [(("ns", "a"), False), (("ns", "b"), True)]
    woken.clear()
    informer._inbox.append(Listed("ns", group_by_job([_pod("b-0", "b")])))
    informer._drain()
    assert sorted(woken) == [(("ns", "a"), False), (("ns", "b"), False)], (
        "a list is news: what changed in it is not known"
    )


def test_a_pod_is_stamped_when_the_watch_first_shows_it_running_and_keeps_that_stamp() -> None:
    """Start-up and recovery are timed to it: the reconcile that sees the last worker run may
    come a calm spacing later."""
    ticks = iter([100.0, 200.0, 300.0])
    index = PodIndex(clock=lambda: next(ticks))

    def seen() -> Any:
        return next(iter(index[("ns", "a")]), {}).get(RUNNING_SEEN)

    index.apply(Changed("ADDED", _pod("a-0", "a")))
    assert seen() is None, "Pending"
    index.apply(Changed("MODIFIED", _pod("a-0", "a", phase="Running")))
    assert seen() == 100.0
    index.apply(Changed("MODIFIED", _pod("a-0", "a", phase="Running")))
    assert seen() == 100.0, "a later change of a running pod keeps when it was first seen"
    index.replace(Listed("ns", group_by_job([_pod("a-0", "a", phase="Running")])))
    assert seen() == 100.0, "so does a list"
    index.apply(Changed("MODIFIED", _pod("a-0", "a", phase="Failed")))
    assert seen() is None
    index.apply(Changed("MODIFIED", _pod("a-0", "a", phase="Running")))
    assert seen() == 200.0


def test_a_pod_listed_running_is_not_stamped_by_its_next_event() -> None:
    """When it started is not known (a list, after the operator's restart): a later change
    of it must not claim it started then, nor time a start-up or recovery to that moment."""
    index = PodIndex(clock=lambda: 100.0)
    index.replace(Listed("ns", group_by_job([_pod("a-0", "a", phase="Running")])))
    index.apply(Changed("MODIFIED", _pod("a-0", "a", phase="Running")))
    assert RUNNING_SEEN not in next(iter(index[("ns", "a")]))
