"""Where the operator's CPU per pod goes: its create request, its pod watch, its planning —
each beside the least that step can cost in Python on the same machine.

Run: ``python -m bench.operator_cost`` (≈ 1.5 min on 2 cores, a 4-node cluster of its own).

On a small machine the operator's CPU during a large start is CPU the scheduler and KWOK wait
for (``operator_scale``'s "where the CPU went"): it is what stands between torchkube and the
bare client. This benchmark splits it, on an idle cluster, into the steps a start repeats per
pod, each in CPU seconds of the thread doing it (``time.thread_time``; ``time.process_time``
for the batches sent from the operator's thread pool, whose threads all count):

- **create**: ``Kube.create`` — the operator's pod create as it sends it (its body already
  JSON: ``kube._post``), through the Kubernetes client and urllib3 — one at a time, and in
  batches from the operator's thread pool at its default size (``api_concurrency``) and at
  32 (its default before), with the creates per second of each. The floor: the same body
  as one HTTP/1.1 request written to a kept TLS socket, its answer read and parsed with no
  client library at all.
- **watch event**: the pod informer's read, parse and slim of one watch event
  (``informer.follow`` over ``stream_lines`` of a urllib3 response), on a stream of the
  cluster's own pods replayed from a local socket (no TLS, no API server: the informer's own
  part); the floor: ``orjson.loads`` (the operator's JSON decoder) of the same event alone.
- **plan**: ``planner.plan`` of a 512-worker job whose pods were just created (Pending),
  as a reconcile during the start sees it; and building one worker pod's body.
- **the API server's writes**: its CPU per write of each kind a start makes (a TrainingJob
  created and its status patched, a pod, an Event), the operator stopped: what the
  operator's writes cost the cores the scheduler and the nodes start the pods with. The
  floor of the status write: the same write under a copy of the CRD without its CEL rules.

Trials are blocks of the same step repeated; the ways of creating alternate in rotated order.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import orjson
import yaml
from kubernetes import client
from urllib3.response import HTTPResponse

from bench.common import Results, command_line, log, rotated
from bench.contenders import bare_pods
from bench.kube import Stack, gpu_pools, job_body, stack
from testbed.crds import CRD_MANIFEST, install_crd
from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.api.trainingjob import GROUP, PLURAL, VERSION
from torchkube.operator import informer
from torchkube.operator.builders import worker_pod
from torchkube.operator.config import OperatorSettings
from torchkube.operator.decision import Observed
from torchkube.operator.kube import Kube
from torchkube.operator.planner import plan
from torchkube.operator.pods import NodeHealth, slim

NOWHERE = "nowhere"
"""The pool the pods ask for and no node has: they stay Pending, nothing but the API server
works on them. They are created as the bare client's are (``contenders.bare_pods``: no owner
a garbage collector would find missing and delete them for, no label the operator watches)."""
PLANNED_WORKERS = 512


def job_in(namespace: str, workers: int) -> TrainingJob:
    body = job_body("cost", workers, group=NOWHERE)
    body["metadata"] |= {"namespace": namespace, "uid": "00000000-0000-0000-0000-00000000c057"}
    return TrainingJob.model_validate(body)


def cpu_per_call(step: Callable[[], Any], calls: int, clock: Callable[[], float]) -> float:
    """CPU seconds per call of ``step`` over ``calls`` calls, by ``clock``."""
    began = clock()
    for _ in range(calls):
        step()
    return (clock() - began) / calls


class RawRequests:
    """One kept TLS connection to the API server, authenticated as the benchmark's client
    is (the kubeconfig's client certificate), and requests written and read on it by hand:
    what a create costs a Python process with no HTTP library in the way."""

    def __init__(self, configuration: Any) -> None:
        address = urlparse(configuration.host)
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
        self.host = address.netloc
        self.sock = context.wrap_socket(
            socket.create_connection((address.hostname, address.port)),
            server_hostname=address.hostname,
        )
        self.reader = self.sock.makefile("rb")

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + payload)
        status = self.reader.readline()
        headers: dict[str, str] = {}
        while (line := self.reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        if b" 201 " not in status:
            raise RuntimeError(f"create refused: {status!r}")
        return orjson.loads(self._body(headers))

    def _body(self, headers: dict[str, str]) -> bytes:
        if "content-length" in headers:
            return self.reader.read(int(headers["content-length"]))
        parts = []
        while size := int(self.reader.readline().strip(), 16):
            parts.append(self.reader.read(size))
            self.reader.readline()
        self.reader.readline()
        return b"".join(parts)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


FORMER_CONCURRENCY = 32
"""The operator's pool size before 16: measured beside the default, the reason for it."""


def measure_creates(bench: Stack, results: Results, trials: int, per_trial: int) -> None:
    """One create at a time (the operator's and the floor), and a batch from the operator's
    pool at its default size and at :data:`FORMER_CONCURRENCY`, in rotated order."""
    namespace = bench.namespace("cost")
    pools = sorted({OperatorSettings().api_concurrency, FORMER_CONCURRENCY})
    count = trials * per_trial * (2 + 2 * len(pools)) + sum(pools) + 1
    bodies = iter(bare_pods(namespace, "cost", count, 1, NOWHERE))
    """Each body is created once (a create needs a new name); no owner for the garbage
    collector to find missing and delete them for, no label the operator's watch selects."""
    raw = RawRequests(bench.cluster.api_client().configuration)
    path = f"/api/v1/namespaces/{namespace}/pods"
    serial = results.figure("create one worker pod, the operator's request, one at a time", "ms")
    floor = results.figure("create one worker pod, by hand on a kept TLS socket (the floor)", "ms")
    raw.post(path, next(bodies))
    kube = Kube(bench.cluster.api_client(), 1)

    def one_at_a_time(create: Callable[[dict[str, Any]], Any]) -> Callable[[], float]:
        return lambda: cpu_per_call(lambda: create(next(bodies)), per_trial, time.thread_time)

    ways: list[Callable[[], None]] = [
        lambda: serial.add(one_at_a_time(kube.create)() * 1e3),
        lambda: floor.add(one_at_a_time(lambda body: raw.post(path, body))() * 1e3),
    ]
    for size in pools:
        ways.append(_pool_way(bench, results, size, bodies, 2 * per_trial))
    try:
        for trial in range(trials):
            for way in rotated(ways, trial):
                way()
    finally:
        raw.close()
    bench.delete_namespace(namespace, force=True)


def _pool_way(
    bench: Stack, results: Results, size: int, bodies: Iterator[dict[str, Any]], calls: int
) -> Callable[[], None]:
    """A trial of ``calls`` creates sent at once from an operator pool of ``size`` threads:
    the CPU per create (every thread of this process counts: the pool's are the ones
    working) and the creates per second."""
    cpu = results.figure(f"create one worker pod, the operator's request, {size} threads", "ms")
    rate = results.figure(f"creates per second, the operator's pool of {size} threads", "/s")
    kube = Kube(bench.cluster.api_client(), size)
    kube.create_all([next(bodies) for _ in range(size)])  # the pool's connections

    def trial() -> None:
        batch = [next(bodies) for _ in range(calls)]
        began, started = time.process_time(), time.monotonic()
        kube.create_all(batch)
        cpu.add((time.process_time() - began) / calls * 1e3)
        rate.add(calls / (time.monotonic() - started))

    return trial


def replayed(events: list[bytes]) -> HTTPResponse:
    """A urllib3 response streaming ``events`` as the API server does a watch (one chunk per
    event), from a local socket."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events)
    ours, theirs = socket.socketpair()

    def serve() -> None:
        with theirs:
            theirs.sendall(head + b"\r\n" + chunks + b"0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    response = http.client.HTTPResponse(ours, method="GET")
    response.begin()
    return HTTPResponse(
        body=response,
        headers=dict(response.getheaders()),
        status=response.status,
        preload_content=False,
        decode_content=False,
        original_response=response,
    )  # fmt: skip


def measure_watch_and_plan(bench: Stack, results: Results, trials: int) -> None:
    namespace = bench.namespace("cost")
    created = bare_pods(namespace, "cost", PLANNED_WORKERS, 1, NOWHERE)
    Kube(bench.cluster.api_client(), OperatorSettings().api_concurrency).create_all(created)
    listed = bench.core.list_namespaced_pod(namespace, _preload_content=False)
    job = job_in(namespace, PLANNED_WORKERS)
    pods = [as_the_jobs(job, pod) for pod in json.loads(listed.data)["items"]]
    events = [json.dumps({"type": "MODIFIED", "object": pod}).encode() + b"\n" for pod in pods]
    results.extra["watch_event_bytes"] = round(sum(map(len, events)) / len(events))
    watched = results.figure("pod watch, one event read, parsed and slimmed by the informer", "ms")
    decoded = results.figure("pod watch, one event's JSON decoded alone (the floor)", "ms")
    planned = results.figure(
        f"plan a {PLANNED_WORKERS}-worker job whose pods were just created", "ms"
    )
    built = results.figure("build one worker pod's body", "ms")
    observed = Observed(
        job=job,
        pods=[slim(pod, owned=True) for pod in pods],
        nodes={f"n{index}": NodeHealth(True, None) for index in range(100)},
        now=datetime.now(UTC),
    )
    plan(observed)
    for _ in range(trials):
        watched.add(_follow_cpu(events) * 1e3)
        decoded.add(cpu_per_call(_decoder(events), len(events), time.thread_time) * 1e3)
        planned.add(cpu_per_call(lambda: plan(observed), 10, time.thread_time) * 1e3)
        built.add(_build_cpu(job) * 1e3)
    bench.delete_namespace(namespace, force=True)


def as_the_jobs(job: TrainingJob, pod: dict[str, Any]) -> dict[str, Any]:
    """A pod as the API server returned it, with the labels and owner torchkube gives the
    worker of its slot: what the operator's watch shows of the job's pods (they are created
    without them, see :func:`measure_watch_and_plan`)."""
    made = worker_pod(job, int(pod["metadata"]["labels"][lbl.REPLICA_INDEX]), "cost")
    ours = {key: made["metadata"][key] for key in ("labels", "ownerReferences")}
    return {**pod, "metadata": {**pod["metadata"], **ours}}


def _follow_cpu(events: list[bytes]) -> float:
    response = replayed(events)
    seen: list[informer.Changed] = []
    began = time.thread_time()
    lines = informer.stream_lines(response.stream(amt=None, decode_content=False))
    informer.follow(lines, informer.Position("1"), seen.append)
    spent = time.thread_time() - began
    if len(seen) != len(events):
        raise RuntimeError(f"the replay delivered {len(seen)} of {len(events)} events")
    return spent / len(events)


def _build_cpu(job: TrainingJob) -> float:
    """CPU per worker pod body, the job's every slot built once."""
    began = time.thread_time()
    for index in range(PLANNED_WORKERS):
        worker_pod(job, index, "b")
    return (time.thread_time() - began) / PLANNED_WORKERS


def _decoder(events: list[bytes]) -> Callable[[], Any]:
    lines = iter(events)
    return lambda: orjson.loads(next(lines))


NOBODY = "torchkube-bench-nobody"
"""The scheduler the API server's pods name: none runs, so nothing but the API server (and
etcd) works on their creates."""
Rule = dict[str, str]


def immutability(rule: Rule) -> bool:
    """A rule that refuses a change of a field set at creation (its message says so:
    ``torchkube.api.spec.immutable_message``, and spec.managedBy's)."""
    return " is immutable" in rule["message"]


COPIES: dict[str, Callable[[Rule], bool]] = {
    "norules.bench.torchkube.io": lambda rule: False,
    "mutable.bench.torchkube.io": lambda rule: not immutability(rule),
}
"""Copies of the TrainingJob CRD by group, with the CEL rules each keeps: none (the floor of
a write of the same custom resource), and all but the immutability rules."""
NO_RULES_GROUP, MUTABLE_GROUP = COPIES


def with_rules(node: Any, keep: Callable[[Rule], bool]) -> Any:
    """A CRD schema (or a part of one) with only the ``x-kubernetes-validations`` rules
    ``keep`` keeps."""
    if isinstance(node, dict):
        out = {k: with_rules(v, keep) for k, v in node.items()}
        kept = [rule for rule in node.get("x-kubernetes-validations", []) if keep(rule)]
        out.pop("x-kubernetes-validations", None)
        return out | ({"x-kubernetes-validations": kept} if kept else {})
    if isinstance(node, list):
        return [with_rules(v, keep) for v in node]
    return node


def install_copies(bench: Stack, scratch: Path) -> None:
    """The TrainingJob CRD again under each group of :data:`COPIES`, with its rules."""
    for group, keep in COPIES.items():
        crd = with_rules(yaml.safe_load(CRD_MANIFEST.read_text()), keep)
        crd["spec"]["group"] = group
        crd["metadata"] = {"name": f"{PLURAL}.{group}"}
        manifest = scratch / f"crd-{group}.yaml"
        manifest.write_text(yaml.safe_dump(crd))
        install_crd(bench.api, manifest)


def measure_api_server(bench: Stack, results: Results, trials: int, per_trial: int) -> None:
    """The API server's CPU per write the operator makes while a job starts — a TrainingJob
    created, its status merge-patched (as shipped, and under copies of the CRD without its
    CEL rules, the floor of the same custom resource, and without its immutability rules),
    a worker pod created, an Event posted — blocks of ``per_trial`` writes one at a time,
    in rotated order. The operator is stopped first: its reconcile of the jobs would be
    counted with them."""
    bench.operator.stop()
    namespace = bench.namespace("apicost")
    custom = client.CustomObjectsApi(bench.api)
    count = trials * (per_trial + per_trial // 2)
    pods = iter(bare_pods(namespace, "apicost", count, 1, NOWHERE))
    names = iter(range(2 * count))
    for group in (GROUP, *COPIES):
        for index in range(per_trial):
            body = job_body(f"patched-{index}", 8) | {"apiVersion": f"{group}/{VERSION}"}
            custom.create_namespaced_custom_object(group, VERSION, namespace, PLURAL, body)
    generation = iter(range(1, 10 * count))

    def patch_status(group: str) -> Callable[[int], Any]:
        return lambda index: custom.patch_namespaced_custom_object_status(
            group, VERSION, namespace, PLURAL, f"patched-{index}",
            {"status": {"observedGeneration": next(generation)}},
        )  # fmt: skip

    def create_job(index: int) -> None:
        body = job_body(f"created-{next(names)}", 8)
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def create_pod(index: int) -> None:
        body = next(pods)
        body["spec"]["schedulerName"] = NOBODY
        bench.core.create_namespaced_pod(namespace, body)

    def post_event(index: int) -> None:
        bench.core.create_namespaced_event(namespace, {
            "metadata": {"name": f"cost-{next(names)}"},
            "involvedObject": {"kind": "TrainingJob", "name": "patched-0", "namespace": namespace},
            "reason": "Created", "message": "created service cost and checkpoint volume",
            "type": "Normal", "source": {"component": "torchkube-operator"},
        })  # fmt: skip

    writes = {
        "TrainingJob status merge patch": patch_status(GROUP),
        "TrainingJob status merge patch, the CRD without its CEL rules (the floor)": (
            patch_status(NO_RULES_GROUP)
        ),
        "TrainingJob status merge patch, the CRD without its immutability rules": (
            patch_status(MUTABLE_GROUP)
        ),
        "TrainingJob create": create_job,
        "worker pod create (no scheduler picks it up)": create_pod,
        "Event create": post_event,
    }
    figures = {what: results.figure(f"API server CPU per write: {what}", "ms") for what in writes}

    def block(what: str) -> Callable[[], None]:
        """``per_trial`` writes measured, after half as many that are not: the API server's
        garbage collector works off the previous block's garbage during those, which would
        otherwise count as this block's."""

        def run() -> None:
            write = writes[what]
            for index in range(per_trial // 2):
                write(index)
            before = bench.component_cpu_seconds()["kube-apiserver"]
            for index in range(per_trial):
                write(index)
            spent = bench.component_cpu_seconds()["kube-apiserver"] - before
            figures[what].add(spent / per_trial * 1e3)

        return run

    for trial in range(trials):
        for way in rotated([block(what) for what in writes], trial):
            way()
    bench.delete_namespace(namespace, force=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_cost", description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--per-trial", type=int, default=64, help="creates per trial and way")
    parser.add_argument(
        "--api-writes",
        type=int,
        default=256,
        help="API server writes measured per trial and kind (after half as many that are not)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = Results(
        "operator_cost", command_line("bench.operator_cost", argv), config=dict(vars(args))
    )
    results.notes += [
        "CPU milliseconds of the thread doing the step (time.thread_time), per call; the "
        "pooled creates (a batch twice a trial's size): of the whole process "
        "(time.process_time), whose pool threads do "
        "them; an idle 4-node cluster, pods in a pool no node has (they stay Pending)",
        "create: the operator's Kube.create of a worker pod body built by its pod builder, "
        "through the Kubernetes client and urllib3, its answer parsed; the floor: the same "
        "body as one HTTP/1.1 request written by hand to a kept TLS socket (the kubeconfig's "
        "client certificate), its answer read by hand and parsed with orjson.loads; trials "
        "alternate in rotated order",
        "watch: the informer's follow() over a urllib3 response streaming the cluster's own "
        "pods as MODIFIED events, one chunk each, from a local socket (no TLS); the floor: "
        "orjson.loads (the operator's decoder) of each event alone",
        f"plan: planner.plan of a {PLANNED_WORKERS}-worker job with its {PLANNED_WORKERS} "
        "pods just created (Pending, as the API server returned them with torchkube's "
        "labels and owner for each slot, slimmed as the informer keeps them), 100 Ready "
        "nodes; the pods are created as the bare client's are, with no owner the garbage "
        "collector would delete them for",
        "API server CPU per write: kube-apiserver's CPU seconds (/proc) over a block of "
        "--api-writes writes sent one at a time through the Kubernetes client, ÷ the writes; "
        "etcd's and the watchers' work is not in it; the operator stopped (its reconcile of "
        "the jobs would count), so its own watch is not served either; the status patch "
        "changes observedGeneration alone (the API server validates the whole object on "
        "every write); the floor: the same patch of the same TrainingJobs under a copy of "
        "the CRD with no x-kubernetes-validations rule; without its immutability rules: a "
        "copy with every rule but those whose message says a field is immutable; the pods "
        "name a scheduler that does not run; blocks alternate in rotated order, each after "
        "half as many writes of its kind "
        "not measured (the API server's garbage collector works off the previous block's "
        "garbage during them)",
    ]
    with (
        tempfile.TemporaryDirectory(prefix="torchkube-bench-") as scratch,
        stack(gpu_pools(4, 2), Path(scratch)) as bench,
    ):
        log("creates")
        measure_creates(bench, results, args.trials, args.per_trial)
        log("watch events and plans")
        measure_watch_and_plan(bench, results, args.trials)
        log("the API server's CPU per write (the operator stopped)")
        install_copies(bench, Path(scratch))
        measure_api_server(bench, results, args.trials, args.api_writes)
    results.write()


if __name__ == "__main__":
    main()
