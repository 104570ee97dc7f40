"""Kubeflow's training-operator (v1.8.1, PyTorchJob) beside torchkube, on the same cluster.

The peer is installed as its own manifests install it, minus what a process outside the
cluster cannot have: its CRD from the module's ``manifests/base/crds``, the ``kubeflow``
namespace, the empty Secret its certificate rotator fills, and its
ValidatingWebhookConfiguration with ``failurePolicy: Ignore`` (the webhook Service has no
endpoints here: the apiserver then skips the call instead of refusing every PyTorchJob). The
rotator writes the certificates into the Secret; a pod would see them mounted at
controller-runtime's serving-certificate folder, so they are copied there. Then it runs as a
process with the admin kubeconfig — the same footing as the torchkube operator in these
benchmarks.

Its client to the API server is rate-limited: v1.8.1 takes controller-runtime's defaults (20
requests/s, bursts of 30) and has no flag to change them, and it creates a job's pods one
after another, so 512 pods take it at least (512 - 30) / 20 ≈ 24 s whatever the machine.
v1.9 added ``--kube-api-qps``/``--kube-api-burst``; :data:`RAISED` runs the last v1 release
with them raised, a second peer configuration beside the default one, so a ratio shows the
operators' designs and not only a default flag.

Its jobs are timed with the same pod watch as torchkube's. A PyTorchJob of N workers is one
``Master`` and N-1 ``Worker`` replicas (N pods), each with the GPUs and KWOK placement a
torchkube worker gets.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from bench.common import proc_cpu_seconds, proc_peak_rss_bytes
from bench.kube import BENCH_LABEL, CLAIM, JOB_KINDS, job_body
from testbed.kwok import kwok_toleration
from testbed.process import Process
from testbed.wait import wait_for
from torchkube.api import TrainingJob
from torchkube.api.spec import BUILTIN_TRAINER_COMMAND
from torchkube.api.worker_launch import trainer_env
from torchkube.local.ports import free_port
from torchkube.policy.queue import QUEUE_LABEL

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "kubeflow"
SECRET = "training-operator-webhook-cert"
WEBHOOK_CONFIGURATION = "validator.training-operator.kubeflow.org"
GROUP, VERSION, PLURAL = JOB_KINDS[1]
JOB_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
CERT_DIR = Path(tempfile.gettempdir()) / "k8s-webhook-server" / "serving-certs"
"""controller-runtime's default serving-certificate folder (``<temp dir>/k8s-webhook-server/
serving-certs``), where the operator's webhook server reads its key pair."""


@dataclass(frozen=True)
class PeerConfig:
    """How one Kubeflow contender runs: which release and its client's rate limit."""

    name: str
    version: str
    client_qps: int = 20
    client_burst: int = 30
    """controller-runtime's defaults, the only limits v1.8.1 can run with."""

    @property
    def flags(self) -> list[str]:
        """The client-limit flags (v1.9 on); none for v1.8.1, which has none."""
        if self.version == RELEASE:
            return []
        return [f"--kube-api-qps={self.client_qps}", f"--kube-api-burst={self.client_burst}"]

    def describe(self) -> str:
        flags = " ".join(self.flags) or "no client-limit flags (controller-runtime's defaults)"
        return (
            f"{self.name}: training-operator {self.version}, client limit {self.client_qps} "
            f"requests/s, bursts of {self.client_burst} ({flags})"
        )


RELEASE = "v1.8.1"
RAISED_VERSION = "v1.9.3"
DEFAULT = PeerConfig("Kubeflow", RELEASE)
RAISED = PeerConfig("Kubeflow, client 500/s", RAISED_VERSION, client_qps=500, client_burst=1000)
"""500 requests/s as large production clusters give kube-scheduler (bench.operator_scale's
fast-scheduler scenario); bursts of 1000 cover a 512-worker job's pods at once."""


@dataclass(frozen=True)
class Build:
    """The built operators and the module source the manifests come from (v1.8.1's)."""

    module_dir: Path
    bin_dir: Path

    @property
    def binary(self) -> Path:
        return self.binary_of(RELEASE)

    def binary_of(self, version: str) -> Path:
        suffix = "" if version == RELEASE else f"-{version}"
        return self.bin_dir / f"training-operator.v1{suffix}"


def build() -> Build:
    """Build (or find, cached by pin) the peer with ``hack/build-peers.sh``."""
    out = subprocess.run(
        [str(ROOT / "hack" / "build-peers.sh")], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"hack/build-peers.sh failed:\n{out.stderr[-3000:]}")
    module_dir, bin_dir = out.stdout.strip().splitlines()[-2:]
    return Build(Path(module_dir), Path(bin_dir))


def _manifest(build: Build, relative: str) -> list[dict[str, Any]]:
    text = (build.module_dir / "manifests" / "base" / relative).read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def install(api: Any, build: Build) -> None:
    """The PyTorchJob CRD, the namespace, the Secret, the webhook configuration."""
    ext: Any = client.ApiextensionsV1Api(api)
    core: Any = client.CoreV1Api(api)
    admission: Any = client.AdmissionregistrationV1Api(api)
    [crd] = _manifest(build, "crds/kubeflow.org_pytorchjobs.yaml")
    with contextlib.suppress(client.ApiException):
        ext.create_custom_resource_definition(crd)
    with contextlib.suppress(client.ApiException):
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    with contextlib.suppress(client.ApiException):
        core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": SECRET}})
    [webhooks] = _manifest(build, "webhook/manifests.yaml")
    webhooks["metadata"] = {"name": WEBHOOK_CONFIGURATION}
    for hook in webhooks["webhooks"]:
        hook["failurePolicy"] = "Ignore"
        hook["clientConfig"]["service"].update(name="training-operator", namespace=NAMESPACE)
    with contextlib.suppress(client.ApiException):
        admission.create_validating_webhook_configuration(webhooks)

    def established() -> bool:
        found = ext.read_custom_resource_definition(crd["metadata"]["name"])
        return any(
            c.type == "Established" and c.status == "True"
            for c in (found.status.conditions if found.status else None) or []
        )

    wait_for(established, 60, what="the PyTorchJob CRD to be Established")


