"""Pure functions from a validated TrainingJob to the Kubernetes objects it owns.

No API calls here: the reconciler decides *which* objects to create, these functions decide
*what they look like*, and unit tests compare whole dicts.

Rendezvous design: every worker runs ``torchrun --rdzv-backend=c10d`` against a store that
lives in a small dedicated pod (``rendezvous.<job>``), never in a worker. With torchrun's
default the store sits in whichever agent matches the endpoint host, so losing that worker
(worker-0 in Kubeflow, node-0-0 in JobSet) takes the rendezvous down with it. Here any worker,
including the one that was rank 0, can die: the survivors re-rendezvous through the store pod,
elect a new rank 0 among themselves, and the replacement joins the next round. The store pod
holds no training state, restarts in place on a crash, and is recreated on node loss.

With ``failurePolicy.recovery: live`` torchft's Lighthouse, which forms every step's quorum of
replica groups, runs in a pod and behind a Service of its own (``<job>-lighthouse``), placed
like the store: losing the store's pod costs the groups nothing (each pod is a torchrun world
of its own, which needs the store only to start), and losing the Lighthouse's pauses them at
their next quorum until its replacement answers.
"""

import json
from collections.abc import Iterable, Sequence
from typing import Any

from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.api.contract import TERMINATION_LOG, Env
from torchkube.api.trainingjob import API_VERSION, KIND
from torchkube.api.worker_launch import (
    lighthouse_port,
    lighthouse_service_name,
    live,
    torchrun_args,
    trainer_env,
)
from torchkube.operator import topology

DEFAULT_CLAIM_SIZE = "10Gi"
CHECKPOINT_VOLUME = "checkpoints"
SHM_VOLUME = "dshm"
RENDEZVOUS_PORT_NAME = "rendezvous"
LIGHTHOUSE_PORT_NAME = "lighthouse"
METRICS_PORT_NAME = "metrics"


def owner_reference(job: TrainingJob) -> dict[str, Any]:
    """Makes the job the controller of a child, so deleting the job deletes the child."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(job: TrainingJob, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(job)],
    }


def claim_name(job: TrainingJob) -> str:
    return job.spec.checkpoint.claim_name or f"{job.name}-checkpoints"


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def worker_env(job: TrainingJob, index: int) -> list[dict[str, Any]]:
    """The pod's identity, the trainer's variables, then the user's env (which may override)."""
    env: list[dict[str, Any]] = [
        _field_env("POD_IP", "status.podIP"),
        _field_env(Env.POD_NAME, "metadata.name"),
        _field_env(Env.NODE_NAME, "spec.nodeName"),
    ]
    env += [{"name": k, "value": v} for k, v in trainer_env(job, index).items()]
    env.append({"name": Env.WARM_FILE, "value": WARM_FILE})
    env += [variable.to_wire() for variable in job.spec.env]
    return env


WARM_FILE = "/dev/shm/torchkube-warm"
"""On the pod's own memory volume: writable whatever the root filesystem."""
WARM_PROBE_FAILURES = 2**31 - 1
"""The startup probe marks warmth and never ends a container: a launcher that never creates
the file (an image whose torchkube predates it) keeps its container not ``started`` — never
counted as a spare, never Ready — instead of being killed by the kubelet mid-training."""


def warm_startup_probe() -> dict[str, Any]:
    """The container is ``started`` once its launcher can start a worker warm (``Env.WARM_FILE``):
    a spare counts in ``status.spares`` only then. Python, which the launcher needs anyway,
    checks the file: an image may have no shell or coreutils."""
    check = "import os, sys; sys.exit(not os.path.exists(sys.argv[1]))"
    return {
        "exec": {"command": ["python", "-S", "-c", check, WARM_FILE]},
        "periodSeconds": 1,
        "failureThreshold": WARM_PROBE_FAILURES,
    }


