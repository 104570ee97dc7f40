"""The operator's pod informer against a real apiserver: its first list, the events after it,
and the label selector (a watch too old to resume is tested on its events, in
tests/unit/test_pod_index.py: a fresh cluster has compacted nothing)."""

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from torchkube.api import labels as lbl
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
        informer = PodInformer(api_client, [namespace], woken.append)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 20)
            names = {p["metadata"]["name"] for p in informer.index[key]}
            assert names == {"w-0", "w-1"}, "the list holds the job's pods, not the stranger"
            assert set(woken) == {key}, "the list wakes the job (not the stranger's)"
            assert all("containers" not in p.get("spec", {}) for p in informer.index[key])

            await asyncio.to_thread(core.create_namespaced_pod, namespace, _pod("w-2"))
            await _until(lambda: len(informer.index.get(key, [])) == 3, "w-2 in the index")
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
        finally:
            task.cancel()

    asyncio.run(scenario())
