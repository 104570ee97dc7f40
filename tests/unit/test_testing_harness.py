"""Unit tests for the pure parts of testbed: PKI, kubeconfigs, KWOK manifests,
fault patches. No cluster, no binaries."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed import kwok
from testbed.binaries import Binaries, _failed_component
from testbed.certs import (
    apiserver_sans,
    first_service_ip,
    generate_cluster_pki,
)
from testbed.errors import ClusterError
from testbed.faults import terminated_status_patch
from testbed.kubeconfig import render_kubeconfig, write_kubeconfig
from testbed.pods import kwok_pod
from testbed.pytest_plugin import _namespace_name
from testbed.wait import WaitTimeout, wait_for
from torchkube.local.logs import tail


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    return generate_cluster_pki(
        tmp_path_factory.mktemp("pki"), extra_sans=["10.1.2.3", "node.test"]
    )


# --------------------------------------------------------------------------------------- certs
def test_first_service_ip() -> None:
    assert first_service_ip("10.96.0.0/16") == "10.96.0.1"
    assert first_service_ip("10.0.0.0/24") == "10.0.0.1"


def test_apiserver_sans_split_extra_into_dns_and_ip() -> None:
    dns, ips = apiserver_sans("10.96.0.0/12", ["192.168.1.1", "my.host"])
    assert "kubernetes.default.svc" in dns and "localhost" in dns and "my.host" in dns
    assert ips == ["127.0.0.1", "10.96.0.1", "192.168.1.1"]


def test_apiserver_cert_is_signed_by_ca_and_names_every_address(pki) -> None:
    ca = _load(pki.ca_cert)
    cert = _load(pki.apiserver.cert)
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "kubernetes.default.svc", "node.test"} <= set(
        san.get_values_for_type(x509.DNSName)
    )
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    assert {"127.0.0.1", "10.96.0.1", "10.1.2.3"} <= ips
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage


def test_admin_is_system_masters_client(pki) -> None:
    cert = _load(pki.admin.cert)
    assert (
        cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    )
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_component_identities_match_rbac_bootstrap_users(pki) -> None:
    for pair, user in [
        (pki.controller_manager, "system:kube-controller-manager"),
        (pki.scheduler, "system:kube-scheduler"),
    ]:
        cn = _load(pair.cert).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        assert cn == user


def test_ca_is_a_ca_and_keys_are_private(pki) -> None:
    ca = _load(pki.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert (pki.ca.paths.key.stat().st_mode & 0o777) == 0o600
    assert (pki.admin.key.stat().st_mode & 0o777) == 0o600


def test_service_account_key_is_rsa_and_matches_public_key(pki) -> None:
    key = load_pem_private_key(pki.service_account.key.read_bytes(), None)
    assert isinstance(key, rsa.RSAPrivateKey)
    assert b"BEGIN PUBLIC KEY" in pki.service_account.cert.read_bytes()


def test_issue_refuses_a_certificate_for_nothing(tmp_path: Path, pki) -> None:
    with pytest.raises(ValueError):
        pki.ca.issue(tmp_path, "x", "x")


# --------------------------------------------------------------------------------------- kubeconfig
def test_kubeconfig_embeds_credentials(tmp_path: Path, pki) -> None:
    config = render_kubeconfig("https://127.0.0.1:6443", pki.ca_cert, pki.admin)
    path = write_kubeconfig(tmp_path / "k", config)
    loaded = yaml.safe_load(path.read_text())
    user = loaded["users"][0]["user"]
    assert set(user) == {"client-certificate-data", "client-key-data"}
    assert loaded["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert (path.stat().st_mode & 0o777) == 0o600


def test_kubeconfig_wants_exactly_one_credential(pki) -> None:
    with pytest.raises(ValueError):
        render_kubeconfig("https://x", pki.ca_cert)
    with pytest.raises(ValueError):
        render_kubeconfig("https://x", pki.ca_cert, pki.admin, token="t")
    token_config = render_kubeconfig("https://x", pki.ca_cert, token="abc", namespace="ns")
    assert token_config["users"][0]["user"] == {"token": "abc"}
    assert token_config["contexts"][0]["context"]["namespace"] == "ns"


# --------------------------------------------------------------------------------------- kwok
def test_default_pools_spread_nodes_over_domains() -> None:
    pools = kwok.default_pools(nodes=5, gpus_per_node=4, domains=2)
    assert [p.nodes for p in pools] == [3, 2]
    assert [p.failure_domain for p in pools] == ["zone-a", "zone-b"]
    with pytest.raises(ValueError):
        kwok.default_pools(nodes=1, domains=2)


def test_node_manifest_has_gpu_capacity_taint_and_domain() -> None:
    pool = kwok.NodePool(name="p", nodes=2, gpus_per_node=8, domain="d1")
    node = kwok.node_manifest(pool, "p-1", slot=3)
    assert node["metadata"]["annotations"] == {kwok.KWOK_ANNOTATION: "d1"}
    assert node["metadata"]["labels"][kwok.DOMAIN_LABEL] == "d1"
    assert node["status"]["capacity"][kwok.GPU_RESOURCE] == "8"
    assert node["spec"]["taints"] == [
        {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
    ]
    assert node["spec"]["podCIDR"] == "10.244.3.0/24"
    assert ipaddress.ip_address(node["status"]["addresses"][0]["address"]) == ipaddress.ip_address(
        "10.243.0.4"
    )


def test_cpu_only_pool_has_no_gpu_resource() -> None:
    node = kwok.node_manifest(kwok.NodePool(name="cpu", gpus_per_node=0), "cpu-0", 0)
    assert kwok.GPU_RESOURCE not in node["status"]["capacity"]


def test_kwok_argv_selects_its_domain(tmp_path: Path) -> None:
    argv = kwok.kwok_argv(tmp_path / "kwok", tmp_path / "kc", "zone-a", 20)
    assert "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=zone-a" in argv
    assert "--manage-all-nodes=false" in argv
    assert "--node-lease-duration-seconds=20" in argv


def test_kwok_pod_tolerates_the_taint_and_requests_gpus() -> None:
    pod = kwok_pod("w-0", gpus=2, node_pool="gpu")
    spec = pod["spec"]
    assert spec["tolerations"] == [kwok.kwok_toleration()]
    assert spec["nodeSelector"] == {kwok.POOL_LABEL: "gpu"}
    assert spec["containers"][0]["resources"]["limits"] == {kwok.GPU_RESOURCE: "2"}


# --------------------------------------------------------------------------------------- faults
def _running_pod() -> dict:
    return {
        "metadata": {"name": "w", "resourceVersion": "42"},
        "spec": {"containers": [{"name": "a", "image": "img-a"}, {"name": "b", "image": "img-b"}]},
        "status": {
            "phase": "Running",
            "podIP": "10.244.0.5",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
            ],
            "containerStatuses": [
                {"name": "a", "image": "img-a", "state": {"running": {"startedAt": "T0"}}},
                {"name": "b", "image": "img-b", "state": {"running": {"startedAt": "T1"}}},
            ],
        },
    }


def test_failed_patch_sets_exit_code_on_the_chosen_container() -> None:
    patch = terminated_status_patch(
        _running_pod(), phase="Failed", exit_code=137, reason="OOMKilled", container="b"
    )
    assert patch["metadata"] == {"resourceVersion": "42"}
    status = patch["status"]
    assert status["phase"] == "Failed"
    by_name = {cs["name"]: cs["state"]["terminated"] for cs in status["containerStatuses"]}
    assert by_name["b"]["exitCode"] == 137 and by_name["b"]["reason"] == "OOMKilled"
    assert by_name["a"]["exitCode"] == 0 and by_name["a"]["startedAt"] == "T0"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["PodScheduled"]["status"] == "True"
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "PodFailed"
    assert "podIP" not in status  # left alone, so KWOK's pod-ready stage never matches again


def test_succeeded_patch_marks_everything_completed() -> None:
    patch = terminated_status_patch(
        _running_pod(), phase="Succeeded", exit_code=0, reason="Completed"
    )
    states = [cs["state"]["terminated"] for cs in patch["status"]["containerStatuses"]]
    assert all(s["exitCode"] == 0 and s["reason"] == "Completed" for s in states)
    assert {c["type"]: c for c in patch["status"]["conditions"]}["Ready"][
        "reason"
    ] == "PodCompleted"


# --------------------------------------------------------------------------------------- misc
def test_missing_binary_names_itself_and_the_build_component(tmp_path: Path) -> None:
    with pytest.raises(ClusterError) as info:
        Binaries(tmp_path).path("kube-apiserver")
    assert info.value.component == "kube-apiserver"
    assert "build-cluster.sh kubernetes" in str(info.value)


def test_build_failure_names_the_component() -> None:
    output = "build-cluster: building kwok ...\nbuild-cluster: ERROR: FAILED to build kwok (log)"
    assert _failed_component(output) == "build of kwok"
    assert _failed_component("something else") == "hack/build-cluster.sh"


def test_cluster_error_message_has_component_and_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "etcd.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    error = ClusterError("etcd", "exited with code 1", log, tail(log, 3))
    assert str(error).startswith("etcd: exited with code 1")
    assert "line 99" in str(error) and "line 96" not in str(error)


def test_wait_for_returns_value_and_reports_last_state() -> None:
    calls = iter([None, 0, "ok"])
    assert wait_for(lambda: next(calls), 5, interval=0.01) == "ok"
    with pytest.raises(WaitTimeout, match="last seen: nope"):
        wait_for(lambda: False, 0.05, interval=0.01, what="x", describe_last=lambda: "nope")


def test_namespace_names_are_valid_and_unique() -> None:
    first = _namespace_name("test_thing[param-1/ÄÖ]" * 5)
    second = _namespace_name("test_thing[param-1/ÄÖ]" * 5)
    assert first != second
    assert len(first) <= 63
    assert all(c.isalnum() or c == "-" for c in first) and first == first.lower()


def test_pod_discovery_gives_each_named_port_the_labels_kubernetes_sd_would() -> None:
    """Debian's Prometheus has no Kubernetes SD; the harness's file-based stand-in must give
    the PodMonitor's relabeling rules what they read."""
    from kubernetes import client

    from testbed.prometheus import pod_monitor_job, pod_targets

    def pod(name: str, ip: str | None, phase: str = "Running") -> client.V1Pod:
        ports = [client.V1ContainerPort(name="metrics", container_port=9400)]
        ports.append(client.V1ContainerPort(container_port=29500))  # unnamed: not a target
        return client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=name, namespace="ns", labels={"torchkube.io/role": "worker"}
            ),
            spec=client.V1PodSpec(
                node_name="n1", containers=[client.V1Container(name="worker", ports=ports)]
            ),
            status=client.V1PodStatus(pod_ip=ip, phase=phase),
        )

    [group] = pod_targets([pod("w-0", "10.0.0.5"), pod("w-1", None, "Pending")])
    assert group["targets"] == ["10.0.0.5:9400"]
    labels = group["labels"]
    assert labels["__meta_kubernetes_pod_label_torchkube_io_role"] == "worker"
    assert labels["__meta_kubernetes_pod_labelpresent_torchkube_io_role"] == "true"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "metrics"
    assert (labels["__meta_kubernetes_namespace"], labels["__meta_kubernetes_pod_name"]) == (
        "ns",
        "w-0",
    )
    monitor = {
        "metadata": {"namespace": "ns", "name": "workers"},
        "spec": {
            "selector": {"matchLabels": {"torchkube.io/role": "worker"}},
            "podMetricsEndpoints": [{"port": "metrics", "honorLabels": True}],
            "namespaceSelector": {"matchNames": ["ns"]},
        },
    }
    job = pod_monitor_job(monitor, Path("k.conf"), "1s")
    assert job.namespaces == ["ns"]
    config = job.scrape_config(Path("/tmp/pods-0.json"))
    assert config["file_sd_configs"] == [{"files": ["/tmp/pods-0.json"], "refresh_interval": "1s"}]
    used = {name for rule in config["relabel_configs"] for name in rule["source_labels"]}
    assert used <= set(labels), used - set(labels)


