"""The controller's work queue, its expectations and the status it writes (no cluster: the
queue and the snapshot are logic; the API side is tested against a real apiserver in
tests/integration)."""

import asyncio
import math
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from torchkube.api.contract import ProgressReport
from torchkube.operator import kube as kube_module
from torchkube.operator import status as st
from torchkube.operator.config import OperatorSettings
from torchkube.operator.controller import CALM_SPACING, MIN_RECONCILE_SPACING, Controller
from torchkube.operator.decision import Event, Plan, Refusal
from torchkube.operator.leader import LostLeadership
from torchkube.operator.memory import Cache, JobMemory
from torchkube.operator.workloads import QueueObservation
from torchkube.policy.queue import QUEUE_LABEL

KEY = ("ns", "demo")


def _controller() -> Controller:
    return Controller(OperatorSettings(), kube=None)  # type: ignore[arg-type]


def test_delayed_requeues_of_a_key_keep_one_timer_and_the_earliest_wins() -> None:
    async def scenario() -> tuple[int, float]:
        controller = _controller()
        loop = asyncio.get_running_loop()
        for delay in [10.0] * 100 + [3.0, 7.0]:
            controller.enqueue(KEY, delay=delay)
        timer = controller.timers[KEY]
        left = timer.when() - loop.time()
        for handle in controller.timers.values():
            handle.cancel()
        return len(controller.timers), left

    timers, left = asyncio.run(scenario())
    assert timers == 1
    assert 2.5 < left <= 3.0


def test_a_fired_timer_queues_the_key_once() -> None:
    async def scenario() -> list[tuple[str, str]]:
        controller = _controller()
        controller.enqueue(KEY, delay=0.01)
        controller.enqueue(KEY)
        controller.enqueue(KEY)
        await asyncio.sleep(0.05)
        queued = []
        while not controller.queue.empty():
            queued.append(controller.queue.get_nowait())
        return queued

    assert asyncio.run(scenario()) == [KEY], "coalesced while queued"


def test_a_key_changed_while_reconciling_is_queued_again_after() -> None:
    controller = _controller()
    controller.active.add(KEY)

    async def scenario() -> None:
        controller.enqueue(KEY)

    asyncio.run(scenario())
    assert KEY in controller.dirty and controller.queue.empty()


def _workload_of_demo() -> dict[str, Any]:
    owner = {"kind": "TrainingJob", "name": "demo", "controller": True}
    return {"metadata": {"name": "w", "namespace": "ns", "ownerReferences": [owner]}}


def test_kueues_admission_wakes_a_job_inside_its_spacing_at_once() -> None:
    """A pod event inside the spacing waits for it (bursts gather into one reconcile); the
    Workload's admission, the one thing the job's pods wait for, does not: it came 0.05 s
    after the job's first reconcile, which made the Workload, and waited out the rest."""
    workload = _workload_of_demo()

    async def scenario() -> tuple[bool, bool]:
        controller = _controller()
        controller.not_before[KEY] = asyncio.get_running_loop().time() + 10.0
        controller.enqueue(KEY)
        spaced = controller.queue.empty()
        controller.workload_changed(workload)
        at_once = controller.queue.get_nowait() == KEY
        for handle in controller.timers.values():
            handle.cancel()
        return spaced, at_once

    assert asyncio.run(scenario()) == (True, True)


def test_an_admission_during_a_reconcile_is_served_right_after_it() -> None:
    workload = _workload_of_demo()

    async def scenario() -> bool:
        controller = _controller()
        controller.active.add(KEY)
        controller.workload_changed(workload)
        controller.active.discard(KEY)
        controller.not_before[KEY] = asyncio.get_running_loop().time() + 10.0
        controller.dirty.discard(KEY)
        controller.enqueue(KEY)  # what the reconcile's end does with a dirty key
        return controller.queue.get_nowait() == KEY

    assert asyncio.run(scenario())


async def _reconciled_once(controller: Controller, during: Any = None) -> None:
    """One pass of a worker over KEY with a reconcile that plans nothing (``during`` runs
    inside it), then the worker stopped."""

    async def reconcile(key: Any) -> None:
        controller.memory[key] = JobMemory()
        if during is not None:
            during()

    async def ended() -> None:
        while KEY not in controller.not_before:
            await asyncio.sleep(0.001)

    controller.reconcile = reconcile  # type: ignore[method-assign]
    controller.not_before.pop(KEY, None)
    controller.enqueue(KEY)
    worker = asyncio.create_task(controller._worker())
    await asyncio.wait_for(ended(), 10)
    worker.cancel()


def _pending(controller: Controller) -> float | None:
    """When KEY's pending wake-up fires (loop time); None: queued now."""
    if not controller.queue.empty():
        return None
    return controller.timers[KEY].when()


def _stop_timers(controller: Controller) -> None:
    for handle in controller.timers.values():
        handle.cancel()


