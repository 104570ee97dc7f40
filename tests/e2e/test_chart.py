"""The Helm chart and the plain manifests, used as a user would: linted, rendered, installed.

The first tests need only the Helm binary (lint, render every ``ci/`` values file, the schema,
generated files in sync). The others install the chart into a real control plane and run the
operator process with the chart's ServiceAccount token -- not admin -- through a job's life on
KWOK nodes: if a rule the operator needs were missing, the job would not get its pods, status
or events, and the operator's log would say "Forbidden".

They use a control plane of their own (about 10 s to start), not the session's ``cluster``:
the integration tests' operator runs as admin, watches every namespace and stays up for the
whole session, so beside it a job that works proves nothing about the chart's RBAC. Here the
only operator is the one holding the chart's token, and Helm installs the CRD itself from
``crds/``, so "the CRD and jobs survive an uninstall" is observed rather than assumed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_jobs import Job, job_manifest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from testbed import faults
from testbed.binaries import find_binaries
from testbed.cluster import Cluster, ClusterConfig
from testbed.crds import install_crd
from testbed.errors import ClusterError
from testbed.kubeconfig import render_kubeconfig, write_kubeconfig
from testbed.kueue import CONFIG_DIR as KUEUE_CONFIG_DIR
from testbed.kwok import NodePool
from testbed.operator import OperatorProcess
from testbed.volumes import prebound_volume
from testbed.wait import wait_for
from torchkube.api import GROUP, PLURAL, VERSION

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "torchkube"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
POOL = NodePool(name="chart", nodes=3, gpus_per_node=8)
KUEUE_GROUP = "kueue.x-k8s.io"
QUEUE_LABEL = f"{KUEUE_GROUP}/queue-name"
WORKLOAD_CRD = f"workloads.{KUEUE_GROUP}"
RBAC_TROUBLE = re.compile(r"forbidden|not enough permissions", re.IGNORECASE)
# The operator under test runs on this machine: its own ports, and no progress polling of the
# made-up KWOK pod IPs (OperatorProcess sets these).
LOCAL_SETTINGS = {"TORCHKUBE_METRICS_PORT", "TORCHKUBE_HEALTH_PORT", "TORCHKUBE_PROGRESS_URL"}


# ------------------------------------------------------------------------------------- helpers
@dataclass
class Helm:
    """The Helm binary with a private home, so no user config, cache or repository leaks in."""

    binary: Path
    home: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        result = subprocess.run(
            [str(self.binary), *args], env=env, capture_output=True, text=True, timeout=120
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return result

    def render(self, *args: str, chart: Path = CHART) -> list[dict[str, Any]]:
        """``helm template`` as a list of objects (namespace ``torchkube-system``)."""
        output = self("template", "torchkube", str(chart), "-n", "torchkube-system", *args).stdout
        return [doc for doc in yaml.safe_load_all(output) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def container_env(deployment: dict[str, Any]) -> dict[str, str]:
    """The operator container's plain (not valueFrom) environment. The API server leaves out
    an empty ``value``, so a variable without one is the empty string."""
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e.get("value", "") for e in env if "valueFrom" not in e}


def field_env(deployment: dict[str, Any]) -> dict[str, str]:
    """The operator container's downward-API environment: variable -> fieldPath."""
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in env if "valueFrom" in e}


