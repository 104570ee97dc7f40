"""The operator's pod informer against a real apiserver: its first list, the events after it,
and the label selector (a watch too old to resume is tested on its events, in
tests/unit/test_pod_index.py: a fresh cluster has compacted nothing)."""

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import REGISTRY

from torchkube.api import labels as lbl
from torchkube.local.ports import free_port
from torchkube.operator.informer import PodInformer

pytestmark = pytest.mark.cluster
KEY_JOB = "demo"


def _pod(name: str, job: str | None = KEY_JOB) -> dict[str, Any]:
    labels = {lbl.JOB_NAME: job} if job else {"app": "other"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"torchkube.test/no-such-node": "true"},  # stays Pending
            "containers": [{"name": "c", "image": "registry.invalid/none:1"}],
        },
    }


async def _until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_the_informer_lists_then_follows_the_job_pods_only(api_client: Any, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    for body in [_pod("w-0"), _pod("w-1"), _pod("stranger", job=None)]:
        core.create_namespaced_pod(namespace, body)
    key = (namespace, KEY_JOB)

    async def scenario() -> None:
        woken: list[tuple[str, str]] = []
        news: list[bool] = []

        def wake(job: tuple[str, str], progress_only: bool) -> None:
            woken.append(job)
            news.append(not progress_only)

        informer = PodInformer(api_client, [namespace], wake)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 20)
            assert REGISTRY.get_sample_value("torchkube_pod_watch_synced") == 1
            names = {p["metadata"]["name"] for p in informer.index[key]}
            assert names == {"w-0", "w-1"}, "the list holds the job's pods, not the stranger"
            assert set(woken) == {key}, "the list wakes the job (not the stranger's)"
            assert all("containers" not in p.get("spec", {}) for p in informer.index[key])

            await asyncio.to_thread(core.create_namespaced_pod, namespace, _pod("w-2"))
            await _until(lambda: len(informer.index.get(key, [])) == 3, "w-2 in the index")
            assert news[0] and not news[-1], "a list is news; a pod created is progress"
            before_delete = len(news)
            await asyncio.to_thread(
                core.delete_namespaced_pod, "w-0", namespace, grace_period_seconds=0
            )
            await _until(
                lambda: (
                    {p["metadata"]["name"] for p in informer.index.get(key, [])} == {"w-1", "w-2"}
                ),
                "w-0 gone from the index",
            )
            assert woken.count(key) >= 3, woken
            assert any(news[before_delete:]), "a pod deleted is news"
        finally:
            task.cancel()

    asyncio.run(scenario())


def test_a_cancelled_informer_lets_go_of_a_quiet_watch_at_once(
    api_client: Any, namespace: str
) -> None:
    """Stopping closed each open watch response from the event loop, and closing waits for the
    lock its reading thread holds until the next event or bookmark: a SIGTERMed operator sat
    there a minute and more, its loop (and everything else) stuck."""

    async def scenario() -> tuple[float, list[threading.Thread]]:
        informer = PodInformer(api_client, [namespace], lambda _key, _progress: None)
        task = asyncio.create_task(informer.run())
        await asyncio.wait_for(informer.synced.wait(), 20)
        await asyncio.sleep(1.0)  # the watch is open, and nothing happens in the namespace
        followers = [t for t in threading.enumerate() if t.name == f"pods-{namespace}"]
        started = time.monotonic()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return time.monotonic() - started, followers

    took, followers = asyncio.run(scenario())
    assert took < 1.0, f"the cancelled informer held the event loop {took:.1f} s"
    for thread in followers:
        thread.join(2.0)
        assert not thread.is_alive(), "the watch thread still reads after the stop"


def test_an_api_server_out_of_reach_is_counted_and_nothing_is_reconciled() -> None:
    """No cluster: a loopback port nothing listens on. The informer keeps retrying, counts
    each failure in ``torchkube_pod_watch_errors_total``, and never says it is filled."""
    port = free_port()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    before = REGISTRY.get_sample_value("torchkube_pod_watch_errors_total") or 0.0

    async def scenario() -> float:
        informer = PodInformer(client.ApiClient(configuration), [], lambda _key, _progress: None)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.sleep(2.0)  # the first tries: at 0, 0.5 s and 1.5 s
            assert not informer.synced.is_set()
            assert REGISTRY.get_sample_value("torchkube_pod_watch_synced") == 0
            return (REGISTRY.get_sample_value("torchkube_pod_watch_errors_total") or 0) - before
        finally:
            task.cancel()

    assert asyncio.run(scenario()) >= 2