def test_a_job_whose_pods_only_progress_waits_the_calm_spacing_and_news_does_not() -> None:
    """While 64 workers start, their pods change every few milliseconds and each change only
    moves the job's status on; a reconcile each time walked every pod 20 times a second. A
    pod that ended or went is news: its job's next reconcile comes after the short spacing."""

    async def scenario() -> tuple[Any, Any, Any, Any]:
        controller = _controller()
        await _reconciled_once(controller)
        controller.pods_changed(KEY, progress_only=True)
        calm = _pending(controller), controller.calm_after[KEY]
        controller.pods_changed(KEY, progress_only=False)
        news = _pending(controller), controller.not_before[KEY]
        _stop_timers(controller)
        return (*calm, *news)

    calm_at, calm_after, news_at, not_before = asyncio.run(scenario())
    assert calm_at == calm_after, "the calm spacing's end"
    assert news_at == not_before, "the short spacing's end, before it"
    assert calm_after - not_before == pytest.approx(CALM_SPACING - MIN_RECONCILE_SPACING)


def test_a_calm_timer_wakes_as_progress_and_a_reconcile_drops_it() -> None:
    """A timer only progress armed fires as progress (a reconcile running then is followed
    after the calm spacing); any reconcile serves what a pending timer waited for."""

    async def scenario() -> tuple[bool, bool, bool]:
        controller = _controller()
        await _reconciled_once(controller)
        controller.pods_changed(KEY, progress_only=True)
        past = asyncio.get_running_loop().time() - 1.0  # as if the timer fired in its time
        controller.not_before[KEY] = controller.calm_after[KEY] = past
        controller.active.add(KEY)
        controller.timers[KEY].cancel()
        controller._timer_fired(KEY)
        calm = KEY in controller.dirty and KEY not in controller.news
        controller.active.discard(KEY)
        controller.dirty.clear()
        controller.pods_changed(KEY, progress_only=True)
        await _reconciled_once(controller)
        dropped = KEY not in controller.timers and KEY not in controller.calm_timers
        _stop_timers(controller)
        return calm, dropped, controller.queue.empty()

    assert asyncio.run(scenario()) == (True, True, True)


def test_a_reconcile_dirtied_only_by_progress_is_followed_after_the_calm_spacing() -> None:
    async def scenario() -> tuple[Any, Any, Any, Any]:
        controller = _controller()
        await _reconciled_once(controller, lambda: controller.pods_changed(KEY, True))
        calm = _pending(controller), controller.calm_after[KEY]
        controller._cancel_timer(KEY)
        await _reconciled_once(controller, lambda: controller.pods_changed(KEY, False))
        news = _pending(controller), controller.not_before[KEY]
        _stop_timers(controller)
        return (*calm, *news)

    calm_at, calm_after, news_at, not_before = asyncio.run(scenario())
    assert calm_at == calm_after
    assert news_at == not_before


def _pod(name: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **meta}, "spec": {}, "status": {"phase": "Running"}}


def test_snapshot_folds_in_our_creates_until_the_watch_shows_them_and_our_deletes() -> None:
    controller = _controller()
    job = {"metadata": {"name": "demo", "resourceVersion": "5"}, "status": {}}
    pods: dict[Any, list[dict[str, Any]]] = {KEY: [_pod("a"), _pod("b")]}
    controller.attach({KEY: [job]}, pods, {}, {})
    memory = JobMemory()
    memory.expected.created["c"] = (1e18, _pod("c"))
    memory.expected.deleted["b"] = 1e18
    _, seen = controller.snapshot.view(KEY, job, memory)
    assert [p["metadata"]["name"] for p in seen] == ["a", "b", "c"]
    assert seen[1]["metadata"].get("deletionTimestamp"), "our delete shows before the watch's"
    pods[KEY].append(_pod("c"))
    pods[KEY].remove(pods[KEY][0])
    _, seen = controller.snapshot.view(KEY, job, memory)
    assert [p["metadata"]["name"] for p in seen] == ["b", "c"]
    assert "c" not in memory.expected.created, "an expectation ends when the watch shows the pod"


def test_snapshot_prefers_our_newer_write_of_the_job() -> None:
    controller = _controller()
    cached = {"metadata": {"name": "demo", "resourceVersion": "5"}, "status": {"restarts": 1}}
    controller.attach({KEY: [cached]}, {}, {}, {})
    memory = JobMemory(
        cache=Cache(job={"metadata": {"resourceVersion": "9"}, "status": {"restarts": 2}})
    )
    job, _ = controller.snapshot.view(KEY, cached, memory)
    assert job["status"]["restarts"] == 2