def worker_resources(job: TrainingJob) -> dict[str, Any]:
    res = job.spec.resources
    requests = {k: str(v) for k, v in res.requests.items()}
    limits = {k: str(v) for k, v in res.limits.items()}
    if res.gpus:
        requests[res.gpu_resource_name] = limits[res.gpu_resource_name] = str(res.gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


AVOID_WEIGHT = 100
"""Weight of the preference to stay off nodes that recently lost a worker (the maximum)."""


def _avoid_nodes(affinity: dict[str, Any] | None, nodes: Sequence[str]) -> dict[str, Any] | None:
    """Prefers nodes other than ``nodes`` (a preference, never a requirement: on an exact-fit
    pool the replacement must be able to go back to a node that lost a worker and
    recovered, or the job could never be whole again)."""
    if not nodes:
        return affinity
    merged: dict[str, Any] = json.loads(json.dumps(affinity or {}))
    preferred = merged.setdefault("nodeAffinity", {}).setdefault(
        "preferredDuringSchedulingIgnoredDuringExecution", []
    )
    avoid = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": sorted(nodes)}
    preferred.append({"weight": AVOID_WEIGHT, "preference": {"matchExpressions": [avoid]}})
    return merged


RUN_AS_USER = 10001
"""The trainer image's user (Dockerfile ``APP_UID``); also the group that owns the volume."""


def pod_security_context() -> dict[str, Any]:
    """What Pod Security's ``restricted`` level asks of a pod, so jobs run in namespaces that
    enforce it. ``runAsNonRoot`` without a fixed user: the image's numeric ``USER`` is used,
    and an image that runs as root is refused by the kubelet with a message naming the
    setting (override it in ``scheduling.podTemplate.spec.securityContext``). ``fsGroup``
    makes the checkpoint volume writable by that user."""
    return {
        "runAsNonRoot": True,
        "fsGroup": RUN_AS_USER,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


REPLACED_WHOLE = frozenset({"startupProbe", "readinessProbe", "livenessProbe"})
"""A user's probe replaces ours: merged, an ``httpGet`` beside our ``exec`` is two handlers,
which the API server refuses."""


def merge_pod_spec(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge a user's partial PodSpec over ours: maps merge (probes are replaced whole), lists
    append, and a container named like ours is merged into it instead of being added next to
    it."""
    out = dict(base)
    for key, value in override.items():
        if key in REPLACED_WHOLE:
            out[key] = value
        elif key in ("containers", "initContainers") and isinstance(value, list):
            containers = [dict(c) for c in out.get(key, [])]
            by_name = {c.get("name"): c for c in containers}
            for extra in value:
                target = by_name.get(extra.get("name"))
                if target is None:
                    containers.append(extra)
                else:
                    target.update(merge_pod_spec(target, extra))
            out[key] = containers
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_pod_spec(out[key], value)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = [*out[key], *value]
        else:
            out[key] = value
    return out


def _scheduling(job: TrainingJob, avoid_nodes: Sequence[str]) -> dict[str, Any]:
    sched = job.spec.scheduling
    out: dict[str, Any] = {}
    if sched.node_selector:
        out["nodeSelector"] = dict(sched.node_selector)
    if sched.tolerations:
        out["tolerations"] = [dict(t) for t in sched.tolerations]
    affinity = _avoid_nodes(topology.packed(job, sched.affinity), avoid_nodes)
    if affinity:
        out["affinity"] = affinity
    if sched.priority_class_name:
        out["priorityClassName"] = sched.priority_class_name
    if sched.scheduler_name:
        out["schedulerName"] = sched.scheduler_name
    return out


def _volumes(job: TrainingJob) -> list[dict[str, Any]]:
    return [
        {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim_name(job)}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
    ]


def worker_pod(
    job: TrainingJob, index: int, suffix: str, avoid_nodes: Iterable[str] = ()
) -> dict[str, Any]:
    """Worker pod for slot ``index``. ``suffix`` makes each incarnation's name unique, so a
    replacement never waits for a predecessor stuck Terminating on a dead node."""
    spec = job.spec
    name = f"{job.name}-worker-{index}-{suffix}"
    template = spec.scheduling.pod_template
    container: dict[str, Any] = {
        "name": lbl.TRAINER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": torchrun_args(job, index=index, incarnation=suffix),
        "env": worker_env(job, index),
        "resources": worker_resources(job),
        "volumeMounts": [
            {"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path},
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        ],
        "securityContext": container_security_context(),
        "startupProbe": warm_startup_probe(),
    }
    if spec.metrics.enabled:
        container["ports"] = [
            {"name": METRICS_PORT_NAME, "containerPort": spec.metrics.port, "protocol": "TCP"}
        ]
        container["readinessProbe"] = {
            "httpGet": {"path": "/progress", "port": METRICS_PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 3,
        }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        # Workers never call the API; a token in every pod is an attack surface for nothing.
        # podTemplate.spec.automountServiceAccountToken: true brings it back.
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": spec.checkpoint.termination_grace_period_seconds,
        "containers": [container],
        "volumes": _volumes(job),
        **_scheduling(job, sorted(set(avoid_nodes))),
    }
    if template.spec:
        pod_spec = merge_pod_spec(pod_spec, template.spec)
    metadata = _metadata(
        job, name, {**template.labels, **lbl.worker_labels(job.name, index, job.uid)}
    )
    if template.annotations:
        metadata["annotations"] = dict(template.annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


DATA_SOURCE_VOLUME = "data-source"
DATA_SOURCE_MOUNT = "/data-source"
PREPARE_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}}
"""The prepare pod's own: tokenising is one CPU-bound process, whatever the workers need."""


def prepare_pod(job: TrainingJob, attempt: int) -> dict[str, Any]:
    """The pod that runs ``torchkube prepare-data`` for ``spec.data`` into the checkpoint
    volume (the job's image has torchkube). Its report, or its error, is its termination
    message; attempt ``n`` is named ``<job>-prepare-<n>``, so it is created once."""
    spec = job.spec
    data = spec.data
    assert data is not None, "only jobs with spec.data have a prepare pod"
    source = json.dumps(data.source.to_wire(), sort_keys=True)
    command = ["torchkube", "prepare-data", "--source", source]
    command += ["--output", data.folder(spec.checkpoint.mount_path)]
    command += ["--tokenizer", data.tokenizer, "--val-fraction", str(data.val_fraction)]
    command += ["--report", str(TERMINATION_LOG)]
    mounts: list[dict[str, Any]] = [
        {"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path}
    ]
    volumes = [_volumes(job)[0]]
    if data.source.claim is not None:
        command += ["--claim-mount", DATA_SOURCE_MOUNT]
        mounts.append(
            {"name": DATA_SOURCE_VOLUME, "mountPath": DATA_SOURCE_MOUNT, "readOnly": True}
        )
        claim = {"claimName": data.source.claim.name, "readOnly": True}
        volumes.append({"name": DATA_SOURCE_VOLUME, "persistentVolumeClaim": claim})
    container = {
        "name": "prepare",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": command,
        "env": [variable.to_wire() for variable in spec.env],
        "resources": PREPARE_RESOURCES,
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
    }
    scheduling = _scheduling(job, [])
    scheduling.pop("affinity", None)  # the workers' (anti-)affinity is about workers
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": volumes,
        **scheduling,
    }
    labels = lbl.pod_labels(job.name, job.uid, lbl.ROLE_PREPARE)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(job, f"{job.name}-prepare-{attempt}", labels),
        "spec": pod_spec,
    }


def _server_scheduling(job: TrainingJob, avoid_nodes: Iterable[str]) -> dict[str, Any]:
    """Where the store and the Lighthouse go: ``rendezvous.store``'s placement, never the
    workers' nodeSelector or affinity (they send workers to GPU nodes, where a CPU server
    could wait Pending for ever); unset tolerations and priority class follow the workers'
    (tolerations only allow: a cluster whose every node is tainted for the workers still has
    room for it)."""
    store = job.spec.rendezvous.store
    scheduling = _scheduling(job, ())
    scheduling.pop("nodeSelector", None)
    scheduling.pop("affinity", None)
    affinity = _avoid_nodes(store.affinity, sorted(set(avoid_nodes)))
    if affinity:
        scheduling["affinity"] = affinity
    if store.node_selector:
        scheduling["nodeSelector"] = dict(store.node_selector)
    if store.tolerations is not None:
        scheduling.pop("tolerations", None)
        if store.tolerations:
            scheduling["tolerations"] = [dict(t) for t in store.tolerations]
    if store.priority_class_name is not None:
        scheduling["priorityClassName"] = store.priority_class_name
    return scheduling


def _server_pod(
    job: TrainingJob,
    name: str,
    role: str,
    hostname: str,
    subdomain: str,
    container: dict[str, Any],
    avoid_nodes: Iterable[str],
) -> dict[str, Any]:
    """A small pod that serves the workers (the store, the Lighthouse): restarted in place on
    a crash, reached by ``hostname.subdomain`` (and its Service's name)."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "hostname": hostname,
        "subdomain": subdomain,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {
            key: value
            for key, value in pod_security_context().items()
            if not key.startswith("fsGroup")
        },
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
        **_server_scheduling(job, avoid_nodes),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(job, name, lbl.pod_labels(job.name, job.uid, role)),
        "spec": pod_spec,
    }


def rendezvous_pod(
    job: TrainingJob, suffix: str, avoid_nodes: Iterable[str] = ()
) -> dict[str, Any]:
    """The c10d store pod: tiny, restarted in place on a crash, reached as ``rendezvous.<job>``.

    It has its own template (``rendezvous.store``): no GPU, no volume, its own placement, so
    it can sit on a CPU node (:func:`_server_scheduling`)."""
    spec = job.spec
    store = spec.rendezvous.store
    port = spec.rendezvous.port
    container = {
        "name": "store",
        "image": store.image or spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "torchkube.elastic.store", "--port", str(port)],
        "ports": [{"name": RENDEZVOUS_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
        "resources": dict(store.resources),
        "securityContext": container_security_context(),
    }
    name = f"{job.name}-rendezvous-{suffix}"
    return _server_pod(
        job, name, lbl.ROLE_RENDEZVOUS, lbl.RENDEZVOUS_HOSTNAME, job.name, container, avoid_nodes
    )


def lighthouse_pod(
    job: TrainingJob, suffix: str, avoid_nodes: Iterable[str] = ()
) -> dict[str, Any]:
    """recovery live: torchft's Lighthouse in a pod of its own, reached through its own
    Service (:func:`lighthouse_service`), so the store's loss leaves it running and its own
    loss is replaced like the store's. Placed like the store (``rendezvous.store``'s
    placement and resources); from the job's image: the trainer image has torchft, a slim
    store image may not."""
    port = lighthouse_port(job)
    container = {
        "name": lbl.ROLE_LIGHTHOUSE,
        "image": job.spec.image,
        "imagePullPolicy": job.spec.image_pull_policy,
        "command": ["python", "-m", "torchkube.elastic.lighthouse", "--port", str(port)],
        "ports": [{"name": LIGHTHOUSE_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
        "resources": dict(job.spec.rendezvous.store.resources),
        "securityContext": container_security_context(),
    }
    name = f"{job.name}-{lbl.ROLE_LIGHTHOUSE}-{suffix}"
    service = lighthouse_service_name(job)
    return _server_pod(
        job, name, lbl.ROLE_LIGHTHOUSE, lbl.ROLE_LIGHTHOUSE, service, container, avoid_nodes
    )


def headless_service(job: TrainingJob) -> dict[str, Any]:
    """Stable DNS for the rendezvous store (``rendezvous.<job>.<ns>.svc``); not-ready pods are
    published so the name resolves while the store is still starting.

    The store is its only endpoint. Workers need no name: each reaches the others by the pod
    IP it hands to the rendezvous (``--local-addr``). Selecting them too would make the
    Endpoints controller rewrite the job's Endpoints (up to 1,000 addresses) and the
    EndpointSlice controller its slices (100 each) on every worker's create, bind and start:
    work for kube-controller-manager and writes for the API server and every EndpointSlice
    watcher (CoreDNS) that grow with the job, while it starts."""
    ports = [{"name": RENDEZVOUS_PORT_NAME, "port": job.spec.rendezvous.port, "protocol": "TCP"}]
    return _headless(job, job.name, lbl.ROLE_RENDEZVOUS, ports)


def lighthouse_service(job: TrainingJob) -> dict[str, Any]:
    """recovery live: stable DNS for the Lighthouse's pod (``<job>-lighthouse.<ns>.svc``),
    its only endpoint; published while it starts, like the store's."""
    ports = [{"name": LIGHTHOUSE_PORT_NAME, "port": lighthouse_port(job), "protocol": "TCP"}]
    return _headless(job, lighthouse_service_name(job), lbl.ROLE_LIGHTHOUSE, ports)


def services(job: TrainingJob) -> list[dict[str, Any]]:
    """The job's Services: the store's, and with recovery live the Lighthouse's."""
    return [headless_service(job), *([lighthouse_service(job)] if live(job) else [])]


def _headless(
    job: TrainingJob, name: str, role: str, ports: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, name, lbl.job_labels(job.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": service_selector(job, role),
            "ports": ports,
        },
    }


def service_selector(job: TrainingJob, role: str = lbl.ROLE_RENDEZVOUS) -> dict[str, str]:
    """This job's pod of ``role`` only (the store, the Lighthouse): a namesake's still
    terminating is not its endpoint."""
    selector = {lbl.JOB_NAME: job.name, lbl.ROLE: role}
    if job.uid:
        selector[lbl.JOB_UID] = job.uid
    return selector


def checkpoint_claim(job: TrainingJob) -> dict[str, Any]:
    """The claim the operator creates when the spec names none."""
    ckpt = job.spec.checkpoint
    spec: dict[str, Any] = {
        "accessModes": [ckpt.access_mode],
        "resources": {"requests": {"storage": str(ckpt.size or DEFAULT_CLAIM_SIZE)}},
    }
    if ckpt.storage_class_name:
        spec["storageClassName"] = ckpt.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(job, claim_name(job), lbl.job_labels(job.name)),
        "spec": spec,
    }
