"""The pure builders: whole objects for a job, checked field by field where it matters."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from training_jobs import training_job

from torchkube.api import labels as lbl
from torchkube.api.contract import Env
from torchkube.operator import builders


def container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == lbl.TRAINER_CONTAINER)


def env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(pod)["env"]}


def test_worker_runs_torchrun_against_the_dedicated_store() -> None:
    job = training_job(replicas={"min": 2, "max": 4}, nprocPerNode=8, args=["--foo"])
    command = container(builders.worker_pod(job, 1, "x1y2z"))["command"]
    assert command[:3] == ["python", "-m", "torchkube.elastic.launch"]
    assert "--nnodes=2:4" in command and "--nproc-per-node=8" in command
    assert "--rdzv-backend=c10d" in command and "--rdzv-id=u1" in command
    assert "--rdzv-endpoint=rendezvous.demo.ns.svc:29400" in command
    conf = next(a for a in command if a.startswith("--rdzv-conf="))
    assert "is_host=false" in conf and "last_call_timeout=5" in conf
    assert "--local-addr=$(POD_IP)" in command
    assert command[-3:] == ["-m", "torchkube.trainer", "--foo"]


def test_worker_pod_identity_and_ownership() -> None:
    pod = builders.worker_pod(training_job(), 2, "abcde")
    meta = pod["metadata"]
    assert meta["name"] == "demo-worker-2-abcde" and meta["namespace"] == "ns"
    assert meta["labels"][lbl.JOB_NAME] == "demo"
    assert meta["labels"][lbl.REPLICA_INDEX] == "2" and meta["labels"][lbl.ROLE] == "worker"
    owner = meta["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainingJob", "u1", True)
    assert pod["spec"]["restartPolicy"] == "Never"


def test_worker_gets_gpus_volume_env_and_readiness() -> None:
    job = training_job(
        resources={"gpus": 8, "requests": {"cpu": 16, "memory": "64Gi"}},
        checkpoint={"mountPath": "/ckpt", "intervalSteps": 50, "keep": 2},
        env=[{"name": "NCCL_DEBUG", "value": "INFO"}],
        trainer={"model": "tiny", "steps": 20, "warmupSteps": 2},
    )
    pod = builders.worker_pod(job, 0, "a")
    c = container(pod)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert c["resources"]["requests"] == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "8"}
    assert {"name": "checkpoints", "mountPath": "/ckpt"} in c["volumeMounts"]
    claim = pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim == "demo-checkpoints"
    variables = env(pod)
    assert variables["TORCHKUBE_CHECKPOINT_DIR"] == "/ckpt"
    assert variables["TORCHKUBE_CHECKPOINT_INTERVAL_STEPS"] == "50"
    assert variables["TORCHKUBE_CHECKPOINT_KEEP"] == "2"
    assert variables["TORCHKUBE_METRICS_PORT"] == "9400"
    assert variables["NCCL_DEBUG"] == "INFO"
    assert json.loads(variables["TORCHKUBE_TRAINER_CONFIG"])["model"] == "tiny"
    assert c["readinessProbe"]["httpGet"]["path"] == "/progress"


def test_replacements_avoid_lost_nodes_within_every_user_term() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]
            }
        }
    }
    job = training_job(scheduling={"affinity": affinity})
    pod = builders.worker_pod(job, 0, "a", avoid_nodes=["n2", "n1"])
    node_affinity = pod["spec"]["affinity"]["nodeAffinity"]
    assert (
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
        == (affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"])
    ), "the user's required terms stay as they are"
    avoid = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1", "n2"]}
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 100, "preference": {"matchExpressions": [avoid]}}
    ]
    assert job.spec.scheduling.affinity == affinity, "the spec must not be modified"


def test_pod_template_override_merges_into_the_worker() -> None:
    job = training_job(
        scheduling={
            "nodeSelector": {"pool": "gpu"},
            "priorityClassName": "high",
            "podTemplate": {
                "labels": {"team": "llm"},
                "annotations": {"a": "b"},
                "spec": {
                    "containers": [
                        {"name": "trainer", "securityContext": {"runAsUser": 1000}},
                        {"name": "sidecar", "image": "busybox"},
                    ],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                },
            },
        }
    )
    pod = builders.worker_pod(job, 0, "a")
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert names == ["trainer", "sidecar"]
    assert container(pod)["securityContext"] == {
        **builders.container_security_context(),
        "runAsUser": 1000,
    }
    assert container(pod)["command"][0] == "python", "merging must keep our fields"
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["checkpoints", "dshm", "data"]
    assert pod["metadata"]["labels"]["team"] == "llm"
    assert pod["metadata"]["annotations"] == {"a": "b"}
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert pod["spec"]["priorityClassName"] == "high"


def test_rendezvous_store_pod_and_service() -> None:
    job = training_job(rendezvous={"port": 29500})
    store = builders.rendezvous_pod(job, "s1")
    assert store["spec"]["hostname"] == "rendezvous" and store["spec"]["subdomain"] == "demo"
    assert store["spec"]["restartPolicy"] == "Always"
    assert store["spec"]["containers"][0]["command"][-3:] == [
        "torchkube.elastic.store",
        "--port",
        "29500",
    ]
    svc = builders.headless_service(job)
    assert svc["metadata"]["name"] == "demo" and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {
        lbl.JOB_NAME: "demo",
        lbl.ROLE: lbl.ROLE_RENDEZVOUS,
        lbl.JOB_UID: job.uid,
    }
    assert [port["name"] for port in svc["spec"]["ports"]] == ["rendezvous"]
    selected = svc["spec"]["selector"].items()
    assert selected <= store["metadata"]["labels"].items()
    worker = builders.worker_pod(job, 0, "w1")
    assert not selected <= worker["metadata"]["labels"].items(), "workers are no endpoints"
    assert "subdomain" not in worker["spec"] and "hostname" not in worker["spec"]


def test_pods_meet_the_restricted_pod_security_level() -> None:
    job = training_job(resources={"gpus": 8})
    for pod in (builders.worker_pod(job, 0, "a"), builders.rendezvous_pod(job, "b")):
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    asked = training_job(
        scheduling={"podTemplate": {"spec": {"automountServiceAccountToken": True}}}
    )
    assert builders.worker_pod(asked, 0, "a")["spec"]["automountServiceAccountToken"] is True


def test_store_has_its_own_small_template() -> None:
    job = training_job(
        resources={"gpus": 8},
        scheduling={
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
        rendezvous={
            "store": {
                "image": "torch-cpu:1",
                "nodeSelector": {"pool": "cpu"},
                "tolerations": [],
                "resources": {"requests": {"cpu": "50m"}},
            }
        },
    )
    store = builders.rendezvous_pod(job, "s")
    spec, box = store["spec"], store["spec"]["containers"][0]
    assert box["image"] == "torch-cpu:1" and box["resources"] == {"requests": {"cpu": "50m"}}
    assert spec["nodeSelector"] == {"pool": "cpu"} and "tolerations" not in spec
    assert "nvidia.com/gpu" not in str(box) and "volumes" not in spec


GPU_ONLY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
            ]
        }
    }
}


def test_the_store_takes_none_of_the_workers_gpu_placement() -> None:
    """A node selector or affinity that sends workers to GPU nodes would keep a CPU store
    Pending where GPU nodes are full or scaled to zero; tolerations only allow, so the store
    keeps the workers' (a cluster whose every node is tainted still has room for it)."""
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists"}
    job = training_job(
        resources={"gpus": 8},
        scheduling={
            "nodeSelector": {"pool": "gpu"},
            "affinity": GPU_ONLY,
            "tolerations": [gpu],
            "priorityClassName": "training",
        },
    )
    spec = builders.rendezvous_pod(job, "s")["spec"]
    assert "nodeSelector" not in spec and "affinity" not in spec
    assert spec["tolerations"] == [gpu] and spec["priorityClassName"] == "training"
    avoiding = builders.rendezvous_pod(job, "s", ["n2"])["spec"]["affinity"]
    assert "gpu" not in str(avoiding) and "n2" in str(avoiding), "a lost node is still avoided"
    own = training_job(scheduling={"affinity": GPU_ONLY}, rendezvous={"store": {"affinity": CPU}})
    assert builders.rendezvous_pod(own, "s")["spec"]["affinity"] == CPU