def test_status_to_wire_drops_numbers_json_cannot_carry_and_cuts_long_text() -> None:
    planned = {
        "phase": "Running",
        "progress": {"step": 3, "loss": math.nan, "tokensPerSecond": math.inf},
        "lastFailure": {
            "reason": "ExitCode",
            "time": "2026-11-23T12:00:00Z",
            "message": "x" * 9000,
        },
    }
    wire = st.to_wire(planned)
    assert wire["progress"] == {"step": 3}
    assert len(wire["lastFailure"]["message"]) == 4096


def test_status_patch_clears_what_the_plan_no_longer_has() -> None:
    """A Straggler after a Hang: the stored lastFailure's exit code must go, and so must a
    rank's stragglingSince once it keeps up (a plain merge of the planned status kept both)."""
    stored = {
        "phase": "Running",
        "restarts": 3,
        "conditions": [{"type": "Running", "status": "True"}],
        "lastFailure": {"reason": "Hang", "exitCode": 124, "pod": "w-0"},
        "slowestRank": {"rank": 1, "slowdown": 3.0, "stragglingSince": "2026-11-23T18:44:05Z"},
        "progress": {"step": 10, "loss": 3.0},
    }
    planned = {
        "phase": "Running",
        "restarts": 3,
        "conditions": [{"type": "Running", "status": "True"}],
        "lastFailure": {"reason": "Straggler", "pod": "w-1"},
        "slowestRank": {"rank": 1, "slowdown": 1.2},
    }
    patch = st.merge_patch(stored, planned)
    assert patch == {
        "lastFailure": {"reason": "Straggler", "exitCode": None, "pod": "w-1"},
        "slowestRank": {"slowdown": 1.2, "stragglingSince": None},
        "progress": None,
    }
    assert st.merge_patch(planned, planned) == {}
    assert st.merge_patch(None, planned) == planned
    conditions = [{"type": "Running", "status": "False"}]
    assert st.merge_patch(stored, stored | {"conditions": conditions}) == {"conditions": conditions}


def test_status_that_would_be_refused_is_an_error_naming_the_field() -> None:
    with pytest.raises(st.StatusError, match=r"status\.phase"):
        st.to_wire({"phase": "Exploded"})


class _RecordingKube:
    """Records the writes the controller asks for (the real ones are tested against the
    apiserver in tests/integration)."""

    def __init__(self) -> None:
        self.status: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []

    def patch_status(self, _ns: str, _name: str, status: dict[str, Any], _rv: Any) -> None:
        self.status.append(status)

    def event(self, _body: Any, type_: str, reason: str, message: str, _at: Any = None) -> None:
        self.events.append((type_, reason, message))


def test_a_job_the_model_refuses_gets_a_condition_and_one_event() -> None:
    kube = _RecordingKube()
    controller = Controller(OperatorSettings(), kube=kube)  # type: ignore[arg-type]
    body = {
        "metadata": {"name": "demo", "namespace": "ns", "generation": 3},
        "spec": {"replicas": {"min": 4, "max": 2}},
        "status": {"phase": "Running"},
    }
    controller.attach({KEY: [body]}, {}, {}, {})

    async def twice() -> None:
        await controller.reconcile(KEY)
        await controller.reconcile(KEY)

    asyncio.run(twice())
    assert controller.executor.events_posted(timeout=5)
    assert len(kube.status) == 1 and len(kube.events) == 1, "reported once, not per reconcile"
    [condition] = kube.status[0]["conditions"]
    assert condition["type"] == "Invalid" and condition["status"] == "True"
    assert "replicas" in condition["message"] and condition["observedGeneration"] == 3
    assert kube.events[0][:2] == ("Warning", "ValidationFailed")


class _KubeRefusingPods(_RecordingKube):
    """An apiserver that takes the status write, then answers the pod deletes and creates
    with 429 (``storage is (re)initializing`` while it restarts its watch cache)."""

    def label_pods(self, _ns: str, _labels: dict[str, dict[str, str]]) -> None:
        pass

    def delete_pods(self, *_args: Any) -> None:
        raise ApiException(status=429, reason="Too Many Requests")


def test_the_events_of_a_recorded_failure_survive_a_refused_pod_write() -> None:
    """The status write ends the failure's incident: the next plan sees it recorded and opens
    no incident, so an event not sent with this plan is never sent (a node loss would leave
    only Created and Running in ``kubectl describe``)."""
    kube = _KubeRefusingPods()
    controller = Controller(OperatorSettings(), kube=kube)  # type: ignore[arg-type]
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "status": {"restarts": 0}}
    decided = Plan(
        delete_pods=[("demo-worker-1-abcde", True)],
        mark_recorded={"demo-worker-1-abcde": "true"},
        events=[Event("Warning", "NodeLost", "node n2 lost; restarting (incident 1)")],
    )
    with pytest.raises(ApiException):
        controller.executor.execute(KEY, body, decided, {"restarts": 1}, JobMemory())
    assert controller.executor.events_posted(timeout=5)
    assert kube.status == [{"restarts": 1}]
    assert kube.events == [("Warning", "NodeLost", "node n2 lost; restarting (incident 1)")]