def rules_of(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """A Role's rules flattened to (apiGroup, resource, verb) triples."""
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def lease_rules_of(role: dict[str, Any]) -> set[tuple[str, tuple[str, ...]]]:
    """A Role's rules on Leases as (verb, resourceNames) pairs; () means any name."""
    return {
        (verb, tuple(rule.get("resourceNames") or ()))
        for rule in role["rules"]
        if "coordination.k8s.io" in rule["apiGroups"] and "leases" in rule["resources"]
        for verb in rule["verbs"]
    }


def kopf_objects(objects: list[dict[str, Any]]) -> list[str]:
    """Anything of kopf's own API (kopf.dev) in a render: objects, CRDs, or RBAC rules."""
    found = [
        f"{o['kind']} {o['metadata']['name']}"
        for o in objects
        if o["apiVersion"].startswith("kopf.dev/")
        or (o["kind"] == "CustomResourceDefinition" and o["spec"]["group"] == "kopf.dev")
    ]
    for role in objects:
        if role["kind"] in ("Role", "ClusterRole"):
            found += [
                f"{role['kind']} {role['metadata']['name']}: {rule}"
                for rule in role["rules"]
                if "kopf.dev" in rule.get("apiGroups", [])
            ]
    return found


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    try:
        binaries = find_binaries(("helm",))
    except ClusterError as error:
        pytest.fail(f"the Helm binary is missing: {error}", pytrace=False)
    return Helm(binaries.path("helm"), tmp_path_factory.mktemp("helm-home"))


# ------------------------------------------------------------------------ without a cluster
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_lint(helm: Helm, values: Path) -> None:
    helm("lint", "--strict", str(CHART), "-f", str(values))


def test_default_render_is_one_least_privilege_cluster_wide_operator(helm: Helm) -> None:
    objects = helm.render("-f", str(CHART / "ci" / "default-values.yaml"))
    (deployment,) = find(objects, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["torchkube"] and container["args"] == ["operator"]
    assert container["image"] == "ghcr.io/torchkube/torchkube-operator:0.1.0"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The operator stops in a second or two; a hung stop must not hold a rollout for 30 s.
    assert pod["terminationGracePeriodSeconds"] == 10
    env = container_env(deployment)
    assert env["TORCHKUBE_NAMESPACES"] == "" and env["TORCHKUBE_LEADER_ELECTION"] == "false"
    assert "TORCHKUBE_PEERING" not in env  # kopf peering is gone for good
    # The Lease holder's identity and the Lease's namespace come from the downward API.
    assert field_env(deployment) == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
    }
    assert env["TORCHKUBE_WORKERS"] == "8" and env["TORCHKUBE_RESYNC_SECONDS"] == "30"
    assert env["TORCHKUBE_KUEUE_ENABLED"] == "true"
    assert pod["serviceAccountName"] == "torchkube"

    (role,) = find(objects, "ClusterRole", "torchkube")
    rules = rules_of(role)
    assert ("", "pods", "create") in rules
    assert ("torchkube.io", "trainingjobs/status", "patch") in rules
    assert ("", "nodes", "watch") in rules
    assert ("kueue.x-k8s.io", "workloads/status", "patch") in rules  # docs/queueing.md
    assert ("kueue.x-k8s.io", "resourceflavors", "get") in rules
    assert ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get") in rules
    assert ("scheduling.k8s.io", "priorityclasses", "list") in rules  # the globalDefault one
    assert not {r for r in rules if r[1] in {"secrets", "configmaps", "*"} or r[2] == "*"}
    assert ("torchkube.io", "trainingjobs", "update") not in rules  # never edits a job's spec
    assert not find(objects, "Role") and not find(objects, "RoleBinding")  # no election, no Lease
    assert not {r for r in rules if r[1] == "leases"}
    # Helm installs crds/ too: the TrainingJob CRD and nothing of kopf's.
    with_crds = helm.render("--include-crds")
    crds = [o["metadata"]["name"] for o in find(with_crds, "CustomResourceDefinition")]
    assert crds == ["trainingjobs.torchkube.io"]
    assert not kopf_objects(with_crds)
    (service,) = find(objects, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "torchkube", obj["metadata"]["name"]
        assert labels["app.kubernetes.io/instance"] == "torchkube"


def test_namespaced_render_grants_job_rights_only_in_the_watched_namespaces(helm: Helm) -> None:
    objects = helm.render("-f", str(CHART / "ci" / "namespaced-values.yaml"))
    roles = find(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in find(objects, "RoleBinding")) == [
        "team-a",
        "team-b",
    ]
    assert ("", "pods", "create") in rules_of(roles[0])
    (cluster_role,) = find(objects, "ClusterRole", "torchkube")
    assert {r[1] for r in rules_of(cluster_role)} == {
        "nodes",
        "namespaces",
        "customresourcedefinitions",
        "resourceflavors",  # Kueue's, read for the admitted flavors' node labels
        "priorityclasses",  # their values go into a queued job's Workload
        "workloadpriorityclasses",  # likewise, Kueue's own, named by a job's label
    }
    assert ("kueue.x-k8s.io", "workloads", "create") in rules_of(roles[0])
    (deployment,) = find(objects, "Deployment")
    assert container_env(deployment)["TORCHKUBE_NAMESPACES"] == "team-a,team-b"


def test_without_kueue_render_grants_nothing_of_kueues_and_says_so_to_the_operator(
    helm: Helm,
) -> None:
    objects = helm.render("-f", str(CHART / "ci" / "no-kueue-values.yaml"))
    (deployment,) = find(objects, "Deployment")
    assert container_env(deployment)["TORCHKUBE_KUEUE_ENABLED"] == "false"
    (role,) = find(objects, "ClusterRole", "torchkube")
    rules = rules_of(role)
    assert ("", "pods", "create") in rules  # the rest is as before
    assert not {r for r in rules if r[0].endswith("kueue.x-k8s.io") or r[1] == "priorityclasses"}
    namespaced = helm.render(
        "-f",
        str(CHART / "ci" / "namespaced-values.yaml"),
        "--set",
        "kueue.enabled=false",
    )
    roles = find(namespaced, "Role") + find(namespaced, "ClusterRole", "torchkube")
    assert len(roles) == 3
    for found in roles:
        assert not {r for r in rules_of(found) if r[0].endswith("kueue.x-k8s.io")}, found[
            "metadata"
        ]


def test_multikueue_subjects_are_granted_what_kueue_does_with_trainingjobs(helm: Helm) -> None:
    """MultiKueue's generic adapter reads a dispatched job and writes its status back (on the
    manager), and creates and deletes its copy (on a worker): nobody gets that by default."""
    assert not find(helm.render(), "ClusterRole", "torchkube-multikueue")
    objects = helm.render(
        "--set",
        "kueue.multiKueueSubjects[0].kind=ServiceAccount,"
        "kueue.multiKueueSubjects[0].name=kueue-controller-manager,"
        "kueue.multiKueueSubjects[0].namespace=kueue-system,"
        "kueue.multiKueueSubjects[1].kind=User,kueue.multiKueueSubjects[1].name=multikueue",
    )
    (role,) = find(objects, "ClusterRole", "torchkube-multikueue")
    jobs = ("get", "list", "watch", "create", "delete")
    assert rules_of(role) == {
        *(("torchkube.io", "trainingjobs", verb) for verb in jobs),
        *(("torchkube.io", "trainingjobs/status", verb) for verb in ("get", "patch", "update")),
    }
    (binding,) = find(objects, "ClusterRoleBinding", "torchkube-multikueue")
    assert binding["roleRef"]["name"] == "torchkube-multikueue"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"},
        {"kind": "User", "name": "multikueue", "apiGroup": "rbac.authorization.k8s.io"},
    ]


def test_ha_render_turns_leader_election_on(helm: Helm) -> None:
    objects = helm.render("-f", str(CHART / "ci" / "ha-values.yaml"))
    (deployment,) = find(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    # A new pod starts as a standby next to the old ones: safe with a Lease deciding who acts.
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    env = container_env(deployment)
    assert env["TORCHKUBE_LEADER_ELECTION"] == "true"
    assert env["TORCHKUBE_LEADER_ELECTION_NAME"] == "torchkube"
    assert "TORCHKUBE_PEERING" not in env
    assert set(field_env(deployment)) == {"POD_NAME", "POD_NAMESPACE"}
    # The Lease rights: a Role of their own in the release namespace, nothing cluster-wide.
    (role,) = find(objects, "Role", "torchkube-leader-election")
    assert role["metadata"]["namespace"] == "torchkube-system"
    assert lease_rules_of(role) == {
        ("create", ()),
        ("get", ("torchkube",)),
        ("update", ("torchkube",)),
    }
    (binding,) = find(objects, "RoleBinding", "torchkube-leader-election")
    assert binding["metadata"]["namespace"] == "torchkube-system"
    assert binding["roleRef"]["name"] == "torchkube-leader-election"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "torchkube", "namespace": "torchkube-system"}
    ]
    (cluster_role,) = find(objects, "ClusterRole", "torchkube")
    assert not {r for r in rules_of(cluster_role) if r[1] == "leases"}
    assert not kopf_objects(objects)

    # Namespaced, one replica, election forced on, a Lease name of its own: the Lease Role
    # still sits in the release namespace, next to the job Roles of the watched namespaces.
    objects = helm.render(
        "--set",
        "rbac.scope=namespace",
        "--set",
        "watchNamespaces={torchkube-system,team-a}",
        "--set",
        "leaderElection.enabled=true",
        "--set",
        "leaderElection.leaseName=tk-leader",
    )
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in find(objects, "Role")}
    assert set(roles) == {
        ("torchkube-system", "torchkube"),
        ("team-a", "torchkube"),
        ("torchkube-system", "torchkube-leader-election"),
    }
    lease_role = roles["torchkube-system", "torchkube-leader-election"]
    assert lease_rules_of(lease_role) == {
        ("create", ()),
        ("get", ("tk-leader",)),
        ("update", ("tk-leader",)),
    }
    assert not lease_rules_of(roles["team-a", "torchkube"])
    (deployment,) = find(objects, "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert container_env(deployment)["TORCHKUBE_LEADER_ELECTION_NAME"] == "tk-leader"
    assert not kopf_objects(objects)

    # Without rbac.create the Lease rights are the user's to grant (the README lists them).
    objects = helm.render("--set", "replicaCount=3", "--set", "rbac.create=false")
    assert not find(objects, "Role") and not find(objects, "RoleBinding")
    assert container_env(find(objects, "Deployment")[0])["TORCHKUBE_LEADER_ELECTION"] == "true"


def test_monitoring_render(helm: Helm, tmp_path: Path) -> None:
    values = str(CHART / "ci" / "monitoring-values.yaml")
    objects = helm.render("-f", values)
    (monitor,) = find(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    # the metrics' own namespace/job labels must survive the scrape (dashboards select on them)
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    pod_monitors = {m["metadata"]["name"]: m for m in find(objects, "PodMonitor")}
    pod_monitor = pod_monitors["torchkube"]
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    trainers = pod_monitors["torchkube-trainers"]["spec"]
    assert trainers["selector"]["matchLabels"]["torchkube.io/role"] == "worker"
    assert trainers["namespaceSelector"] == {"any": True}
    assert trainers["podMetricsEndpoints"][0]["honorLabels"] is True
    # One ConfigMap per dashboards/*.json of the chart: those copied from dashboards/, if any,
    # and one added to a copy of the chart here.
    chart = tmp_path / "torchkube"
    shutil.copytree(CHART, chart)
    (chart / "dashboards").mkdir(exist_ok=True)
    dashboard = {"title": "torchkube jobs", "panels": []}
    (chart / "dashboards" / "Jobs_Overview.json").write_text(json.dumps(dashboard))
    rendered = find(helm.render("-f", values, chart=chart), "ConfigMap")
    config_maps = {c["metadata"]["name"]: c for c in rendered}
    assert len(config_maps) == len(list((chart / "dashboards").glob("*.json")))
    config_map = config_maps["torchkube-dashboard-jobs-overview"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "torchkube"}
    assert json.loads(config_map["data"]["Jobs_Overview.json"]) == dashboard


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("replicaCount=abc", "replicaCount"),
        ("rbac.scope=everywhere", "scope"),
        ("replicaCont=2", "replicaCont"),  # a typo is an unknown key, not silently ignored
        ("operator.workers=0", "workers"),
        ("leaderElection.enabled=maybe", "enabled"),
        ("leaderElection.leaseName=Not_A_Name", "leaseName"),
        ("peering.enabled=true", "peering"),  # kopf peering is gone: an unknown key now
        ("kueue.enabled=maybe", "enabled"),
    ],
)
def test_schema_rejects_bad_values(helm: Helm, setting: str, complaint: str) -> None:
    result = helm("template", "torchkube", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert complaint in result.stderr


def test_service_monitor_without_service_is_refused(helm: Helm) -> None:
    result = helm(
        "template",
        "torchkube",
        str(CHART),
        "--set",
        "serviceMonitor.enabled=true,metrics.service.enabled=false",
        check=False,
    )
    assert result.returncode != 0 and "needs metrics.service.enabled" in result.stderr


def test_generated_files_are_fresh(helm: Helm) -> None:
    """manifests/operator.yaml, the chart's CRD copy, dashboards and values table."""
    env = {**os.environ, "HELM": str(helm.binary), "PYTHON": sys.executable}
    env.setdefault("TORCHKUBE_BIN_DIR", str(helm.binary.parent))
    result = subprocess.run(
        ["bash", str(ROOT / "hack" / "render-manifests.sh"), "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (CHART / "crds" / "trainingjobs.yaml").read_bytes() == (
        ROOT / "manifests" / "crd.yaml"
    ).read_bytes()


def test_kustomization_builds_crd_and_operator() -> None:
    kubectl = find_binaries(("kubectl",)).path("kubectl")
    output = subprocess.run(
        [str(kubectl), "kustomize", str(ROOT / "manifests")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    kinds = sorted(doc["kind"] for doc in yaml.safe_load_all(output) if doc)
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "Deployment",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    )


# --------------------------------------------------------------------------- in a cluster
@pytest.fixture(scope="module")
def chart_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A control plane for this module alone (see the module docstring for why)."""
    messages: list[str] = []
    cluster = Cluster(ClusterConfig(pools=[POOL]), report=messages.append)
    try:
        cluster.start()
    except Exception as error:  # a failure to start is a failure, never a skip
        logs = "".join(f"\n{line}" for line in messages)
        pytest.fail(f"chart test cluster could not start -- {error}{logs}", pytrace=False)
    failed_before = request.session.testsfailed
    yield cluster
    cluster.stop(failed=request.session.testsfailed > failed_before)
    for line in messages:
        print(f"[testbed] {line}")


@pytest.fixture(scope="module")
def admin(chart_cluster: Cluster) -> Any:
    return chart_cluster.api_client()


@dataclass
class Release:
    """A chart installed into the test cluster, and what running its operator needs."""

    name: str
    namespace: str
    cluster: Cluster
    helm: Helm
    admin: Any
    workdir: Path
    notes: str = ""
    """What ``helm install`` printed (NOTES.txt)."""

    @property
    def fullname(self) -> str:
        """The base name of the release's objects (the chart's "torchkube.fullname")."""
        return self.name if "torchkube" in self.name else f"{self.name}-torchkube"

    def helm_cmd(self, verb: str, *args: str) -> subprocess.CompletedProcess[str]:
        kubeconfig = str(self.cluster.kubeconfig)
        return self.helm(verb, self.name, *args, "-n", self.namespace, "--kubeconfig", kubeconfig)

    def deployment(self) -> dict[str, Any]:
        apps = client.AppsV1Api(self.admin)
        found = apps.read_namespaced_deployment(self.fullname, self.namespace)
        result: dict[str, Any] = self.admin.sanitize_for_serialization(found)
        return result

    def token_kubeconfig(self) -> Path:
        return token_kubeconfig(
            self.cluster, self.admin, self.namespace, self.fullname, self.workdir
        )

    def service_account_client(self) -> Any:
        return config.new_client_from_config(config_file=str(self.token_kubeconfig()))

    def operator(self, pod_name: str = "", **extra_env: str) -> OperatorProcess:
        """The operator process with the token and exactly the settings the chart installed,
        as pod ``pod_name`` would get them, then ``extra_env``."""
        pod_name = pod_name or f"{self.fullname}-0"
        deployment = self.deployment()
        env = {k: v for k, v in container_env(deployment).items() if k not in LOCAL_SETTINGS}
        # The downward API's values, as the kubelet would fill them in for that pod.
        fields = {"metadata.name": pod_name, "metadata.namespace": self.namespace}
        env.update({name: fields[path] for name, path in field_env(deployment).items()})
        # In the pod, the Lease's namespace is the pod's own (its service-account namespace
        # file). This machine's file, should it have one, is not the pod's: name it outright.
        env["TORCHKUBE_LEADER_ELECTION_NAMESPACE"] = self.namespace
        env.update(extra_env)
        log = self.workdir / f"operator-{self.name}-{pod_name}.log"
        return OperatorProcess(self.token_kubeconfig(), log, env=env)

    def lease_holder(self) -> str | None:
        """The holderIdentity of the release's Lease ("<pod name>_<pid>"), None if unheld."""
        name = container_env(self.deployment())["TORCHKUBE_LEADER_ELECTION_NAME"]
        coordination: Any = client.CoordinationV1Api(self.admin)
        try:
            lease = coordination.read_namespaced_lease(name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        holder: str | None = lease.spec.holder_identity or None
        return holder


@pytest.fixture
def install(
    chart_cluster: Cluster, helm: Helm, admin: Any, tmp_path: Path
) -> Iterator[Callable[..., Release]]:
    """``install(name, *helm_args)``: the chart as release ``name`` in ``<name>-system``, a
    namespace enforcing the restricted Pod Security Standard. Uninstalled afterwards."""
    releases: list[Release] = []

    def make(name: str, *args: str) -> Release:
        release = Release(name, f"{name}-system", chart_cluster, helm, admin, tmp_path)
        create_namespace(
            admin, release.namespace, {"pod-security.kubernetes.io/enforce": "restricted"}
        )
        release.notes = release.helm_cmd("install", str(CHART), *args).stdout
        releases.append(release)
        return release

    yield make
    for release in releases:
        release.helm_cmd("uninstall", "--ignore-not-found")


@pytest.fixture
def operators() -> Iterator[list[OperatorProcess]]:
    """Operators a test starts; all stopped afterwards (their logs stay in tmp_path)."""
    started: list[OperatorProcess] = []
    yield started
    for process in started:
        process.stop()


def token_kubeconfig(
    cluster: Cluster, admin: Any, namespace: str, account: str, folder: Path
) -> Path:
    """A kubeconfig holding a fresh token of a ServiceAccount (TokenRequest API)."""
    core: Any = client.CoreV1Api(admin)
    token = core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    assert cluster.pki is not None
    kubeconfig = render_kubeconfig(cluster.server, cluster.pki.ca_cert, token=token, user=account)
    return write_kubeconfig(folder / f"{namespace}-{account}.kubeconfig", kubeconfig)


def create_namespace(api: Any, name: str, labels: dict[str, str] | None = None) -> str:
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": labels or {}},
    }
    core: Any = client.CoreV1Api(api)
    core.create_namespace(body)
    wait_for(
        lambda: core.list_namespaced_service_account(name).items,
        30,
        what=f"ServiceAccount {name}/default",
    )
    return name


def chart_job(
    api: Any,
    namespace: str,
    name: str,
    workdir: Path,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> Job:
    """A 2-worker TrainingJob on the module's KWOK pool, with a volume for its claim, created
    as an admin (its user)."""
    claim = f"{name}-checkpoints"
    prebound_volume(api, namespace, claim, str(workdir / f"{namespace}-{claim}"))
    spec.setdefault("replicas", {"min": 2, "max": 2})
    body = job_manifest(name, POOL, **spec)
    body["metadata"]["labels"] = labels or {}
    return Job.create(api, namespace, body)


def queued(job: Job, reason: str) -> dict[str, Any] | None:
    """The job's Queued condition once its reason is ``reason``."""
    conditions = job.status().get("conditions") or []
    found = next((c for c in conditions if c["type"] == "Queued"), None)
    return found if found and found["reason"] == reason else None


@pytest.fixture
def workload_api(admin: Any) -> Iterator[Callable[[], None]]:
    """``serve()`` makes the apiserver serve Kueue's Workload API, as it does where Kueue is
    installed: Kueue's own Workload CRD, of the version hack/build-cluster.sh built (no Kueue
    process: nothing here admits anything). Deleted afterwards, so the module's cluster stays
    one without Kueue."""
    ext: Any = client.ApiextensionsV1Api(admin)

    def serve() -> None:
        folder = find_binaries(("kueue",)).bin_dir / KUEUE_CONFIG_DIR
        install_crd(admin, folder / "kueue.x-k8s.io_workloads.yaml")

    yield serve
    try:
        ext.delete_custom_resource_definition(WORKLOAD_CRD)
    except ApiException as error:
        if error.status != 404:
            raise


def assert_no_rbac_trouble(*processes: OperatorProcess) -> None:
    for process in processes:
        text = process.log_path.read_text(errors="replace")
        lines = [line for line in text.splitlines() if RBAC_TROUBLE.search(line)]
        assert not lines, f"{process.log_path} reports missing permissions:\n" + "\n".join(lines)


def wait_operator_pod(api: Any, namespace: str, selector: str) -> None:
    """Wait until the operator Deployment's pod exists: its ReplicaSet could create it, so the
    namespace's "restricted" Pod Security Standard admitted it. (It stays Pending: every node
    here is a tainted KWOK node; the operator under test runs on this machine instead.)"""
    core: Any = client.CoreV1Api(api)
    apps: Any = client.AppsV1Api(api)
    wait_for(
        lambda: core.list_namespaced_pod(namespace, label_selector=selector).items,
        30,
        what=f"the operator pod in {namespace}, admitted by Pod Security",
        describe_last=lambda: str(
            [rs.status.conditions for rs in apps.list_namespaced_replica_set(namespace).items]
        ),
    )


def assert_forbidden(call: Callable[[], Any], who: str) -> None:
    with pytest.raises(ApiException) as denied:
        call()
    assert denied.value.status == 403, denied.value
    assert who in str(denied.value.body)


def identity_of(process: OperatorProcess) -> str:
    """The Lease holderIdentity this operator process uses: its pod name and its pid."""
    assert process.proc is not None
    return f"{process.extra_env['POD_NAME']}_{process.proc.pid}"


def pod_creates(process: OperatorProcess) -> float:
    """How many pod creations this operator process has sent (torchkube_api_requests_total)."""
    total = 0.0
    for line in process.metrics().splitlines():
        if line.startswith("torchkube_api_requests_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.index("}")]))
            if labels.get("verb") == "create" and labels.get("resource") == "pod":
                total += float(line.rsplit(" ", 1)[1])
    return total


def lease_body(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"holderIdentity": "intruder"}}


@pytest.mark.cluster
def test_a_multikueue_job_unqueued_or_resized_by_slices_is_refused_at_apply(
    install: Callable[..., Release], admin: Any
) -> None:
    """What the CRD's rules cannot see (labels, annotations), the chart's admission policy
    refuses at the apiserver with the field's name: a dispatched job must name a queue, and
    cannot ask for Kueue's workload slices. Jobs run here are not touched by it."""
    install("tkmk")
    custom: Any = client.CustomObjectsApi(admin)

    def create(name: str, managed: bool, **metadata: dict[str, str]) -> Any:
        body = job_manifest(
            name, POOL, **({"managedBy": "kueue.x-k8s.io/multikueue"} if managed else {})
        )
        body["metadata"].update(metadata)
        return custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, body, dry_run="All"
        )

    def refused(name: str, **metadata: dict[str, str]) -> str | None:
        try:
            create(name, True, **metadata)
        except ApiException as error:
            assert error.status == 422, error.body
            return str(error.body)
        return None

    queue = {"kueue.x-k8s.io/queue-name": "gpus"}
    # The apiserver enforces a policy once it has loaded it: a moment after the install.
    unqueued = wait_for(lambda: refused("unqueued"), 30, what="the policy enforced")
    assert "label kueue.x-k8s.io/queue-name" in unqueued, unqueued
    sliced = refused("sliced", labels=queue, annotations={"kueue.x-k8s.io/elastic-job": "true"})
    assert sliced is not None and "kueue.x-k8s.io/elastic-job" in sliced, sliced
    create("queued", True, labels=queue)
    create("here", False)
    create("here-elastic", False, annotations={"kueue.x-k8s.io/elastic-job": "true"})


@pytest.mark.cluster
@pytest.mark.slow
def test_operator_runs_a_whole_job_with_only_the_charts_rbac(
    install: Callable[..., Release],
    operators: list[OperatorProcess],
    admin: Any,
    tmp_path: Path,
) -> None:
    release = install("tk")
    ext: Any = client.ApiextensionsV1Api(admin)
    crds = {c.metadata.name: c.spec.group for c in ext.list_custom_resource_definition().items}
    assert "trainingjobs.torchkube.io" in crds  # installed by Helm from crds/
    assert "kopf.dev" not in crds.values()  # kopf peering's CRDs are gone with it
    wait_operator_pod(admin, release.namespace, "app.kubernetes.io/instance=tk")
    # The first TrainingJob NOTES.txt tells users to submit is one the API server accepts.
    first_job = re.search(r"<<'YAML'\n(.*?)\n *YAML\n", release.notes, re.DOTALL)
    assert first_job, release.notes
    client.CustomObjectsApi(admin).create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        yaml.safe_load(textwrap.dedent(first_job[1])),
        dry_run="All",
    )

    operator = release.operator().start()
    operators.append(operator)
    namespace = create_namespace(admin, "team-a")
    started = time.monotonic()
    job = chart_job(
        admin, namespace, "lifecycle", tmp_path, runPolicy={"ttlSecondsAfterFinished": 1}
    )
    workers = job.wait_running(2)
    print(f"2 workers Running {time.monotonic() - started:.1f}s after create")
    core: Any = client.CoreV1Api(admin)
    core.read_namespaced_service("lifecycle", namespace)  # created by the operator
    core.read_namespaced_persistent_volume_claim("lifecycle-checkpoints", namespace)

    victim = workers[0].metadata.name
    faults.fail_pod(admin, victim, namespace, exit_code=137)
    status = job.wait(lambda: job.status().get("restarts") == 1 and job.status(), 60, "restarts=1")
    assert status["lastFailure"]["pod"] == victim
    workers = job.wait_running(2)
    assert victim not in {p.metadata.name for p in workers}
    job.wait(
        lambda: any(
            e.reason == "WorkerFailed" for e in core.list_namespaced_event(namespace).items
        ),
        60,
        "the operator's WorkerFailed event",
    )

    # Both workers exit 0: the job succeeds and the operator deletes it after its TTL.
    for pod in workers:
        faults.succeed_pod(admin, pod.metadata.name, namespace)
    job.wait(lambda: job.get_or_none() is None, 60, "the operator to delete the finished job")
    # Its pods then go by the controller-manager's garbage collection (about 20 s after the
    # delete on this fresh cluster): not the operator's doing, so not waited for.
    assert_no_rbac_trouble(operator)

    # Outside its rules, the same token is refused.
    account = f"system:serviceaccount:{release.namespace}:{release.fullname}"
    sa = release.service_account_client()
    sa_core: Any = client.CoreV1Api(sa)
    assert_forbidden(lambda: sa_core.list_namespaced_secret(namespace), account)
    config_map = {"metadata": {"name": "x"}}
    assert_forbidden(lambda: sa_core.create_namespaced_config_map(namespace, config_map), account)
    assert_forbidden(
        lambda: client.AppsV1Api(sa).list_namespaced_deployment(release.namespace), account
    )
    # One replica: no leader election, so no Lease rights either.
    sa_leases: Any = client.CoordinationV1Api(sa)
    assert_forbidden(
        lambda: sa_leases.create_namespaced_lease(release.namespace, lease_body("x")), account
    )