class KubeflowOperator:
    """``training-operator.v1 --enable-scheme=pytorchjob`` as a process, with its ports;
    ``namespace`` confines it to one namespace (its ``--namespace``), so two configurations
    can run on one cluster without both reconciling every PyTorchJob."""

    def __init__(
        self,
        build: Build,
        kubeconfig: Path,
        log_path: Path,
        threads: int = 1,
        config: PeerConfig = DEFAULT,
        namespace: str | None = None,
    ) -> None:
        self.build = build
        self.kubeconfig = kubeconfig
        self.metrics_port, self.probe_port, self.webhook_port = (free_port() for _ in range(3))
        self.threads, self.config, self.namespace = threads, config, namespace
        self.process = Process(
            "kubeflow-training-operator",
            [
                str(build.binary_of(config.version)),
                "--enable-scheme=pytorchjob",
                *config.flags,
                *([f"--namespace={namespace}"] if namespace else []),
                f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
                f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
                f"--webhook-server-port={self.webhook_port}",
                f"--controller-threads={threads}",
                "--zap-log-level=info",
            ],
            log_path,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )

    def start(self, api: Any, timeout: float = 120) -> KubeflowOperator:
        self.process.start()
        core: Any = client.CoreV1Api(api)

        def certificates() -> dict[str, str] | None:
            self.process.check_alive()
            data = core.read_namespaced_secret(SECRET, NAMESPACE).data or {}
            return data if {"tls.crt", "tls.key"} <= set(data) else None

        data = wait_for(certificates, timeout, what="the peer's certificate rotator")
        CERT_DIR.mkdir(parents=True, exist_ok=True)
        for key in ("tls.crt", "tls.key", "ca.crt"):
            if key in data:
                (CERT_DIR / key).write_bytes(base64.b64decode(data[key]))
        wait_for(self._ready, timeout, what="the peer's /readyz")
        return self

    def restarted(self, api: Any) -> KubeflowOperator:
        """Stop this process and start a fresh one with the same build and kubeconfig."""
        self.stop()
        return KubeflowOperator(
            self.build,
            self.kubeconfig,
            self.process.log_path,
            self.threads,
            self.config,
            self.namespace,
        ).start(api)

    def _ready(self) -> bool:
        self.process.check_alive()
        try:
            url = f"http://127.0.0.1:{self.probe_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        self.process.stop()

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid)

    def peak_rss(self) -> int:
        return proc_peak_rss_bytes(self.pid)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())


def pytorchjob_body(
    name: str,
    workers: int,
    *,
    gpus: int = 1,
    group: str = "scale",
    restart: str = "OnFailure",
    queue: str | None = None,
) -> dict[str, Any]:
    """A PyTorchJob of ``workers`` pods (a Master and workers-1 Workers) placed like a
    torchkube job's workers (``gpus`` each, on the KWOK nodes labelled ``group``) and carrying
    what a user's PyTorchJob for the same training would: the trainer's command under
    torchrun, its configuration in the environment (the variables a torchkube worker gets),
    and the shared checkpoint claim mounted. Both operators' pods then ask the same of the
    API server, the scheduler (a pod with a claim is checked against it on every node) and
    the nodes; a bare template would time a lighter pod, not a faster operator. ``queue``
    names a Kueue LocalQueue (Kueue's label, which its PyTorchJob integration reads)."""
    same_job = TrainingJob.model_validate(job_body(name, workers, gpus=gpus, group=group))
    env = [{"name": key, "value": value} for key, value in trainer_env(same_job, 0).items()]
    mount = same_job.spec.checkpoint.mount_path

    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": restart,
            "template": {
                "spec": {
                    "tolerations": [kwok_toleration()],
                    "nodeSelector": {BENCH_LABEL: group},
                    "containers": [
                        {
                            "name": "pytorch",
                            "image": "torchkube/trainer:0.1.0",
                            "command": ["torchrun", "--nproc-per-node=1", *BUILTIN_TRAINER_COMMAND],
                            "env": env,
                            "resources": {"limits": {"nvidia.com/gpu": gpus}},
                            "volumeMounts": [{"name": "checkpoints", "mountPath": mount}],
                        }
                    ],
                    "volumes": [
                        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": CLAIM}}
                    ],
                }
            },
        }

    specs = {"Master": replica(1)}
    if workers > 1:
        specs["Worker"] = replica(workers - 1)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PyTorchJob",
        "metadata": {"name": name, **({"labels": {QUEUE_LABEL: queue}} if queue else {})},
        "spec": {"pytorchReplicaSpecs": specs},
    }


def create_pytorchjob(api: Any, namespace: str, body: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


def requests_total(metrics_text: str) -> float:
    """The peer's API requests so far (client-go's ``rest_client_requests_total``)."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("rest_client_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total