class _KubeWithSlowEvents(_RecordingKube):
    """An apiserver that takes the status write at once and holds the events (of the job
    named ``hold_only``, or every job's) until told."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.hold_only: str | None = None
        self.stamps: list[datetime | None] = []

    def event(self, body: Any, type_: str, reason: str, message: str, at: Any = None) -> None:
        if self.hold_only in (None, body["metadata"]["name"]):
            assert self.release.wait(timeout=30), "the test never released the events"
        self.stamps.append(at)
        super().event(body, type_, reason, message)


def test_a_plans_events_do_not_hold_up_its_end_and_keep_their_order() -> None:
    """An event is a record for the user that no decision waits for, and a refused one is
    retried for seconds: a reconcile that posted its events itself was held up by them (a
    queued job's admission, which came meanwhile, waited for its first plan's events)."""
    kube = _KubeWithSlowEvents()
    controller = Controller(OperatorSettings(), kube=kube)  # type: ignore[arg-type]
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "status": {}}
    first = Plan(events=[Event("Normal", "Queued", "one"), Event("Normal", "Queued", "two")])
    second = Plan(events=[Event("Normal", "Admitted", "three")])
    executed = threading.Thread(
        target=lambda: [
            controller.executor.execute(KEY, body, plan, {"phase": "Pending"}, JobMemory())
            for plan in (first, second)
        ],
        daemon=True,
    )
    executed.start()
    executed.join(timeout=5)
    assert not executed.is_alive(), "the plans waited for their events to be posted"
    planned_by = datetime.now(UTC)
    kube.release.set()
    assert controller.executor.events_posted(timeout=5)
    assert [message for _, _, message in kube.events] == ["one", "two", "three"]
    assert all(at is not None and at <= planned_by for at in kube.stamps), "stamped when posted"


def test_a_jobs_held_events_do_not_hold_another_jobs() -> None:
    """A job whose events the apiserver refuses (retried for seconds each) must not delay
    every other job's."""
    kube = _KubeWithSlowEvents()
    kube.hold_only = "held"
    controller = Controller(OperatorSettings(), kube=kube)  # type: ignore[arg-type]
    lanes = len(controller.executor.recorders)
    names = (f"job-{i}" for i in range(100))
    other = next(n for n in names if hash(("ns", n)) % lanes != hash(("ns", "held")) % lanes)

    def plan_with_event(name: str) -> None:
        body = {"metadata": {"name": name, "namespace": "ns"}, "status": {}}
        plan = Plan(events=[Event("Normal", "Queued", name)])
        controller.executor.execute(("ns", name), body, plan, {"phase": "Pending"}, JobMemory())

    plan_with_event("held")
    plan_with_event(other)
    deadline = time.monotonic() + 5
    while not kube.events and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [message for _, _, message in kube.events] == [other], "it waited for the held job"
    kube.release.set()
    assert controller.executor.events_posted(timeout=5)


class _Response:
    data = b"{}"


class _CoreBusyAtFirst:
    """``create_namespaced_event`` refused with ``refusals`` statuses, then taken."""

    def __init__(self, *refusals: int) -> None:
        self.refusals = list(refusals)
        self.attempts = 0
        self.created = 0

    def create_namespaced_event(self, *_args: Any, **_kwargs: Any) -> _Response:
        self.attempts += 1
        if self.refusals:
            raise ApiException(status=self.refusals.pop(0))
        self.created += 1
        return _Response()


@pytest.mark.parametrize(
    ("refusals", "attempts", "created"),
    [((429, 503), 3, 1), ((429, 429, 429, 429), 3, 0), ((403,), 1, 0)],
)
def test_an_event_refused_for_the_moment_is_sent_again(
    monkeypatch: pytest.MonkeyPatch, refusals: tuple[int, ...], attempts: int, created: int
) -> None:
    monkeypatch.setattr(kube_module, "EVENT_RETRY_DELAYS", (0.0, 0.0))
    kube = kube_module.Kube(ApiClient(), concurrency=1)
    core = _CoreBusyAtFirst(*refusals)
    kube.core = core  # type: ignore[assignment]
    kube.event({"metadata": {"name": "demo", "namespace": "ns"}}, "Warning", "NodeLost", "n2")
    assert (core.attempts, core.created) == (attempts, created)


