"""Kueue, the real one, beside a test cluster: its CRDs, its webhooks and its controller manager
as a local process on 127.0.0.1.

Kueue normally runs in a pod behind a Service; here the apiserver reaches its webhooks (and its
CRD conversion webhook) by URL on loopback, and its on-demand visibility API (pending workloads
and their positions, an aggregated API) through an ExternalName Service for ``localhost``. The
process runs in a folder of its own as its root (``chroot``), as in its container: its
visibility server keeps its serving certificate under the fixed path ``/visibility``, which
lands in that folder, not at the root of this machine.

Kueue's internal certificate management stays on, as in a real install, but finds its Secret
already filled: a CA and a serving certificate that also names 127.0.0.1, which the rotator
accepts as valid (it only regenerates what does not verify for its service name) and injects
as the CA bundle of every webhook. Only Kueue's webhooks for its own API group are registered,
and those of the frameworks a caller asks for (``frameworks``, e.g. Kubeflow's PyTorchJob for a
benchmark beside it): the others, for pods and Jobs, would put a live Kueue in the path of
every pod the rest of the test session creates.

TrainingJobs are an *external framework* (``integrations.externalFrameworks``): torchkube's
operator manages their Workloads itself, as Kueue's jobframework does for its built-in kinds.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import ipaddress
import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.cluster import Cluster
from testbed.errors import ClusterError
from testbed.process import Process
from testbed.wait import WaitTimeout, wait_for
from torchkube.local.ports import free_port

NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
CA_NAME = "kueue-ca"
"""The names Kueue's certificate rotator checks its CA and serving certificate against."""
CONVERTED_CRDS = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
"""The CRDs whose conversion webhook the rotator injects its CA into (it fails without one)."""
EXTERNAL_FRAMEWORK = "TrainingJob.v1alpha1.torchkube.io"
FEATURE_GATES = {
    "PartialAdmission": True,
    "ElasticJobsViaWorkloadSlices": True,
    "VisibilityOnDemand": True,
    "MultiKueue": True,
    "MultiKueueAdaptersForCustomJobs": True,
}
"""Partial admission lets Kueue admit an elastic job below replicas.max; workload slices let
a job annotated ``kueue.x-k8s.io/elastic-job`` be resized under quota; the on-demand
visibility API reports a waiting job's place in line; MultiKueue dispatches the jobs of a
ClusterQueue with a MultiKueue admission check to worker clusters, the TrainingJob among them
through the adapter for custom jobs (all as a real install sets them: all but the workload
slices are on by default in v0.17, named here so that a change of default cannot silently
turn the MultiKueue tests into something else)."""
WORKER_LOST_TIMEOUT_S = 30
"""How long MultiKueue keeps a job admitted on a worker it lost the connection to before it
requeues the job for another worker (Kueue's default, 15 minutes, would make a worker-loss
test wait that long)."""
VISIBILITY_SERVICE = "visibility-server"
VISIBILITY_APISERVICE = "v1beta2.visibility.kueue.x-k8s.io"
"""The Service its APIService names (``config/components/visibility``)."""
PYTORCHJOB = "kubeflow.org/pytorchjob"
"""Kueue's own integration of Kubeflow's PyTorchJob (its CRD must be installed first)."""
CONFIG_DIR = "kueue-config"
"""Folder next to the kueue binary with the CRDs and webhook manifests of the same version."""