@pytest.mark.cluster
@pytest.mark.slow
def test_a_queued_job_where_kueue_is_not_installed_says_so_and_queues_once_it_is(
    install: Callable[..., Release],
    operators: list[OperatorProcess],
    workload_api: Callable[[], None],
    admin: Any,
    tmp_path: Path,
) -> None:
    """kueue.enabled (the default) in a cluster without Kueue: the real apiserver answers the
    Workload list 404, the job waits Queued saying why and what to do, and starts queueing
    by itself once the Workload API is served."""
    release = install("tk-kueue")
    operator = release.operator().start()
    operators.append(operator)
    namespace = create_namespace(admin, "team-q")
    job = chart_job(admin, namespace, "queued", tmp_path, labels={QUEUE_LABEL: "team-q"})
    waiting = job.wait(lambda: queued(job, "KueueNotInstalled"), 30, "Queued/KueueNotInstalled")
    assert waiting["status"] == "True" and job.status()["phase"] == "Queued"
    assert "not served" in waiting["message"] and "externalFrameworks" in waiting["message"]
    assert not job.pods() and not job.pods("rendezvous")
    (warning,) = job.wait_event("KueueNotInstalled")
    assert warning.type == "Warning"

    workload_api()
    custom: Any = client.CustomObjectsApi(admin)

    def workload() -> list[Any]:
        listed = custom.list_namespaced_custom_object(
            KUEUE_GROUP, "v1beta2", namespace, "workloads"
        )
        return list(listed["items"])

    (created,) = job.wait(workload, 30, "its Workload, once the Workload API is served")
    assert created["spec"]["queueName"] == "team-q"
    job.wait(lambda: queued(job, "Queued"), 30, "Queued for admission, no longer KueueNotInstalled")
    assert not job.pods(), "nothing admits it here: it must still wait"
    assert [e.reason for e in job.events()].count("KueueNotInstalled") == 1
    assert_no_rbac_trouble(operator)
    job.delete()  # the next release's operator must not find it