class _KubeRefusingClaims(_RecordingKube):
    """A namespace whose ResourceQuota has no room for one more claim."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[str] = []

    def create_all(self, bodies: list[dict[str, Any]]) -> list[kube_module.CreateResult]:
        results = []
        for body in bodies:
            if body["kind"] == "PersistentVolumeClaim":
                quota = ApiException(status=403, reason="Forbidden")
                results.append(kube_module.CreateResult(refused=quota))
            else:
                self.created.append(body["metadata"]["name"])
                results.append(kube_module.CreateResult(body=body))
        return results


SERVICE = {"kind": "Service", "metadata": {"name": "demo"}}
CLAIM = {"kind": "PersistentVolumeClaim", "metadata": {"name": "demo-checkpoints"}}
WORKER = {"kind": "Pod", "metadata": {"name": "demo-worker-0-abcde"}}


def test_no_worker_is_created_while_its_claim_is_refused() -> None:
    """Without its checkpoint claim a worker would wait unschedulable, its slot taken."""
    kube = _KubeRefusingClaims()
    controller = Controller(OperatorSettings(), kube=kube)  # type: ignore[arg-type]
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "status": {}}
    memory = JobMemory()
    decided = Plan(create_children=[CLAIM], create_pods=[WORKER])
    controller.executor.execute(KEY, body, decided, {"phase": "Pending"}, memory)
    assert kube.created == [], "no pod while a child is refused"
    assert memory.trouble.refused is not None
    assert memory.trouble.refused.what == "PersistentVolumeClaim demo-checkpoints"
    assert not memory.trouble.refused.permanent, "a child's refusal is retried, whatever its code"


class _KubeWithSlowStatus(_RecordingKube):
    """A status write that waits (up to 2 s) for a pod create: whether the pod waited for it
    shows which came first."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        self.pod_created = threading.Event()

    def patch_status(self, _ns: str, _name: str, status: dict[str, Any], _rv: Any) -> None:
        self.pod_created.wait(2.0)
        self.log.append("status")

    def create_all(self, bodies: list[dict[str, Any]]) -> list[kube_module.CreateResult]:
        self.log.append("create " + "+".join(body["kind"] for body in bodies))
        if any(body["kind"] == "Pod" for body in bodies):
            self.pod_created.set()
        return [kube_module.CreateResult(body=body) for body in bodies]

    def label_pods(self, _ns: str, _labels: dict[str, dict[str, str]]) -> None:
        self.log.append("label")

    def delete_pods(self, *_args: Any) -> None:
        self.log.append("delete")


def _writes(decided: Plan, stored: dict[str, Any], planned: dict[str, Any]) -> list[str]:
    """The API writes ``decided`` makes, in the order they happen (see _KubeWithSlowStatus)."""
    kube = _KubeWithSlowStatus()
    controller = Controller(OperatorSettings(), kube=kube)  # type: ignore[arg-type]
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "status": stored}
    controller.executor.execute(KEY, body, decided, planned, JobMemory())
    return kube.log


def test_a_plan_that_only_creates_writes_its_status_beside_its_creates() -> None:
    """A new job's first pods wait neither for its status write nor for its Service (a
    round trip each before every start)."""
    started = time.monotonic()
    writes = _writes(
        Plan(create_children=[SERVICE], create_pods=[WORKER]), {}, {"phase": "Pending"}
    )
    assert writes == ["create Service+Pod", "status"]
    assert time.monotonic() - started < 1.5, "the status write did not hold the creates back"


class _QueuesWaitingForTheService:
    """A Workload create that waits (up to 2 s) for the Service's: whether the Service
    waited for it shows which came first."""

    def __init__(self, kube: _KubeWithSlowStatus) -> None:
        self.kube = kube

    def write(self, _ns: str, writes: list[tuple[str, dict[str, Any]]]) -> None:
        self.kube.pod_created.wait(2.0)
        self.kube.log.append("workload " + "+".join(verb for verb, _ in writes))


class _KubeCreatingTheService(_KubeWithSlowStatus):
    def create_all(self, bodies: list[dict[str, Any]]) -> list[kube_module.CreateResult]:
        if any(body["kind"] == "Service" for body in bodies):
            self.pod_created.set()
        return super().create_all(bodies)


def test_a_queued_jobs_workload_is_created_beside_its_service_and_status() -> None:
    """Kueue admits a new Workload within tens of milliseconds; the plan that creates it must
    not then hold the admitted job's next plan (its pods) for its Service and status writes
    one after another."""
    kube = _KubeCreatingTheService()
    queues = _QueuesWaitingForTheService(kube)
    controller = Controller(OperatorSettings(), kube=kube, queues=queues)  # type: ignore[arg-type]
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "status": {}}
    decided = Plan(create_children=[SERVICE], workload_writes=[("create", {"kind": "Workload"})])
    started = time.monotonic()
    controller.executor.execute(KEY, body, decided, {"phase": "Queued"}, JobMemory())
    assert time.monotonic() - started < 1.5, "the Service waited for the Workload's create"
    assert sorted(kube.log) == ["create Service", "status", "workload create"]


