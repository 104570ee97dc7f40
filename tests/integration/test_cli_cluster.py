"""The cluster commands against the real control plane, with the real operator reconciling.

Every command runs as a user would type it (click's CliRunner over ``torchkube.cli.main``, plus
one real subprocess), pointed at the test cluster with ``--kubeconfig``/``-n``; the assertions
read what the command printed, and the API only where the printed text cannot show it.

Logs need a kubelet, and KWOK nodes have none: the apiserver would dial the node's made-up
address. So the logs test gives its own pool's nodes the address 127.0.0.1 and the port of a
small HTTPS "kubelet" run here that serves ``/containerLogs/...`` -- the real apiserver proxies
to it exactly as to a kubelet, follow, tail and timestamps included. What is faked is only
the text of the log.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from kube_jobs import job_manifest
from kubernetes import client
from stub_http import Reply, StubServer

from testbed import faults
from testbed.kwok import NodePool
from testbed.operator import OperatorProcess
from testbed.volumes import delete_volume, prebound_volume
from testbed.wait import wait_for
from torchkube.api import GROUP, PLURAL, VERSION
from torchkube.api import labels as lbl
from torchkube.cli.main import main
from torchkube.local.ports import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


class Torchkube:
    """``torchkube ARGS --kubeconfig K -n NS`` through CliRunner, with the output kept apart."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kubeconfig, self.namespace = kubeconfig, namespace

    def __call__(self, *args: str, namespace: str | None = None) -> Result:
        target = ["--kubeconfig", str(self.kubeconfig), "-n", namespace or self.namespace]
        result = CliRunner().invoke(main, [*args, *target])
        if result.exception and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"torchkube {' '.join(args)} raised") from result.exception
        return result

    def ok(self, *args: str) -> str:
        result = self(*args)
        assert result.exit_code == 0, f"torchkube {' '.join(args)}: {result.output}"
        return result.stdout

    def row(self, name: str) -> dict[str, str]:
        """The job's row of ``torchkube status``, by column header."""
        header, *rows = self.ok("status", name).splitlines()
        columns = header.split()
        return dict(zip(columns, rows[0].split(), strict=False)) if rows else {}

    def wait_row(self, name: str, timeout: float = 60, **expected: str) -> dict[str, str]:
        """Poll ``torchkube status NAME`` until its columns show ``expected``."""
        last: dict[str, str] = {}

        def matches() -> dict[str, str] | None:
            nonlocal last
            last = self.row(name)
            return last if all(last.get(k) == v for k, v in expected.items()) else None

        started = time.monotonic()
        row: dict[str, str] = wait_for(
            matches,
            timeout,
            interval=0.3,
            what=f"status {expected}",
            describe_last=lambda: f"{last}",
        )
        print(f"status {name} {expected} after {time.monotonic() - started:.1f}s")
        return row


def one_sentence(result: Result) -> str:
    """The error a user sees: one line on stderr, no traceback, nothing on stdout."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


def job_yaml(path: Path, name: str, pool: NodePool, **spec: Any) -> Path:
    spec.setdefault("replicas", {"min": 1, "max": 2})
    path.write_text(yaml.safe_dump(job_manifest(name, pool, **spec)))
    return path


@pytest.fixture
def tk(kubeconfig: Path, namespace: str) -> Torchkube:
    return Torchkube(kubeconfig, namespace)


@pytest.fixture
def volumes(api_client: Any, namespace: str, tmp_path: Path) -> Iterator[Callable[[str], None]]:
    """Pre-bound volumes for jobs' checkpoint claims (the test cluster has no provisioner)."""
    made: list[str] = []

    def for_job(name: str) -> None:
        claim = f"{name}-checkpoints"
        made.append(prebound_volume(api_client, namespace, claim, str(tmp_path / claim)))

    yield for_job
    for volume in made:
        delete_volume(api_client, volume)


def worker_pods(api_client: Any, namespace: str, name: str) -> list[Any]:
    selector = f"{lbl.JOB_NAME}={name},{lbl.ROLE}={lbl.ROLE_WORKER}"
    pods = client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=selector)
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