@pytest.mark.cluster
@pytest.mark.slow
def test_with_kueue_disabled_a_queue_labelled_job_runs_at_once_and_no_workload_is_read(
    install: Callable[..., Release],
    operators: list[OperatorProcess],
    workload_api: Callable[[], None],
    admin: Any,
    tmp_path: Path,
) -> None:
    """kueue.enabled=false in a cluster that serves the Workload API: the chart grants no
    Workload, so an operator that watched, listed or created one would be refused (and say
    "forbidden" in its log); the queue-labelled job runs unqueued, and says its label is
    ignored."""
    workload_api()
    release = install("tk-nokueue", "-f", str(CHART / "ci" / "no-kueue-values.yaml"))
    operator = release.operator().start()
    operators.append(operator)
    namespace = create_namespace(admin, "team-n")
    job = chart_job(admin, namespace, "unqueued", tmp_path, labels={QUEUE_LABEL: "team-n"})
    job.wait_running(2)
    ignored = queued(job, "QueueingDisabled")
    assert ignored is not None and ignored["status"] == "False"
    assert "kueue.enabled=false" in ignored["message"]
    (warning,) = job.wait_event("QueueingDisabled")
    assert warning.type == "Warning"
    custom: Any = client.CustomObjectsApi(admin)
    listed = custom.list_namespaced_custom_object(KUEUE_GROUP, "v1beta2", namespace, "workloads")
    assert listed["items"] == []
    assert "queue" not in job.status()
    assert_no_rbac_trouble(operator)
    log = operator.log_path.read_text(errors="replace")
    assert "workloads" not in log, "an operator with Kueue off must not even try to watch them"
    job.delete()  # its nodes are the next tests'