def test_a_workload_that_is_not_new_is_written_before_anything_else() -> None:
    """A Workload's spec or status write may be refused (a conflict: Kueue wrote it
    meanwhile); the plan's other writes wait for it, so a refused one leaves nothing done."""
    kube = _KubeCreatingTheService()
    queues = _QueuesWaitingForTheService(kube)
    controller = Controller(OperatorSettings(), kube=kube, queues=queues)  # type: ignore[arg-type]
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "status": {}}
    decided = Plan(create_children=[SERVICE], workload_writes=[("spec", {"kind": "Workload"})])
    controller.executor.execute(KEY, body, decided, {"phase": "Queued"}, JobMemory())
    assert kube.log[0] == "workload spec"


def test_a_claim_is_created_before_the_pods_that_mount_it() -> None:
    decided = Plan(create_children=[CLAIM, SERVICE], create_pods=[WORKER])
    writes = _writes(decided, {}, {"phase": "Pending"})
    assert writes == ["create PersistentVolumeClaim+Service", "create Pod", "status"]


def test_a_plan_that_records_a_failure_writes_its_status_before_any_pod_write() -> None:
    failed = "demo-worker-1-abcde"
    replacement = {"kind": "Pod", "metadata": {"name": "demo-worker-1-fghij"}}
    decided = Plan(
        delete_pods=[(failed, True)],
        mark_recorded={failed: "true"},
        create_pods=[replacement],
    )
    writes = _writes(decided, {"restarts": 0}, {"restarts": 1})
    assert writes == ["status", "label", "delete", "create Pod"]


class _KubeAnsweringStatus(_RecordingKube):
    """A status write answered with the job at the next resourceVersion, as the API does."""

    def __init__(self) -> None:
        super().__init__()
        self.version = 41

    def patch_status(self, _ns: str, _name: str, status: dict[str, Any], _rv: Any) -> Any:
        super().patch_status(_ns, _name, status, _rv)
        self.version += 1
        return {"metadata": {"name": "demo", "resourceVersion": str(self.version)}}


def _queued_after_writing(stored: dict[str, Any], planned: dict[str, Any], echo: str) -> bool:
    """Whether the watch's event at version ``echo``, after the controller wrote ``planned``
    over ``stored``, has the job reconciled again."""
    kube = _KubeAnsweringStatus()
    controller = Controller(OperatorSettings(), kube=kube)  # type: ignore[arg-type]
    body = {"metadata": {"name": "demo", "namespace": "ns", "resourceVersion": "41"}}
    controller.memory[KEY] = JobMemory()
    controller.executor.execute(
        KEY, {**body, "status": stored}, Plan(), planned, controller.memory[KEY]
    )
    assert kube.status, "the plan wrote its status"

    async def event() -> bool:
        controller.job_changed(KEY, {"metadata": {"resourceVersion": echo}})
        return not controller.queue.empty()

    return asyncio.run(event())


def test_the_echo_of_a_goodput_only_write_is_not_reconciled() -> None:
    """A quiet job's goodput moves with the clock and is written every 30 s; reconciling its
    echo changes nothing, and would cost every quiet job a reconcile per write."""
    running = {"phase": "Running", "goodput": 0.91}
    assert not _queued_after_writing(running, {**running, "goodput": 0.92}, echo="42")


def test_any_other_change_of_the_job_is_reconciled() -> None:
    running = {"phase": "Running", "goodput": 0.91}
    assert _queued_after_writing(running, {**running, "goodput": 0.92}, echo="43"), (
        "a change after our write (a spec edit) is not an echo"
    )
    restarting = {**running, "phase": "Restarting", "goodput": 0.92}
    assert _queued_after_writing(running, restarting, echo="42"), (
        "the echo of a write that changed more than goodput is reconciled"
    )


def _reconciles_when_the_event_comes_first(event_version: str) -> int:
    """How many reconciles a job gets when its watch shows ``event_version`` while the
    reconcile that writes version 42 (goodput alone) still waits for its response."""

    async def scenario() -> int:
        controller = _controller()
        memory = controller.memory[KEY] = JobMemory()
        calls = []

        async def reconcile(key: tuple[str, str]) -> None:
            calls.append(key)
            if len(calls) == 1:
                controller.job_changed(key, {"metadata": {"resourceVersion": event_version}})
                memory.cache.quiet_write = 42  # the write's response, after its echo

        controller.reconcile = reconcile  # type: ignore[method-assign]
        controller.enqueue(KEY)
        worker = asyncio.create_task(controller._worker())
        await asyncio.sleep(0.3)
        worker.cancel()
        return len(calls)

    return asyncio.run(scenario())


def test_an_echo_that_comes_before_the_writes_response_is_not_reconciled() -> None:
    assert _reconciles_when_the_event_comes_first("42") == 1
    assert _reconciles_when_the_event_comes_first("43") == 2, "another change is reconciled"