def test_a_jobs_life_through_the_cli(
    tk: Torchkube,
    operator: OperatorProcess,
    isolated_pool: Callable[..., NodePool],
    volumes: Callable[[str], None],
    api_client: Any,
    namespace: str,
    tmp_path: Path,
) -> None:
    pool = isolated_pool(nodes=2)
    volumes("life")
    manifest = job_yaml(tmp_path / "life.yaml", "life", pool)
    started = time.monotonic()

    dry = tk.ok("submit", "--dry-run", str(manifest)).strip()
    assert dry == "trainingjob.torchkube.io/life created (server dry run)"
    assert "not found" in one_sentence(tk("status", "life"))
    assert tk.ok("submit", str(manifest)).strip() == "trainingjob.torchkube.io/life created"
    again = one_sentence(tk("submit", str(manifest)))
    assert "already exists" in again and "torchkube delete life" in again

    tk.wait_row("life", PHASE="Running", WORKERS="2/2")
    listed = tk.ok("status")
    assert listed.splitlines()[0].split() == [
        "NAME",
        "PHASE",
        "WORKERS",
        "RESTARTS",
        "STEP",
        "REMAINING",
        "LOSS",
        "CHECKPOINT",
        "GOODPUT",
        "AGE",
    ]
    as_json = yaml.safe_load(tk.ok("status", "life", "-o", "json"))
    assert as_json["status"]["phase"] == "Running" and "managedFields" not in as_json["metadata"]

    # Scale down and back up through the scale subresource.
    assert "scaled to 1" in tk.ok("scale", "life", "--replicas", "1")
    tk.wait_row("life", PHASE="Running", WORKERS="1/1")
    refused = one_sentence(tk("scale", "life", "--replicas", "3"))
    assert "replicas.desired" in refused and "min 1, max 2" in refused, refused
    assert "scaled to 2" in tk.ok("scale", "life", "--replicas", "2")
    tk.wait_row("life", PHASE="Running", WORKERS="2/2")

    # Suspend deletes the pods; resume brings them back.
    assert tk.ok("suspend", "life").strip() == "trainingjob.torchkube.io/life suspended"
    tk.wait_row("life", PHASE="Suspended")
    t0 = time.monotonic()
    wait_for(lambda: not worker_pods(api_client, namespace, "life"), 30, what="no workers")
    print(f"suspended workers gone after {time.monotonic() - t0:.1f}s")
    no_logs = one_sentence(tk("logs", "life"))
    assert "no worker pod" in no_logs and "Suspended" in no_logs
    assert tk.ok("resume", "life").strip() == "trainingjob.torchkube.io/life resumed"
    tk.wait_row("life", PHASE="Running", WORKERS="2/2")

    # A worker fails: describe shows the failure, the conditions and the events.
    victim = next(
        p
        for p in worker_pods(api_client, namespace, "life")
        if p.metadata.labels[lbl.REPLICA_INDEX] == "1"
    )
    faults.fail_pod(api_client, victim.metadata.name, namespace, exit_code=137)
    tk.wait_row("life", RESTARTS="1")
    tk.wait_row("life", PHASE="Running", WORKERS="2/2")

    def described() -> str | None:
        text = tk.ok("describe", "life")
        return text if "WorkerFailed" in text else None

    t0 = time.monotonic()
    text = wait_for(described, 30, what="a WorkerFailed event in describe")
    print(f"WorkerFailed in describe after {time.monotonic() - t0:.1f}s")
    headings = ["Spec:", "Conditions:", "Failures (last 1, oldest first):", "Pods:", "Events:"]
    assert [line for line in text.splitlines() if line in headings] == headings
    failures = text.split("Failures (last 1, oldest first):")[1].split("Pods:")[0]
    assert victim.metadata.name in failures and "ExitCode" in failures and "137" in failures
    conditions = text.split("Conditions:")[1].split("Failures")[0]
    assert "Running" in conditions and "True" in conditions
    assert re.search(r"^Restarts:\s+1 \(1 of maxRestarts 10 used\)$", text, re.MULTILINE)

    # Delete removes the job. Its pods follow through the garbage collector, which notices a
    # CRD installed after it started only on its next discovery (up to 30 s), so this test
    # checks that they are the job's dependents instead of waiting for that.
    uid = yaml.safe_load(tk.ok("status", "life", "-o", "yaml"))["metadata"]["uid"]
    assert tk.ok("delete", "life").strip() == 'trainingjob.torchkube.io "life" deleted'
    gone = one_sentence(tk("status", "life"))
    assert 'TrainingJob "life" not found in namespace' in gone
    for pod in worker_pods(api_client, namespace, "life"):
        assert [o.uid for o in pod.metadata.owner_references if o.controller] == [uid]
    print(f"life cycle through the CLI: {time.monotonic() - started:.1f}s")


