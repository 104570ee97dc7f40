"""The operator's creates against a small HTTP server standing in for the API server: what is
sent, how each answer is read, and that the body goes out as the operator's own dict.

A 64-worker start is 66 creates; through the client's generated methods each one validated
the dict into the client's model objects (pydantic) and dumped them back — about half of the
create's CPU in the operator, which shares its cores with the control plane on small machines.
"""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchkube.operator import kube as kube_module

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "demo-worker-0-abcde", "namespace": "ns", "labels": {"a": "b"}},
    "spec": {"containers": [{"name": "trainer", "image": "torchkube/trainer:dev"}]},
}


class _Answers(BaseHTTPRequestHandler):
    """Answers each POST with the next (status, body) of ``server.answers``."""

    server: "_Server"

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.server.received.append(
            (self.path, self.headers["Content-Type"], json.loads(self.rfile.read(length)))
        )
        status, body = self.server.answers.pop(0)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    received: list[tuple[str, str, Any]]
    answers: list[tuple[int, Any]]


@pytest.fixture
def server() -> Iterator[_Server]:
    http = _Server(("127.0.0.1", 0), _Answers)
    http.received, http.answers = [], []
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield http
    http.shutdown()
    http.server_close()


@pytest.fixture
def kube(server: _Server, monkeypatch: pytest.MonkeyPatch) -> kube_module.Kube:
    def generated(*_: Any, **__: Any) -> None:
        raise AssertionError("a create went through the client's generated method")

    for method in ("create_namespaced_pod", "create_namespaced_service"):
        monkeypatch.setattr(client.CoreV1Api, method, generated)
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    return kube_module.Kube(client.ApiClient(configuration), concurrency=2)


def test_a_create_sends_the_dict_and_returns_the_servers_object(
    server: _Server, kube: kube_module.Kube
) -> None:
    created = {**POD, "metadata": {**POD["metadata"], "uid": "u-1", "resourceVersion": "7"}}
    server.answers.append((201, created))
    result = kube.create(POD)
    assert result == kube_module.CreateResult(body=created)
    assert server.received == [("/api/v1/namespaces/ns/pods", "application/json", POD)]


def test_each_kind_goes_to_its_own_collection(server: _Server, kube: kube_module.Kube) -> None:
    service = {"kind": "Service", "metadata": {"name": "demo", "namespace": "ns"}}
    claim = {"kind": "PersistentVolumeClaim", "metadata": {"name": "ckpt", "namespace": "ns"}}
    server.answers += [(201, service), (201, claim)]
    kube.create(service)
    kube.create(claim)
    assert [path for path, _, _ in server.received] == [
        "/api/v1/namespaces/ns/services",
        "/api/v1/namespaces/ns/persistentvolumeclaims",
    ]


def test_a_conflict_is_an_existing_object_and_a_refusal_is_reported(
    server: _Server, kube: kube_module.Kube
) -> None:
    refused = {"kind": "Status", "message": 'pods "x" is forbidden: exceeded quota'}
    server.answers += [(409, {"kind": "Status"}), (403, refused)]
    assert kube.create(POD) == kube_module.CreateResult(existed=True)
    result = kube.create(POD)
    assert result.refused is not None and result.refused.status == 403
    assert kube_module.api_message(result.refused) == refused["message"]


@pytest.mark.parametrize("status", [429, 500])
def test_a_create_refused_for_the_moment_raises(
    server: _Server, kube: kube_module.Kube, status: int
) -> None:
    server.answers.append((status, {"kind": "Status"}))
    with pytest.raises(ApiException) as raised:
        kube.create(POD)
    assert raised.value.status == status


def test_creates_in_parallel_keep_their_order(server: _Server, kube: kube_module.Kube) -> None:
    pods = [{**POD, "metadata": {**POD["metadata"], "name": f"w-{i}"}} for i in range(6)]
    server.answers += [(201, {"kind": "Pod"})] * 6
    results = kube.create_all(pods)
    assert len(results) == 6 and all(r.body == {"kind": "Pod"} for r in results)
    assert sorted(body["metadata"]["name"] for _, _, body in server.received) == [
        f"w-{i}" for i in range(6)
    ]


def test_the_body_goes_out_without_the_clients_sanitizer(
    server: _Server, kube: kube_module.Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's sanitizer copies a body key by key to turn its model objects into JSON
    (5% of the operator's GIL samples over nine 64-worker starts); the operator's bodies are
    JSON already (the test below), and go out as they are."""
    sanitized: list[Any] = []
    sanitize = client.ApiClient.sanitize_for_serialization

    def recording(self: client.ApiClient, obj: Any) -> Any:
        sanitized.append(obj)
        return sanitize(self, obj)

    monkeypatch.setattr(client.ApiClient, "sanitize_for_serialization", recording)
    server.answers.append((201, {"kind": "Pod"}))
    kube.create(POD)
    assert server.received == [("/api/v1/namespaces/ns/pods", "application/json", POD)]
    assert not any(obj is POD for obj in sanitized)


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"failurePolicy": {"recovery": "live"}, "replicas": {"min": 2, "max": 2}},
        {"data": {"source": {"claim": {"name": "corpus", "path": "texts"}}}},
        {
            "scheduling": {
                "priorityClassName": "high",
                "podTemplate": {
                    "labels": {"team": "a"},
                    "annotations": {"note": "b"},
                    "spec": {"volumes": [{"name": "data", "emptyDir": {}}], "hostNetwork": True},
                },
            }
        },
    ],
)
def test_every_object_the_operator_creates_is_plain_json(spec: dict[str, Any]) -> None:
    """What lets a create skip the sanitizer: each body the builders make is plain JSON
    already (no model object, date or tuple in it; a StrEnum is written as its string
    either way)."""
    from training_jobs import training_job

    from torchkube.operator import builders

    job = training_job(**spec)
    bodies = [
        builders.worker_pod(job, 0, "a"),
        builders.rendezvous_pod(job, "a"),
        builders.lighthouse_pod(job, "a"),
        builders.checkpoint_claim(job),
        *builders.services(job),
        *([builders.prepare_pod(job, 1)] if job.spec.data else []),
    ]
    for body in bodies:
        assert json.loads(json.dumps(body)) == body, body["kind"]