def test_kueue_webhooks_are_called_by_url_and_only_for_kueues_own_api() -> None:
    """A live Kueue must never sit in the path of the rest of the suite's pods and Jobs."""
    from testbed import kueue

    manifests = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  rules: [{apiGroups: [""], resources: [pods]}]
- name: mworkload.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-w}}
  rules: [{apiGroups: [kueue.x-k8s.io], resources: [workloads]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validating-webhook-configuration}
webhooks:
- name: vjob.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate-job}}
  rules: [{apiGroups: [batch], resources: [jobs]}]
"""
    mutating, validating = kueue.webhook_configurations(manifests, "https://127.0.0.1:9443")
    assert mutating["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    assert validating["metadata"]["name"] == "kueue-validating-webhook-configuration"
    assert [w["name"] for w in mutating["webhooks"]] == ["mworkload.kb.io"]
    assert mutating["webhooks"][0]["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate-w"}
    assert validating["webhooks"] == []


def test_kueue_webhooks_for_a_framework_asked_for_are_kept_and_no_others() -> None:
    """A benchmark beside Kubeflow needs Kueue's PyTorchJob webhooks (they suspend a queued
    job); the pod and Job webhooks stay out all the same."""
    from pathlib import Path

    from testbed import kueue

    manifests = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  rules: [{apiGroups: [""], resources: [pods]}]
- name: mpytorchjob.kb.io
  clientConfig: {service: {name: s, namespace: system, path: /mutate-kubeflow-org-v1-pytorchjob}}
  rules: [{apiGroups: [kubeflow.org], resources: [pytorchjobs]}]
- name: mtfjob.kb.io
  clientConfig: {service: {name: s, namespace: system, path: /mutate-kubeflow-org-v1-tfjob}}
  rules: [{apiGroups: [kubeflow.org], resources: [tfjobs]}]
- name: mjob.kb.io
  clientConfig: {service: {name: s, namespace: system, path: /mutate-batch-v1-job}}
  rules: [{apiGroups: [batch], resources: [jobs]}]
"""
    [mutating] = kueue.webhook_configurations(manifests, "https://h:1", [kueue.PYTORCHJOB])
    assert [w["name"] for w in mutating["webhooks"]] == ["mpytorchjob.kb.io"]
    assert mutating["webhooks"][0]["clientConfig"] == {
        "url": "https://h:1/mutate-kubeflow-org-v1-pytorchjob"
    }
    config = kueue.kueue_configuration(
        webhook_port=1,
        health_port=2,
        metrics_port=3,
        visibility_port=4,
        cert_dir=Path("c"),
        frameworks=[kueue.PYTORCHJOB],
    )
    assert config["integrations"]["frameworks"] == ["batch/job", "kubeflow.org/pytorchjob"]
    assert config["integrations"]["externalFrameworks"] == [kueue.EXTERNAL_FRAMEWORK]
    assert config["multiKueue"] == {
        "workerLostTimeout": f"{kueue.WORKER_LOST_TIMEOUT_S}s",
        "externalFrameworks": [{"name": kueue.EXTERNAL_FRAMEWORK}],
    }
    assert config["visibilityServer"] == {"bindAddress": "127.0.0.1", "bindPort": 4}
    apiservice = {"metadata": {"name": "v"}, "spec": {"service": {"name": "visibility-server"}}}
    service, registered = kueue.visibility_api(apiservice, 4)
    assert service["spec"] == {"type": "ExternalName", "externalName": "localhost"}
    assert registered["spec"]["service"] == {"name": "visibility-server", "port": 4}


def test_kueues_certificate_rotator_accepts_the_testbeds_certificates() -> None:
    """Kueue's rotator regenerates what does not verify as its CA (``kueue-ca``) and as its
    Service's name; the serving certificate must also be valid for 127.0.0.1."""
    import datetime as dt
    import ipaddress

    from cryptography import x509

    from testbed import kueue

    data = kueue.webhook_certificates()
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    cert.verify_directly_issued_by(ca)
    ca_names = ca.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ca_names.get_values_for_type(x509.DNSName) == [kueue.CA_NAME]
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [
        f"{kueue.WEBHOOK_SERVICE}.{kueue.NAMESPACE}.svc"
    ]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    lookahead = dt.datetime.now(dt.UTC) + dt.timedelta(days=90)
    assert cert.not_valid_after_utc > lookahead and ca.not_valid_after_utc > lookahead
    assert data["ca.key"].startswith(b"-----BEGIN RSA PRIVATE KEY-----")  # PKCS#1