@pytest.mark.cluster
@pytest.mark.slow
def test_a_request_the_operator_is_refused_is_said_on_the_job_until_it_is_granted(
    install: Callable[..., Release],
    operators: list[OperatorProcess],
    workload_api: Callable[[], None],
    admin: Any,
    tmp_path: Path,
) -> None:
    """RBAC that lacks what the operator needs (here: the chart with kueue.enabled=false, the
    operator with the integration on): the apiserver answers 403, and the job says which
    request was refused and what grants it, instead of carrying no status while the operator
    retries; once granted, the condition clears and the job goes on."""
    workload_api()
    release = install("tk-refused", "-f", str(CHART / "ci" / "no-kueue-values.yaml"))
    operator = release.operator(TORCHKUBE_KUEUE_ENABLED="true").start()
    operators.append(operator)
    namespace = create_namespace(admin, "team-r")
    job = chart_job(admin, namespace, "refused", tmp_path, labels={QUEUE_LABEL: "team-r"})

    def refused() -> dict[str, Any] | None:
        conditions = job.status().get("conditions") or []
        return next((c for c in conditions if c["type"] == "OperatorForbidden"), None)

    said = job.wait(refused, 30, "OperatorForbidden")
    assert said["status"] == "True" and "workloads" in said["message"], said
    assert "ServiceAccount" in said["message"] and "rbac" in said["message"], said
    (warning,) = job.wait_event("OperatorForbidden")
    assert warning.type == "Warning"
    assert not job.pods()

    rbac: Any = client.RbacAuthorizationV1Api(admin)
    grant = f"{release.fullname}-workloads"
    rbac.create_cluster_role(
        {
            "metadata": {"name": grant},
            "rules": [
                {
                    "apiGroups": [KUEUE_GROUP],
                    "resources": ["workloads", "workloads/status"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                },
                {  # a first Workload's priority: the cluster's globalDefault PriorityClass
                    "apiGroups": ["scheduling.k8s.io"],
                    "resources": ["priorityclasses"],
                    "verbs": ["get", "list"],
                },
            ],
        }
    )
    try:
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": grant},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": grant,
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": release.fullname,
                        "namespace": release.namespace,
                    }
                ],
            }
        )
        cleared = job.wait(
            lambda: (c := refused()) is not None and c["status"] == "False" and c,
            60,
            "OperatorForbidden cleared once granted",
        )
        assert cleared["reason"] == "Allowed", cleared
        job.wait(lambda: queued(job, "Queued"), 30, "Queued for admission")
    finally:
        rbac.delete_cluster_role_binding(grant)
        rbac.delete_cluster_role(grant)
    job.delete()