def test_invalid_job_is_refused_before_the_cluster_sees_it(
    tk: Torchkube, crd: dict[str, Any], tmp_path: Path, api_client: Any, namespace: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: torchkube.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: bad}\n"
        "spec:\n  replicas: {min: 3, max: 2}\n  checkpiont: {size: 1Gi}\n"
    )
    result = tk("submit", str(bad))
    assert result.exit_code == 2 and result.stdout == ""
    assert "Traceback" not in result.output
    assert (
        "bad.yaml: spec.replicas: replicas.min (3) must be less than or equal to" in result.stderr
    )
    assert "bad.yaml: spec.checkpiont: unknown field" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: {bad} is not a valid TrainingJob (2 problems above); nothing was submitted"
    )
    custom = client.CustomObjectsApi(api_client)
    assert custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"] == []

    broken = tmp_path / "broken.yaml"
    broken.write_text("metadata: {name: x\nspec: [\n")
    message = one_sentence(tk("submit", str(broken)))
    assert "broken.yaml is not valid YAML (line" in message


def test_api_errors_are_one_sentence(
    tk: Torchkube, crd: dict[str, Any], tmp_path: Path, kubeconfig: Path
) -> None:
    pool = NodePool(name="unused")
    manifest = job_yaml(tmp_path / "job.yaml", "nowhere", pool)
    missing_ns = one_sentence(tk("submit", str(manifest), namespace="does-not-exist"))
    assert 'namespace "does-not-exist" does not exist' in missing_ns
    assert "-n/--namespace" in missing_ns

    # A server that is not there: the same kubeconfig pointed at a closed port.
    config = yaml.safe_load(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(main, ["status", "--kubeconfig", str(dead)])
    unreachable = one_sentence(result)
    assert "cannot reach the API server at https://127.0.0.1:" in unreachable
    assert "connection refused" in unreachable

    # A real process, as typed: a wrong kubeconfig path.
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "nope.kubeconfig")}
    proc = subprocess.run(
        [sys.executable, "-m", "torchkube.cli", "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == (
        f"Error: kubeconfig {tmp_path / 'nope.kubeconfig'} does not exist; pass --kubeconfig "
        "PATH or set KUBECONFIG (hack/dev-cluster up prints the path of a local test "
        "cluster's)"
    )


# --- logs through the real apiserver ------------------------------------------------------


class FakeKubelet:
    """An HTTPS server on 127.0.0.1 answering the apiserver's container-log requests.

    ``logs[pod]`` is a list of (timestamp, text) lines. It honours ``tailLines``,
    ``timestamps`` and ``follow`` (streamed a line at a time, then the container "ends").
    The apiserver does not verify a kubelet's certificate unless told a CA, so a self-signed
    one does.
    """

    def __init__(self, workdir: Path) -> None:
        self.logs: dict[str, list[tuple[str, str]]] = {}
        self.server = StubServer(self._answer, tls=self._self_signed(workdir))
        self.requests = self.server.requests
        self.port = self.server.port

    def _answer(self, path: str) -> Reply | None:
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        parts = url.path.split("/")  # ['', 'containerLogs', ns, pod, container]
        lines = self.logs.get(parts[3]) if len(parts) == 5 else None
        if lines is None:
            return None
        tail = int(query.get("tailLines", ["-1"])[0])
        if tail >= 0:
            lines = lines[len(lines) - tail :] if tail < len(lines) else lines
        stamped = query.get("timestamps") == ["true"]
        follow = query.get("follow") == ["true"]

        def stream() -> Iterator[bytes]:
            for when, text in lines:
                yield f"{when + ' ' if stamped else ''}{text}\n".encode()
                if follow:
                    time.sleep(0.05)

        return Reply(stream(), "text/plain")

    @staticmethod
    def _self_signed(workdir: Path) -> tuple[Path, Path]:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-kubelet")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .sign(key, hashes.SHA256())
        )
        cert_path, key_path = workdir / "kubelet.crt", workdir / "kubelet.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return cert_path, key_path

    def serve_nodes(self, api: Any, nodes: list[str]) -> None:
        """Point the nodes' kubelet address at this server (KWOK leaves the fields alone)."""
        core = client.CoreV1Api(api)
        for node in nodes:
            patch = {
                "status": {
                    "addresses": [
                        {"type": "InternalIP", "address": "127.0.0.1"},
                        {"type": "Hostname", "address": node},
                    ],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                }
            }
            core.patch_node_status(node, patch, _content_type="application/merge-patch+json")

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    server = FakeKubelet(tmp_path)
    yield server
    server.close()