def kueue_configuration(
    *,
    webhook_port: int,
    health_port: int,
    metrics_port: int,
    visibility_port: int,
    cert_dir: Path,
    frameworks: Sequence[str] = (),
    worker_lost_timeout_s: int = WORKER_LOST_TIMEOUT_S,
) -> dict[str, Any]:
    """Kueue's Configuration for the test bed: loopback ports, no leader election, the
    TrainingJob as an external framework, and Kueue's own integrations ``frameworks`` beside
    batch/job.

    Every Kueue can be a MultiKueue manager (:mod:`testbed.multikueue`): the TrainingJob is an
    external framework of MultiKueue too, and a lost worker cluster is given up after
    ``worker_lost_timeout_s``. Only a ClusterQueue with a MultiKueue admission check dispatches;
    the others admit as before."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "visibilityServer": {"bindAddress": "127.0.0.1", "bindPort": visibility_port},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        "integrations": {
            "frameworks": ["batch/job", *frameworks],
            "externalFrameworks": [EXTERNAL_FRAMEWORK],
        },
        "multiKueue": {
            "workerLostTimeout": f"{worker_lost_timeout_s}s",
            "externalFrameworks": [{"name": EXTERNAL_FRAMEWORK}],
        },
        "featureGates": FEATURE_GATES,
    }


def framework_resource(framework: str) -> tuple[str, str]:
    """(API group, resource) of a Kueue framework name: ``kubeflow.org/pytorchjob`` →
    (``kubeflow.org``, ``pytorchjobs``), as Kueue's webhook rules name them."""
    group, kind = framework.split("/", 1)
    return group, f"{kind}s"


def webhook_configurations(
    manifests: str, base_url: str, frameworks: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, named as its rotator expects, keeping only the webhooks
    for Kueue's own API group and for ``frameworks`` (a PyTorchJob must pass Kueue's webhook,
    which suspends it until its Workload is admitted), each called by URL instead of through
    a Service."""
    wanted = {framework_resource(framework) for framework in frameworks}
    configurations = []
    for document in yaml.safe_load_all(manifests):
        if not document:
            continue
        config = copy.deepcopy(document)
        kind = "validating" if config["kind"].startswith("Validating") else "mutating"
        config["metadata"] = {"name": f"kueue-{kind}-webhook-configuration"}
        webhooks = []
        for hook in config.get("webhooks") or []:
            rules = hook.get("rules", [])
            groups = {g for rule in rules for g in rule.get("apiGroups", [])}
            resources = {
                (g, r)
                for rule in rules
                for g in rule.get("apiGroups", [])
                for r in rule["resources"]
            }
            if groups != {"kueue.x-k8s.io"} and not (resources and resources <= wanted):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{base_url}{path}"}
            webhooks.append(hook)
        config["webhooks"] = webhooks
        configurations.append(config)
    return configurations


def with_conversion_webhook(crd: dict[str, Any], base_url: str) -> dict[str, Any]:
    """The CRD converting between its versions through Kueue, as Kueue's kustomize patches set
    it up, by URL."""
    crd = copy.deepcopy(crd)
    if crd["spec"]["names"]["plural"] in CONVERTED_CRDS:
        crd["spec"]["conversion"] = {
            "strategy": "Webhook",
            "webhook": {
                "clientConfig": {"url": f"{base_url}/convert"},
                "conversionReviewVersions": ["v1"],
            },
        }
    return crd


def visibility_api(apiservice: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """Kueue's visibility APIService (its manifest of the same version) and the Service it
    names, an ExternalName for ``localhost`` at ``port``: the apiserver's aggregator proxies
    to an ExternalName Service's name at the APIService's port, here the local process."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": VISIBILITY_SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "localhost"},
    }
    registered = copy.deepcopy(apiservice)
    registered["spec"]["service"] = {**registered["spec"]["service"], "port": port}
    return [service, registered]


