"""``failurePolicy.recovery: live`` against the real control plane and KWOK nodes: torchft's
Lighthouse has a pod and a Service of its own, which outlive the rendezvous store's pod; the
store's loss restarts no worker, and a lost Lighthouse is replaced."""

import time
from collections.abc import Callable
from typing import Any

import pytest
from kube_jobs import Job
from kubernetes import client

from testbed import faults
from testbed.kwok import NodePool
from torchkube.api import labels as lbl
from torchkube.api.contract import Env

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def live_pods(job: Job, role: str) -> list[Any]:
    return [
        p
        for p in job.pods(role)
        if p.status.phase in ("Pending", "Running") and p.metadata.deletion_timestamp is None
    ]


def serving(job: Job, role: str, not_named: str = "") -> Any:
    """The one Running and Ready pod of ``role`` (other than ``not_named``), or None."""
    found = [
        p
        for p in live_pods(job, role)
        if p.metadata.name != not_named
        and p.status.phase == "Running"
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]
    return found[0] if len(found) == 1 else None


def condition(job: Job, kind: str) -> dict[str, Any]:
    return next((c for c in job.status().get("conditions", []) if c["type"] == kind), {})


def test_a_live_job_s_lighthouse_outlives_its_store_and_is_replaced_when_lost(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=2)
    live = {"replicas": {"min": 2, "max": 2}, "failurePolicy": {"recovery": "live"}}
    job = make_job("livelh", pool, **live)
    workers = sorted(p.metadata.name for p in job.wait_running(2))
    core = client.CoreV1Api(api_client)

    # its own pod and Service; the store's pod is the store's alone
    lighthouse = job.wait(lambda: serving(job, lbl.ROLE_LIGHTHOUSE), 60, "a serving Lighthouse")
    store = job.wait(lambda: serving(job, lbl.ROLE_RENDEZVOUS), 30, "a serving store")
    assert [c.name for c in store.spec.containers] == ["store"]
    assert lighthouse.spec.containers[0].command[:3] == [
        "python",
        "-m",
        "torchkube.elastic.lighthouse",
    ]
    assert lighthouse.metadata.owner_references[0].uid == job.get()["metadata"]["uid"]
    service = core.read_namespaced_service("livelh-lighthouse", job.namespace)
    assert service.spec.cluster_ip == "None"
    assert service.spec.selector[lbl.ROLE] == lbl.ROLE_LIGHTHOUSE
    slices = client.DiscoveryV1Api(api_client)

    def addresses(service_name: str) -> list[str]:
        found = slices.list_namespaced_endpoint_slice(
            job.namespace, label_selector=f"kubernetes.io/service-name={service_name}"
        ).items
        return [a for s in found for e in s.endpoints or [] for a in e.addresses]

    job.wait(
        lambda: addresses("livelh-lighthouse") == [lighthouse.status.pod_ip],
        30,
        "the Lighthouse's address, and only it, in its Service's EndpointSlices",
    )
    worker_env = {e.name: e.value for e in job.pods()[0].spec.containers[0].env}
    port = job.get()["spec"]["rendezvous"]["port"] + 1
    expected = f"http://livelh-lighthouse.{job.namespace}.svc:{port}"
    assert worker_env[Env.LIGHTHOUSE] == expected
    job.wait(lambda: condition(job, "LighthouseReady").get("status") == "True", 30, "ready")

    # the store's pod deleted: a new store, and no worker replaced, no restart counted
    faults.delete_pod(api_client, store.metadata.name, job.namespace)
    deleted_at = time.monotonic()
    new_store = job.wait(
        lambda: serving(job, lbl.ROLE_RENDEZVOUS, not_named=store.metadata.name),
        60,
        "a new store",
    )
    print(f"new store serving {time.monotonic() - deleted_at:.1f}s after the delete")
    status = job.wait(
        lambda: (job.status().get("failures") or [None])[-1] and job.status(),
        30,
        "the store's loss recorded",
    )
    lost = status["failures"][-1]
    assert lost["reason"] == "RendezvousStoreLost" and lost["pod"] == store.metadata.name
    assert lost.get("incident") is None and "train on" in lost["message"], lost
    deadline = time.monotonic() + 6  # a resync of the test operator or more
    while time.monotonic() < deadline:
        status = job.status()
        assert status.get("restarts", 0) == 0 and status.get("phase") == "Running", status
        assert sorted(p.metadata.name for p in job.live_workers()) == workers
        time.sleep(0.5)
    assert serving(job, lbl.ROLE_LIGHTHOUSE).metadata.name == lighthouse.metadata.name
    job.wait_event("RendezvousStoreLost", 30, containing="train on")

    # the Lighthouse's pod deleted: replaced, its Service names the new one; nothing else moves
    faults.delete_pod(api_client, lighthouse.metadata.name, job.namespace)
    deleted_at = time.monotonic()
    replacement = job.wait(
        lambda: serving(job, lbl.ROLE_LIGHTHOUSE, not_named=lighthouse.metadata.name),
        60,
        "a new Lighthouse",
    )
    print(f"new Lighthouse serving {time.monotonic() - deleted_at:.1f}s after the delete")
    job.wait(
        lambda: addresses("livelh-lighthouse") == [replacement.status.pod_ip],
        30,
        "the new Lighthouse in its Service's EndpointSlices",
    )
    job.wait(
        lambda: (
            job.status().get("phase") == "Running"
            and condition(job, "LighthouseReady").get("status") == "True"
        ),
        30,
        "Running with a serving Lighthouse",
    )
    status = job.status()
    assert status.get("restarts", 0) == 0 and status.get("replicaGroupLosses", 0) == 0, status
    assert sorted(p.metadata.name for p in job.live_workers()) == workers
    assert serving(job, lbl.ROLE_RENDEZVOUS).metadata.name == new_store.metadata.name