def test_logs_find_rank0_and_follow(
    tk: Torchkube,
    operator: OperatorProcess,
    isolated_pool: Callable[..., NodePool],
    volumes: Callable[[str], None],
    kubelet: FakeKubelet,
    api_client: Any,
    namespace: str,
    tmp_path: Path,
) -> None:
    pool = isolated_pool(nodes=2)
    kubelet.serve_nodes(api_client, pool.node_names())
    volumes("logs")
    tk.ok("submit", str(job_yaml(tmp_path / "logs.yaml", "logs", pool)))
    tk.wait_row("logs", PHASE="Running", WORKERS="2/2")
    by_slot = {
        int(p.metadata.labels[lbl.REPLICA_INDEX]): p.metadata.name
        for p in worker_pods(api_client, namespace, "logs")
    }
    # Rank 0 used to be in slot 0; after a re-rendezvous slot 1 holds it, and slot 0's process
    # is rank 1 now (its newest lines carry the rank tag).
    kubelet.logs[by_slot[0]] = [
        ("2026-01-01T10:00:00.100000000Z", "10:00:00 INFO torchkube: step 5/100 | loss 4.1000"),
        ("2026-01-01T10:05:00Z", "10:05:00 WARNING torchkube [rank 1]: world size changed"),
    ]
    kubelet.logs[by_slot[1]] = [
        ("2026-01-01T10:04:59.5Z", "10:04:59 INFO torchkube: resumed from step 5"),
        ("2026-01-01T10:05:01.25Z", "10:05:01 INFO torchkube: step 6/100 | loss 4.0000"),
        ("2026-01-01T10:05:02.5Z", "10:05:02 INFO torchkube: step 7/100 | loss 3.9000"),
    ]

    rank0 = tk("logs", "logs")
    assert rank0.exit_code == 0, rank0.output
    assert f"# {by_slot[1]} (worker slot 1: its log shows rank 0)" in rank0.stderr
    assert rank0.stdout.splitlines() == [t for _, t in kubelet.logs[by_slot[1]]]

    slot0 = tk("logs", "logs", "--worker", "0", "--tail", "1")
    assert slot0.stdout.splitlines() == [kubelet.logs[by_slot[0]][-1][1]]
    assert any("tailLines=1" in r for r in kubelet.requests)

    everyone = tk.ok("logs", "logs", "--all")
    assert everyone.splitlines() == [
        f"[{by_slot[slot]}] {text}" for slot in (0, 1) for _, text in kubelet.logs[by_slot[slot]]
    ]

    followed = tk("logs", "logs", "-f", "--all", "--tail", "2")
    assert followed.exit_code == 0, followed.output
    assert sorted(followed.stdout.splitlines()) == sorted(
        f"[{by_slot[slot]}] {text}"
        for slot in (0, 1)
        for _, text in kubelet.logs[by_slot[slot]][-2:]
    )
    assert followed.stderr.count("log stream ended") == 2
    assert sum("follow=true" in r for r in kubelet.requests) == 2

    missing = one_sentence(tk("logs", "logs", "--worker", "7"))
    assert "no worker in slot 7 (slots: 0, 1)" in missing