def confined(root: Path) -> list[str]:
    """The command prefix that runs a static binary with ``root`` as its ``/``: ``chroot``
    as root, in a user namespace of its own otherwise."""
    tools = ["chroot"] if os.geteuid() == 0 else ["unshare", "chroot"]
    found = {tool: shutil.which(tool) for tool in tools}
    missing = [tool for tool, path in found.items() if path is None]
    if missing:
        raise ClusterError("kueue", f"{' and '.join(missing)} not found (util-linux, coreutils)")
    if os.geteuid() == 0:
        return [str(found["chroot"]), str(root)]
    return [str(found["unshare"]), "--user", "--map-root-user", str(found["chroot"]), str(root)]


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    # PKCS#1: the only form Kueue's rotator parses back when it renews a serving certificate.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def webhook_certificates() -> dict[str, bytes]:
    """The Secret's data: a CA named ``kueue-ca`` and a serving certificate for Kueue's Service
    name and for 127.0.0.1, both valid well beyond the rotator's 90-day look-ahead."""
    now = dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=365)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(CA_NAME)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    service = f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc"
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, service)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(service), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "ca.key": _pem_key(ca_key),
        "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
        "tls.key": _pem_key(key),
    }


class Kueue:
    """Kueue's controller manager for one cluster; ``start`` installs and starts it."""

    def __init__(
        self,
        cluster: Cluster,
        timeout: float = 120.0,
        frameworks: Sequence[str] = (),
        worker_lost_timeout_s: int = WORKER_LOST_TIMEOUT_S,
    ) -> None:
        self.cluster = cluster
        self.frameworks = tuple(frameworks)
        self.timeout = timeout
        self.worker_lost_timeout_s = worker_lost_timeout_s
        self.process: Process | None = None
        self.health_port = 0

    @property
    def config_dir(self) -> Path:
        return self.cluster.binaries().bin_dir / CONFIG_DIR

    def start(self) -> Kueue:
        """Install the CRDs and webhooks, start Kueue, and return once it serves them; a
        :class:`ClusterError` names what did not come up."""
        binary = self.cluster.binaries().path("kueue")
        if not (self.config_dir / "webhooks.yaml").is_file():
            raise ClusterError(
                "kueue",
                f"{self.config_dir} lacks Kueue's manifests: run hack/build-cluster.sh kueue",
            )
        webhook_port, self.health_port = free_port(), free_port()
        visibility_port = free_port()
        base_url = f"https://127.0.0.1:{webhook_port}"
        root = self.cluster.workdir / "kueue"
        cert_dir = root / "certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        certificates = webhook_certificates()
        for name in ("tls.crt", "tls.key"):
            (cert_dir / name).write_bytes(certificates[name])
        _place(binary, root / "kueue")
        shutil.copyfile(self.cluster.kubeconfig, root / "kubeconfig")
        api = self.cluster.api_client()
        self._install(api, certificates, base_url, visibility_port)
        (root / "config.yaml").write_text(
            json.dumps(
                kueue_configuration(
                    webhook_port=webhook_port,
                    health_port=self.health_port,
                    metrics_port=free_port(),
                    visibility_port=visibility_port,
                    cert_dir=Path("/certs"),
                    frameworks=self.frameworks,
                    worker_lost_timeout_s=self.worker_lost_timeout_s,
                )
            )
        )
        self.process = Process(
            "kueue",
            [*confined(root), "/kueue", "--config=/config.yaml", "--kubeconfig=/kubeconfig"],
            self.cluster.log_dir / "kueue.log",
            env={"HOME": "/"},
        ).start()
        self.cluster.processes["kueue"] = self.process
        self._wait_ready(api)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.cluster.processes.pop("kueue", None)
            self.process = None

    def _install(
        self, api: Any, certificates: dict[str, bytes], base_url: str, visibility_port: int
    ) -> None:
        from kubernetes import client

        core = client.CoreV1Api(api)
        _create(core.create_namespace, {"metadata": {"name": NAMESPACE}})
        _create(
            lambda body: core.create_namespaced_secret(NAMESPACE, body),
            {
                "metadata": {"name": WEBHOOK_SECRET},
                "data": {k: base64.b64encode(v).decode() for k, v in certificates.items()},
            },
        )
        ext = client.ApiextensionsV1Api(api)
        for path in sorted(self.config_dir.glob("kueue.x-k8s.io_*.yaml")):
            crd = with_conversion_webhook(yaml.safe_load(path.read_text()), base_url)
            _create(ext.create_custom_resource_definition, crd)
        admission = client.AdmissionregistrationV1Api(api)
        manifests = (self.config_dir / "webhooks.yaml").read_text()
        for config in webhook_configurations(manifests, base_url, self.frameworks):
            create = (
                admission.create_validating_webhook_configuration
                if config["kind"].startswith("Validating")
                else admission.create_mutating_webhook_configuration
            )
            _create(create, config)
        apiservice = yaml.safe_load((self.config_dir / "visibility-apiservice.yaml").read_text())
        service, registered = visibility_api(apiservice, visibility_port)
        _create(lambda body: core.create_namespaced_service(NAMESPACE, body), service)
        registration = client.ApiregistrationV1Api(api)
        _replace(
            registration.create_api_service,
            lambda body: registration.replace_api_service(body["metadata"]["name"], body),
            registration.read_api_service,
            registered,
        )

    def _wait_ready(self, api: Any) -> None:
        """Ready means its webhooks answer through the apiserver (a ResourceFlavor is
        created, a dry run, past Kueue's own validating webhook) and the aggregator finds
        its visibility API available."""
        from kubernetes import client

        assert self.process is not None
        process = self.process
        custom = client.CustomObjectsApi(api)
        registration = client.ApiregistrationV1Api(api)
        last: list[str] = [""]

        def ready() -> bool:
            process.check_alive()
            try:
                url = f"http://127.0.0.1:{self.health_port}/readyz"
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status != 200:
                        return False
            except (urllib.error.URLError, OSError) as error:
                last[0] = f"/readyz: {error}"
                return False
            try:
                custom.create_cluster_custom_object(
                    "kueue.x-k8s.io",
                    "v1beta2",
                    "resourceflavors",
                    {
                        "apiVersion": "kueue.x-k8s.io/v1beta2",
                        "kind": "ResourceFlavor",
                        "metadata": {"name": "readiness-probe"},
                    },
                    dry_run="All",
                )
            except client.ApiException as error:
                last[0] = f"dry-run ResourceFlavor: {error.status} {error.reason} {error.body}"
                return False
            service = registration.read_api_service(VISIBILITY_APISERVICE)
            available = next(
                (
                    c
                    for c in (service.status and service.status.conditions) or []
                    if c.type == "Available"
                ),
                None,
            )
            if available is None or available.status != "True":
                last[0] = f"APIService {VISIBILITY_APISERVICE}: {available and available.message}"
                return False
            return True

        try:
            wait_for(
                ready,
                self.timeout,
                interval=0.5,
                what="Kueue to serve its webhooks and its visibility API",
                describe_last=lambda: last[0],
            )
        except WaitTimeout as exc:
            raise process.error(str(exc)) from None


def _create(create: Any, body: dict[str, Any]) -> None:
    from kubernetes import client

    try:
        create(body)
    except client.ApiException as error:
        if error.status != 409:
            raise ClusterError("kueue", f"installing {body['metadata']['name']}: {error}") from None


def _replace(create: Any, replace: Any, read: Any, body: dict[str, Any]) -> None:
    """Create ``body``, or replace the one of its name (a Kueue started again in a cluster
    listens on another port)."""
    from kubernetes import client

    try:
        create(body)
    except client.ApiException as error:
        if error.status != 409:
            raise ClusterError("kueue", f"installing {body['metadata']['name']}: {error}") from None
        current = read(body["metadata"]["name"])
        replace(
            {
                **body,
                "metadata": {
                    **body["metadata"],
                    "resourceVersion": current.metadata.resource_version,
                },
            }
        )


def _place(binary: Path, target: Path) -> None:
    """The binary inside Kueue's root folder: a hard link where the file system allows."""
    target.unlink(missing_ok=True)
    try:
        os.link(binary, target)
    except OSError:
        shutil.copy2(binary, target)