class _KubeTakingEverything(_RecordingKube):
    """Takes every write; created pods come back as created, as the apiserver answers."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[str] = []

    def label_pods(self, _ns: str, _labels: dict[str, dict[str, str]]) -> None:
        pass

    def delete_pods(self, *_args: Any) -> None:
        pass

    def patch(self, *_args: Any) -> None:
        pass

    def create_all(self, bodies: list[dict[str, Any]]) -> list[kube_module.CreateResult]:
        self.created += [body["metadata"]["name"] for body in bodies]
        return [kube_module.CreateResult(body=body) for body in bodies]


def test_a_worker_force_deleted_between_two_plans_is_recorded_as_deleted() -> None:
    """``kubectl delete pod --grace-period=0 --force``: the pod leaves the index without a
    deletion timestamp ever seen. It is replaced, and recorded like any delete by someone
    else: lastFailure, an incident, an event."""
    from planner import make_job, own_children, pod, running_status, store

    from torchkube.operator.pods import NodeHealth, slim

    kube = _KubeTakingEverything()
    controller = Controller(OperatorSettings(progress_url=""), kube=kube)  # type: ignore[arg-type]
    body = make_job(running_status()).to_wire()
    body["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    workers = [slim(pod(i)) for i in range(4)]
    pods: dict[Any, list[dict[str, Any]]] = {KEY: [*workers, slim(store())]}
    nodes = {"n1": [NodeHealth(True, None)], "n2": [NodeHealth(True, None)]}
    controller.attach({KEY: [body]}, pods, nodes, {KEY: own_children()})

    asyncio.run(controller.reconcile(KEY))
    assert kube.status == [] or "lastFailure" not in kube.status[-1]
    pods[KEY].remove(workers[1])  # gone at once: no Terminating pod ever seen
    asyncio.run(controller.reconcile(KEY))

    forced = workers[1]["metadata"]["name"]
    last = kube.status[-1].get("lastFailure") or {}
    assert (last.get("reason"), last.get("pod")) == ("Deleted", forced), kube.status
    assert (
        kube.status[-1]["restarts"] == 1 and kube.status[-1].get("restartsCountTowardsMax", 0) == 0
    )
    assert controller.executor.events_posted(timeout=5)
    assert ("Warning", "Deleted") in [event[:2] for event in kube.events]


def test_a_job_recreated_under_the_same_name_starts_from_nothing() -> None:
    """Deleted and created again before a reconcile saw it gone: what the controller
    remembers of the old job (its progress, a refused create) is not the new one's."""
    kube = _KubeTakingEverything()
    controller = Controller(OperatorSettings(), kube=kube)  # type: ignore[arg-type]
    new = {
        "metadata": {"name": "demo", "namespace": "ns", "uid": "new", "generation": 1},
        "spec": {"replicas": {"min": 1, "max": 1}},
    }
    controller.attach({KEY: [new]}, {}, {}, {})
    old = controller.memory[KEY] = JobMemory(uid="old")
    old.cache.progress = ProgressReport(step=500, total_steps=1000, world_size=8)
    old.cache.progress_at = time.monotonic()
    old.trouble.refused = Refusal(403, "Forbidden", "exceeded quota", datetime.now(UTC))
    asyncio.run(controller.reconcile(KEY))
    [written] = kube.status
    assert "progress" not in written and written["worldSize"] == 0
    assert any("-worker-0-" in name for name in kube.created), "no old refusal holds it back"
    assert controller.memory[KEY].uid == "new"


def test_the_kueue_integration_off_reads_no_workload_and_says_so_to_the_planner() -> None:
    """Without a QueueClient (kueue.enabled=false) a queue-labelled job is planned as
    ``disabled``, and one without the label as before."""
    from planner import make_job

    controller = Controller(OperatorSettings(), kube=None, queues=None)  # type: ignore[arg-type]
    job = make_job()
    labelled = job.model_copy(
        update={"metadata": {**job.metadata, "labels": {QUEUE_LABEL: "team-a"}}}
    )
    assert asyncio.run(controller.snapshot.queue(job)) is None
    assert asyncio.run(controller.snapshot.queue(labelled)) == QueueObservation(kueue="disabled")


class _Jobs:
    """The apiserver's answer to a read of the job: ``uid`` (None: not found)."""

    def __init__(self, uid: str | None) -> None:
        self.uid = uid

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None if self.uid is None else {"metadata": {"name": name, "uid": self.uid}}


def _worker_once(controller: Controller, error: ApiException) -> None:
    async def reconcile(key: tuple[str, str]) -> None:
        raise error

    async def scenario() -> None:
        controller.reconcile = reconcile  # type: ignore[method-assign]
        controller.enqueue(KEY)
        worker = asyncio.ensure_future(controller._worker())
        await asyncio.sleep(0.05)
        worker.cancel()
        for handle in controller.timers.values():
            handle.cancel()

    asyncio.run(scenario())