CPU = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}


def test_checkpoint_claim_is_created_only_when_no_claim_is_named() -> None:
    claim = builders.checkpoint_claim(
        training_job(checkpoint={"size": "50Gi", "storageClassName": "nfs"})
    )
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "nfs",
    }
    named = training_job(checkpoint={"claimName": "shared"})
    assert not named.spec.checkpoint.creates_claim
    assert builders.worker_pod(named, 0, "a")["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "shared"
    }


def test_workers_get_the_hang_timeout_and_their_own_names() -> None:
    """Unset: the launcher derives the timeout (empty); 0 turns the watchdog off."""
    pods = {
        str(hang): env(
            builders.worker_pod(training_job(failurePolicy={"hangTimeoutSeconds": hang}), 0, "a")
        )
        for hang in (None, 0, 45)
    }
    assert [pods[key]["TORCHKUBE_HANG_TIMEOUT_SECONDS"] for key in ("None", "0", "45")] == [
        "",
        "0",
        "45",
    ]
    assert pods["None"]["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert pods["None"]["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_the_startup_probe_passes_once_the_launcher_can_start_workers_warm(
    tmp_path: Path,
) -> None:
    """The container is ``started`` (and a spare counted) only once the launcher created its
    warm file; the probe runs the probe's own command, with this machine's Python."""
    pod = builders.worker_pod(training_job(), 0, "a")
    probe = container(pod)["startupProbe"]
    command = probe["exec"]["command"]
    assert command[-1] == env(pod)[Env.WARM_FILE]
    local = [sys.executable, *command[1:-1], str(tmp_path / "warm")]
    assert subprocess.run(local).returncode != 0
    (tmp_path / "warm").touch()
    assert subprocess.run(local).returncode == 0
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 86400 * 365, "it never kills"


def test_a_users_probe_replaces_ours_whole() -> None:
    """Merged key by key, a podTemplate's httpGet probe beside our exec one made a probe with
    two handlers, and the API server refused every pod."""
    mine = {"httpGet": {"path": "/ready", "port": 8080}, "failureThreshold": 3}
    template = {"containers": [{"name": lbl.TRAINER_CONTAINER, "startupProbe": mine}]}
    pod = builders.worker_pod(training_job(scheduling={"podTemplate": {"spec": template}}), 0, "a")
    assert container(pod)["startupProbe"] == mine


def test_a_live_recovery_pod_is_a_rendezvous_of_its_own_each_incarnation() -> None:
    """recovery live: a pod's loss must not end the others' torchrun round (torchft's quorum
    spans the pods instead), and a replacement must not wait behind its predecessor's round."""
    job = training_job(replicas={"min": 2, "max": 2}, failurePolicy={"recovery": "live"})
    first = container(builders.worker_pod(job, 1, "a1"))["command"]
    again = container(builders.worker_pod(job, 1, "b2"))["command"]
    assert "--nnodes=1" in first and "--rdzv-id=u1-group-1-a1" in first
    assert "--rdzv-id=u1-group-1-b2" in again
    assert env(builders.worker_pod(job, 1, "a1"))[Env.RECOVERY] == "live"
    restart = training_job(replicas={"min": 2, "max": 2})
    command = container(builders.worker_pod(restart, 1, "a1"))["command"]
    assert "--nnodes=2" in command and "--rdzv-id=u1" in command
    assert env(builders.worker_pod(restart, 1, "a1"))[Env.RECOVERY] == "restart"


def test_a_live_recovery_job_gets_a_lighthouse_pod_and_service_of_its_own() -> None:
    """The Lighthouse outlives the store's pod: a pod of its own (placed like the store:
    rendezvous.store's placement and resources, never the workers' GPU nodeSelector), behind a
    headless Service of its own that selects it alone; from the job's image (which has
    torchft); the workers are told its Service's name. The store's pod and Service are the
    store's alone."""
    job = training_job(
        failurePolicy={"recovery": "live"},
        rendezvous={"port": 29400, "store": {"nodeSelector": {"pool": "cpu"}}},
        scheduling={"nodeSelector": {"pool": "gpu"}},
    )
    store = builders.rendezvous_pod(job, "s1")
    assert [c["name"] for c in store["spec"]["containers"]] == ["store"]
    pod = builders.lighthouse_pod(job, "l1")
    assert pod["metadata"]["name"] == "demo-lighthouse-l1"
    assert pod["metadata"]["labels"][lbl.ROLE] == lbl.ROLE_LIGHTHOUSE
    assert pod["metadata"]["ownerReferences"][0]["uid"] == job.uid
    (lighthouse,) = pod["spec"]["containers"]
    assert lighthouse["command"] == [
        "python",
        "-m",
        "torchkube.elastic.lighthouse",
        "--port",
        "29401",
    ]
    assert lighthouse["image"] == job.spec.image
    assert lighthouse["resources"] == store["spec"]["containers"][0]["resources"]
    assert pod["spec"]["restartPolicy"] == "Always"
    assert pod["spec"]["nodeSelector"] == {"pool": "cpu"}, "placed like the store"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    service = builders.lighthouse_service(job)
    assert service["metadata"]["name"] == "demo-lighthouse"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    selected = service["spec"]["selector"].items()
    assert selected <= pod["metadata"]["labels"].items()
    assert not selected <= store["metadata"]["labels"].items()
    assert not builders.headless_service(job)["spec"]["selector"].items() <= (
        pod["metadata"]["labels"].items()
    )
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"lighthouse": 29401}
    store_ports = {p["name"]: p["port"] for p in builders.headless_service(job)["spec"]["ports"]}
    assert store_ports == {"rendezvous": 29400}
    assert [s["metadata"]["name"] for s in builders.services(job)] == ["demo", "demo-lighthouse"]
    worker = env(builders.worker_pod(job, 0, "a"))
    assert worker[Env.LIGHTHOUSE] == "http://demo-lighthouse.ns.svc:29401"
    restart = training_job()
    assert [s["metadata"]["name"] for s in builders.services(restart)] == ["demo"]
    assert Env.LIGHTHOUSE not in env(builders.worker_pod(restart, 0, "a"))