@pytest.mark.cluster
@pytest.mark.slow
def test_namespaced_mode_runs_jobs_in_its_namespace_only(
    install: Callable[..., Release],
    operators: list[OperatorProcess],
    admin: Any,
    tmp_path: Path,
) -> None:
    """rbac.scope=namespace, with leader election on: the Lease sits in the release namespace,
    granted by a Role there, while the job rules are a Role in the watched namespace."""
    watched = create_namespace(admin, "team-b")
    other = create_namespace(admin, "team-c")
    release = install(
        "tkns",
        "--set",
        "rbac.scope=namespace",
        "--set",
        f"watchNamespaces={{{watched}}}",
        "--set",
        "leaderElection.enabled=true",
    )
    rbac: Any = client.RbacAuthorizationV1Api(admin)
    rbac.read_namespaced_role(release.fullname, watched)
    rbac.read_namespaced_role(f"{release.fullname}-leader-election", release.namespace)
    operator = release.operator().start()
    operators.append(operator)
    wait_for(
        lambda: release.lease_holder() == identity_of(operator),
        30,
        what=f"the operator to hold the Lease {release.namespace}/{release.fullname}",
        describe_last=lambda: f"holder={release.lease_holder()!r}\n{operator.tail()}",
    )

    # The job outside the watched namespace comes first: by the time the watched one runs,
    # an operator that saw both would have handled it too.
    ignored = chart_job(admin, other, "not-mine", tmp_path)
    job = chart_job(admin, watched, "mine", tmp_path)
    job.wait_running(2)
    assert not ignored.pods() and not ignored.status()
    assert_no_rbac_trouble(operator)

    account = f"system:serviceaccount:{release.namespace}:{release.fullname}"
    sa: Any = client.CoreV1Api(release.service_account_client())
    assert_forbidden(lambda: sa.list_namespaced_pod(other), account)
    assert_forbidden(lambda: sa.list_pod_for_all_namespaces(), account)
    for done in (job, ignored):
        done.custom.delete_namespaced_custom_object(
            GROUP, VERSION, done.namespace, PLURAL, done.name
        )