@pytest.mark.parametrize(("now", "failed"), [(None, False), ("u-2", False), ("u-1", True)])
def test_a_job_deleted_during_its_reconcile_is_no_failed_reconcile(
    now: str | None, failed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A status write answered 404 because the job was deleted (and maybe created again
    under its name) since the cache showed it: nothing of it is left to write, so it is read
    again quietly. A 404 while the same job still exists is a failed reconcile."""
    controller = _controller()
    controller.memory[KEY] = JobMemory(uid="u-1")
    controller.kube = _Jobs(now)  # type: ignore[assignment]
    with caplog.at_level("INFO", logger="torchkube.operator.controller"):
        _worker_once(controller, ApiException(status=404, reason="Not Found"))
    said = [r.getMessage() for r in caplog.records]
    assert any("reconcile of" in line and "failed" in line for line in said) is failed, said
    assert KEY in controller.timers, "read again"


class _LeaseTakenOver:
    """A leader whose Lease another replica took: its fence refuses the write and steps
    down, as ``LeaderElection.fence`` does."""

    def __init__(self) -> None:
        self.leading = asyncio.Event()
        self.leading.set()
        self.on_stopped_leading: list[Any] = []
        self.loop = asyncio.get_running_loop()

    def fence(self) -> None:
        self.loop.call_soon_threadsafe(self.leading.clear)
        raise LostLeadership("another replica holds the Lease")


def test_a_refused_reconcile_whose_report_finds_the_lease_gone_keeps_its_worker() -> None:
    """A reconcile refused (403) says so on the job with a fenced status write; when that
    fence finds the Lease gone, the worker lives on and keeps the job for the next leader,
    as after any write that lost the lead (a dead worker would leave jobs unreconciled)."""

    async def scenario() -> tuple[BaseException | None, bool]:
        leader = _LeaseTakenOver()
        controller = Controller(OperatorSettings(), kube=None, leader=leader)  # type: ignore[arg-type]
        body = {"metadata": {"name": "demo", "namespace": "ns", "uid": "u-1"}, "spec": {}}
        controller.attach({KEY: [body]}, {}, {}, {})

        async def reconcile(key: tuple[str, str]) -> None:
            raise ApiException(status=403, reason="Forbidden")

        controller.reconcile = reconcile  # type: ignore[method-assign]
        controller.enqueue(KEY)
        worker = asyncio.ensure_future(controller._worker())
        await asyncio.sleep(0.1)
        died = worker.exception() if worker.done() else None
        worker.cancel()
        for handle in controller.timers.values():
            handle.cancel()
        return died, KEY in controller.queued

    died, kept = asyncio.run(scenario())
    assert died is None, f"the worker died: {died!r}"
    assert kept, "the job is kept for the next leader"


def test_a_deleted_jobs_series_are_dropped_once_not_on_every_pod_event_of_its_teardown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pods of a deleted job go one by one, and each of their events wakes the job: a
    64-worker job's teardown woke it some 130 times, each time on the event loop, and each
    time dropping its metric series again (13 reasons, each removal looked up in the
    environment), while other jobs waited to be planned. Its memory and series go once."""
    from torchkube.operator import controller as controller_module

    dropped: list[tuple[str, str]] = []
    monkeypatch.setattr(controller_module.metrics, "job_gone", lambda *key: dropped.append(key))
    controller = _controller()
    controller.attach({}, {}, {}, {})
    controller.memory[KEY] = JobMemory(uid="u-1")

    async def teardown() -> None:
        for _ in range(5):  # the job's pods deleted, one event each
            await controller.reconcile(KEY)

    asyncio.run(teardown())
    assert dropped == [KEY]
    assert KEY not in controller.memory, "a gone job gets no memory back"


def test_a_plan_carried_out_across_a_step_down_exports_no_series(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step-down while a plan waits for the API forgets every job and its series, and the
    lead may be back before the plan ends. Series exported then from the plan's memory, no
    longer the controller's, would outlive the job: its deletion drops the series of jobs
    the controller remembers."""
    from torchkube.operator import controller as controller_module

    planned: list[Any] = []
    monkeypatch.setattr(controller_module.metrics, "job_planned", lambda *a: planned.append(a))
    controller = Controller(OperatorSettings(), kube=_KubeTakingEverything())  # type: ignore[arg-type]
    body = {
        "metadata": {"name": "demo", "namespace": "ns", "uid": "u-1", "generation": 1},
        "spec": {"replicas": {"min": 1, "max": 1}},
    }
    controller.attach({KEY: [body]}, {}, {}, {})
    execute = controller.executor.execute

    def across_a_step_down(*args: Any) -> None:
        execute(*args)
        controller._stepped_down()  # and the lead back at once: no leader, always acting

    monkeypatch.setattr(controller.executor, "execute", across_a_step_down)
    asyncio.run(controller.reconcile(KEY))
    assert controller.acting and planned == []
