"""The job pods' watch cache, kept by the operator itself instead of by kopf.

A 512-worker start is thousands of pod events (created, bound, started, ready). Through kopf
every one of them took a per-object worker task with its batching window, the matching of
every registered handler, an index callback and an event callback — more of the operator's
CPU while a job started than its reconciles. Here one thread per watched scope (the cluster,
or each namespace) reads the stream, parses and slims each pod, and hands the event loop
batches; the loop applies them to :class:`PodIndex` and wakes the jobs they belong to.

What kopf guaranteed is kept: no job is reconciled before every scope's full list is in the
cache (:attr:`PodInformer.synced`, which the controller waits for); a watch resumes from the
last resourceVersion it saw (bookmarks keep that current while nothing changes); a watch too
old to resume (410 Gone) lists again, and every job whose pods differ from the new list is
woken. Only pods with the job-name label are listed and watched (a server-side selector).
"""

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchkube.api import labels as lbl
from torchkube.api.podfields import phase
from torchkube.operator import metrics
from torchkube.operator.pods import RUNNING_SEEN, name, progress_only, slim

log = logging.getLogger(__name__)
Key = tuple[str, str]
PodsByJob = dict[Key, dict[str, dict[str, Any]]]
"""Job key → pod name → the pod's slim body."""

WATCH_SECONDS = 300
"""The API server ends each watch after this long; the informer resumes it at once."""
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = WATCH_SECONDS + 30.0
"""A watch silent for this long (no event, no bookmark, no end) is a dead connection."""
LIST_PAGE = 500
MIN_WATCH_SECONDS = 1.0
"""A watch (or list and watch) that ends sooner than this is followed by a backoff."""
RETRY_FIRST, RETRY_MAX = 0.5, 30.0


@dataclass(frozen=True)
class Changed:
    """One watch event: ADDED, MODIFIED or DELETED, with the pod's slim body."""

    type: str
    pod: dict[str, Any]


@dataclass(frozen=True)
class Listed:
    """A scope's full list: every job pod in ``namespace`` (``None``: the whole cluster)."""

    namespace: str | None
    pods: PodsByJob


def job_key(pod: Mapping[str, Any]) -> Key | None:
    """The job a pod belongs to, by its namespace and job-name label."""
    metadata = pod.get("metadata") or {}
    job = (metadata.get("labels") or {}).get(lbl.JOB_NAME)
    return None if job is None else (str(metadata.get("namespace")), job)


def group_by_job(pods: Iterable[dict[str, Any]]) -> PodsByJob:
    grouped: PodsByJob = {}
    for pod in pods:
        key = job_key(pod)
        if key is not None:
            grouped.setdefault(key, {})[name(pod)] = pod
    return grouped


def stream_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A watch stream's chunks as its lines (one JSON event each); a chunk may end mid-line."""
    rest = b""
    for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from (line for line in lines if line.strip())
    if rest.strip():
        yield rest