@pytest.mark.cluster
@pytest.mark.slow
def test_two_replicas_elect_one_leader_and_the_standby_takes_over(
    install: Callable[..., Release],
    operators: list[OperatorProcess],
    admin: Any,
    tmp_path: Path,
) -> None:
    """Two operator processes with the chart's token and Lease: exactly one acts; after it is
    SIGKILLed (no chance to step down) the other takes the Lease over and heals the job."""
    release = install("tkha", "-f", str(CHART / "ci" / "ha-values.yaml"))
    env = container_env(release.deployment())
    assert env["TORCHKUBE_LEADER_ELECTION"] == "true"
    assert env["TORCHKUBE_LEADER_ELECTION_NAME"] == release.fullname
    election = {
        "TORCHKUBE_LEADER_ELECTION": "true",
        "TORCHKUBE_LEADER_ELECTION_NAMESPACE": release.namespace,
    }
    for pod_name in ("op-a", "op-b"):  # POD_NAME, as the downward API would set it
        operators.append(release.operator(pod_name, **election).start())
    by_identity = {identity_of(process): process for process in operators}

    holder = wait_for(
        release.lease_holder,
        30,
        what=f"a holder of the Lease {release.namespace}/{release.fullname}",
        describe_last=lambda: "\n".join(process.tail(10) for process in operators),
    )
    assert holder in by_identity, f"{holder!r} is neither of {sorted(by_identity)}"
    active = by_identity[holder]
    (standby,) = (process for process in operators if process is not active)

    namespace = create_namespace(admin, "team-ha")
    job = chart_job(admin, namespace, "elected", tmp_path)
    victim = job.wait_running(2)[0].metadata.name
    time.sleep(2)  # a second operator acting would have created a duplicate meanwhile
    assert len(job.pods()) == 2 and len(job.pods("rendezvous")) == 1
    # Exactly one of them acted: the holder created the 3 pods, the standby none.
    assert pod_creates(active) == 3 and pod_creates(standby) == 0
    assert release.lease_holder() == holder  # renewed all along, never handed over
    leaders = [p for p in operators if "became the leader" in p.log_path.read_text()]
    assert leaders == [active]

    # The chart grants that one Lease and no other.
    account = f"system:serviceaccount:{release.namespace}:{release.fullname}"
    coordination: Any = client.CoordinationV1Api(admin)
    coordination.create_namespaced_lease(release.namespace, lease_body("someone-elses"))
    sa_leases: Any = client.CoordinationV1Api(release.service_account_client())
    assert_forbidden(
        lambda: sa_leases.read_namespaced_lease("someone-elses", release.namespace), account
    )
    assert_forbidden(lambda: sa_leases.list_namespaced_lease(release.namespace), account)

    # SIGKILL: the holder cannot step down, the Lease just stops being renewed. A worker fails
    # while nobody acts; the standby must take over once the Lease has expired on its own
    # clock (15 s without a renewal) and then handle the failure.
    active.kill()
    killed = time.monotonic()
    faults.fail_pod(admin, victim, namespace, exit_code=137)
    wait_for(
        lambda: release.lease_holder() == identity_of(standby),
        30,
        what="the standby to take the Lease over",
        describe_last=lambda: f"holder={release.lease_holder()!r}\n{standby.tail(10)}",
    )
    takeover = time.monotonic() - killed
    print(f"the standby took the Lease over {takeover:.1f}s after the holder was SIGKILLed")
    assert takeover > 10, "the standby took a Lease that had not expired"
    status = job.wait(
        lambda: job.status().get("restarts") == 1 and job.status(),
        60,
        "the new leader to count the failure",
    )
    assert status["lastFailure"]["pod"] == victim
    workers = job.wait_running(2)
    assert victim not in {p.metadata.name for p in workers}
    print(f"2 workers Running again {time.monotonic() - killed:.1f}s after the kill")
    assert pod_creates(standby) >= 1  # the replacement is the new leader's
    assert len(job.live_workers()) == 2 and len(job.pods("rendezvous")) == 1
    assert_no_rbac_trouble(active, standby)
    job.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job.name)


@pytest.mark.cluster
@pytest.mark.slow
def test_namespace_editors_may_run_trainingjobs_and_viewers_read_them(
    install: Callable[..., Release], chart_cluster: Cluster, admin: Any, tmp_path: Path
) -> None:
    """rbac.aggregateToDefaultRoles: the built-in "edit" role includes TrainingJobs."""
    install("tkusers")
    namespace = create_namespace(admin, "team-users")
    core: Any = client.CoreV1Api(admin)
    rbac: Any = client.RbacAuthorizationV1Api(admin)
    users = {}
    for user, role in (("editor", "edit"), ("viewer", "view")):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": user}})
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": user},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [{"kind": "ServiceAccount", "name": user, "namespace": namespace}],
            },
        )
        kubeconfig = token_kubeconfig(chart_cluster, admin, namespace, user, tmp_path)
        users[user] = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob", "metadata": {"name": "x"}}

    def submit(user: str) -> Any:
        return users[user].create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, dry_run="All"
        )

    def allowed(call: Callable[[], Any]) -> bool:
        try:
            call()
            return True
        except ApiException as error:
            if error.status != 403:  # 403 until the aggregation controller has caught up
                raise
            return False

    def viewer_lists() -> Any:
        return users["viewer"].list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)

    # edit and view are aggregated one at a time, in either order
    wait_for(
        lambda: allowed(lambda: submit("editor")) and allowed(viewer_lists),
        30,
        what="the edit and view roles to include TrainingJobs",
    )
    assert_forbidden(lambda: submit("viewer"), f"system:serviceaccount:{namespace}:viewer")


@pytest.mark.cluster
@pytest.mark.slow
def test_upgrade_then_uninstall_keeps_the_crd_and_the_jobs(
    install: Callable[..., Release], admin: Any, tmp_path: Path
) -> None:
    release = install("tkup")
    release.helm_cmd(
        "upgrade", str(CHART), "--reuse-values", "--set", "resources.limits.memory=2Gi"
    )
    container = release.deployment()["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["memory"] == "2Gi"
    assert container["resources"]["requests"]["memory"] == "256Mi"  # the rest is kept
    history = json.loads(release.helm_cmd("history", "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2] and history[-1]["status"] == "deployed"

    namespace = create_namespace(admin, "team-up")
    job = chart_job(admin, namespace, "survivor", tmp_path)
    release.helm_cmd("uninstall", "--wait")
    apps: Any = client.AppsV1Api(admin)
    core: Any = client.CoreV1Api(admin)
    rbac: Any = client.RbacAuthorizationV1Api(admin)
    for read in (
        lambda: apps.read_namespaced_deployment(release.fullname, release.namespace),
        lambda: core.read_namespaced_service_account(release.fullname, release.namespace),
        lambda: rbac.read_cluster_role(release.fullname),
        lambda: rbac.read_cluster_role_binding(release.fullname),
    ):
        with pytest.raises(ApiException) as gone:
            read()
        assert gone.value.status == 404
    client.ApiextensionsV1Api(admin).read_custom_resource_definition("trainingjobs.torchkube.io")
    assert job.get() is not None, "helm uninstall must not delete users' TrainingJobs"
    job.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job.name)


@pytest.mark.cluster
@pytest.mark.slow
def test_plain_manifests_apply(chart_cluster: Cluster, admin: Any) -> None:
    kubectl = chart_cluster.binaries().path("kubectl")
    subprocess.run(
        [
            str(kubectl),
            "--kubeconfig",
            str(chart_cluster.kubeconfig),
            "apply",
            "--server-side",
            "-k",
            str(ROOT / "manifests"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    apps: Any = client.AppsV1Api(admin)
    deployment = apps.read_namespaced_deployment("torchkube", "torchkube-system")
    assert deployment.spec.template.spec.service_account_name == "torchkube"
    wait_operator_pod(admin, "torchkube-system", "app.kubernetes.io/instance=torchkube")