def interrupt(response: Any) -> None:
    """Wake the thread blocked reading ``response`` by shutting its socket down; the thread
    then closes the response itself. Not ``response.close()`` from here: closing waits for
    the lock the reading thread holds until the stream's next event or bookmark — on a quiet
    cluster a minute or more, with the caller (the event loop, at shutdown) stuck meanwhile."""
    connection = getattr(response, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            # The plain socket's shutdown, also under TLS: the TLS layer's own would drop its
            # state under the reading thread's feet.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class WatchError(RuntimeError):
    """The watch stream ended with an ERROR event other than 410 (an overloaded or failing API
    server): resumed from the same version after a backoff, as a dropped connection is."""


@dataclass
class Position:
    """Where a scope's watch resumes: the last resourceVersion seen (``None``: list first).
    Kept outside the watch so that a stream that breaks midway resumes after what it
    delivered, not from where it began (replaying events would show older pod states)."""

    version: str | None = None


def follow(
    lines: Iterable[bytes],
    position: Position,
    post: Callable[[Changed], None],
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Post a watch stream's pod events, moving ``position`` past each one (bookmarks
    included). A 410 Gone clears it: the version was compacted away, list again. Any other
    ERROR raises :class:`WatchError`.

    Parsed by orjson: decoding the events (whole pods, managed fields and all) was most of
    this thread's time, and the thread the operator's largest CPU user while a job starts."""
    for line in lines:
        event = orjson.loads(line)
        kind, body = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if body.get("code") == 410:
                position.version = None
                return
            raise WatchError(f"{body.get('code')} {body.get('message')}")
        if kind != "BOOKMARK":
            post(Changed(str(kind), slim(body, owned=True)))
        position.version = str(body["metadata"]["resourceVersion"])
        if stopping():
            return


class PodIndex(Mapping[Key, Collection[dict[str, Any]]]):
    """Job key → its pods' slim bodies, as the watch last showed them.

    Changed only on the event loop, where the controller reads it: a reconcile's snapshot
    never sees half a batch. The bodies are never mutated, so readers share them.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._jobs: PodsByJob = {}
        self._clock = clock
        """Wall time, for :data:`~torchkube.operator.pods.RUNNING_SEEN`."""

    def __getitem__(self, key: Key) -> Collection[dict[str, Any]]:
        return self._jobs[key].values()

    def __iter__(self) -> Iterator[Key]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def apply(self, change: Changed) -> Key | None:
        """Fold one event in; the job it touched (``None`` for a pod without the label)."""
        key = job_key(change.pod)
        if key is None:
            return None
        if change.type == "DELETED":
            pods = self._jobs.get(key, {})
            pods.pop(name(change.pod), None)
            if not pods:
                self._jobs.pop(key, None)
        else:
            pods = self._jobs.setdefault(key, {})
            self._stamp(change.pod, pods.get(name(change.pod)), watched=True)
            pods[name(change.pod)] = change.pod
        return key

    def _stamp(self, pod: dict[str, Any], before: dict[str, Any] | None, watched: bool) -> None:
        """Mark ``pod`` (fresh from the API, not yet shared) with when it was first seen
        Running: as ``before`` was when it ran already (unmarked if it was listed running:
        when it started is not known), or now when the watch shows it turn Running (a list
        shows nothing of when a pod started)."""
        if phase(pod) != "Running":
            return
        if before is not None and phase(before) == "Running":
            if RUNNING_SEEN in before:
                pod[RUNNING_SEEN] = before[RUNNING_SEEN]
        elif watched:
            pod[RUNNING_SEEN] = self._clock()

    def replace(self, listed: Listed) -> set[Key]:
        """Take a scope's full list as the truth; the jobs whose pods it changed."""
        for key, pods in listed.pods.items():
            known = self._jobs.get(key, {})
            for pod_name, pod in pods.items():
                self._stamp(pod, known.get(pod_name), watched=False)
        inside = [k for k in self._jobs if listed.namespace in (None, k[0])]
        changed = {k for k in inside if self._jobs[k] != listed.pods.get(k)}
        changed |= {k for k in listed.pods if k not in self._jobs}
        for key in inside:
            del self._jobs[key]
        self._jobs.update(listed.pods)
        return changed


class PodInformer:
    """Lists and watches the job pods of ``namespaces`` (empty: the whole cluster) into
    :attr:`index`, calling ``wake`` with every job whose pods changed, on the event loop, and
    whether they only progressed (:func:`~torchkube.operator.pods.progress_only`)."""

    def __init__(
        self, api_client: client.ApiClient, namespaces: list[str], wake: Callable[[Key, bool], None]
    ) -> None:
        self.api = client.CoreV1Api(api_client)
        self.scopes: list[str | None] = list(namespaces) or [None]
        self.wake = wake
        self.index = PodIndex()
        self.synced = asyncio.Event()
        self._listed: set[str | None] = set()
        self._inbox: deque[Changed | Listed] = deque()
        self._drain_scheduled = False
        self._stop = threading.Event()
        self._open: set[Any] = set()
        """The watch responses being read, closed on stop."""
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self) -> None:
        """Follow every scope until cancelled."""
        self._loop = asyncio.get_running_loop()
        metrics.POD_WATCH_SYNCED.set(0)
        threads = [
            threading.Thread(
                target=self._follow, args=(scope,), name=f"pods-{scope or 'all'}", daemon=True
            )
            for scope in self.scopes
        ]
        for thread in threads:
            thread.start()
        try:
            await asyncio.Event().wait()
        finally:
            self._stop.set()
            for response in list(self._open):  # a quiet watch would block its thread for minutes
                interrupt(response)

    # ------------------------------------------------------------------ the loop's side
    def _post(self, message: Changed | Listed) -> None:
        """Hand a message to the loop; one wake-up serves every message posted before it."""
        self._inbox.append(message)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: the operator is stopping
                self._stop.set()

    def _drain(self) -> None:
        self._drain_scheduled = False  # before popping: a message posted now gets a wake-up
        # each job touched, and whether all it got was its pods' progress (what a list
        # changed is not known pod by pod: news)
        woken: dict[Key, bool] = {}
        while self._inbox:
            message = self._inbox.popleft()
            if isinstance(message, Listed):
                woken |= dict.fromkeys(self.index.replace(message), False)
                self._listed.add(message.namespace)
            else:
                key = self.index.apply(message)
                if key is not None:
                    moved_on = progress_only(message.type, message.pod)
                    woken[key] = woken.get(key, True) and moved_on
        if not self.synced.is_set() and self._listed.issuperset(self.scopes):
            log.info("pod cache filled: %d jobs with pods", len(self.index))
            metrics.POD_WATCH_SYNCED.set(1)
            self.synced.set()
        for key, moved_on in woken.items():
            self.wake(key, moved_on)

    # ------------------------------------------------------------------ the threads' side
    def _follow(self, namespace: str | None) -> None:
        where = f"namespace {namespace}" if namespace else "the cluster"
        position = Position()
        retry = RETRY_FIRST
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                if position.version is None:
                    position.version = self._list(namespace)
                self._watch(namespace, position)
                if position.version is None:
                    log.info("the pod watch of %s expired; listing again", where)
                if time.monotonic() - began >= MIN_WATCH_SECONDS:
                    retry = RETRY_FIRST
                    continue
                # a server that ends every watch at once (or expires it) gets no tight loop
            except ApiException as error:
                metrics.POD_WATCH_ERRORS.inc()
                hint = " (does the operator's role allow list and watch on pods?)"
                log.warning(
                    "watching pods in %s failed: %s %s%s; retrying in %.1f s",
                    where,
                    error.status,
                    error.reason,
                    hint if error.status == 403 else "",
                    retry,
                )
            except Exception as error:  # a dropped connection, a timeout, an ERROR event
                if self._stop.is_set():
                    return  # its response was closed by run(): the operator is stopping
                metrics.POD_WATCH_ERRORS.inc()
                log.warning("the pod watch of %s broke (%s); again in %.1f s", where, error, retry)
            self._stop.wait(retry)
            retry = min(retry * 2, RETRY_MAX)

    def _request(self, namespace: str | None, **params: Any) -> Any:
        """A list or watch of the scope's job pods, its response unparsed (the client's
        model objects cost more than the JSON)."""
        params.update(label_selector=lbl.JOB_NAME, _preload_content=False)
        if namespace is None:
            return self.api.list_pod_for_all_namespaces(**params)
        return self.api.list_namespaced_pod(namespace, **params)

    def _list(self, namespace: str | None) -> str:
        """Post the scope's full list; its resourceVersion, where the watch starts."""
        pods: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page: dict[str, Any] = {"_continue": token} if token else {}
            response = self._request(
                namespace, limit=LIST_PAGE, _request_timeout=(CONNECT_TIMEOUT, 60.0), **page
            )
            body = orjson.loads(response.data)
            pods += [slim(pod, owned=True) for pod in body.get("items") or []]
            token = body["metadata"].get("continue")
            if not token:
                self._post(Listed(namespace, group_by_job(pods)))
                return str(body["metadata"]["resourceVersion"])

    def _watch(self, namespace: str | None, position: Position) -> None:
        """Follow one watch from ``position`` until the server ends it."""
        try:
            response = self._request(
                namespace,
                watch=True,
                resource_version=position.version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=(CONNECT_TIMEOUT, READ_TIMEOUT),
            )
        except ApiException as error:
            if error.status == 410:  # refused at once rather than as the stream's first event
                position.version = None
                return
            raise
        self._open.add(response)
        try:
            lines = stream_lines(response.stream(amt=None, decode_content=False))
            follow(lines, position, self._post, self._stop.is_set)
        finally:
            self._open.discard(response)
            response.close()  # as the client's own watch does: never reuse a watch's socket
            response.release_conn()
