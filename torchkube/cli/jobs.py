"""The API calls behind the cluster commands, through the ``kubernetes`` client.

:func:`connect` resolves kubeconfig, context and namespace the way kubectl does (``--kubeconfig``,
else ``$KUBECONFIG``, else ``~/.kube/config``; the namespace from ``-n``, else the context, else
``default``) and checks each step itself, so a wrong path or context name is reported as such
instead of as the client's "Invalid kube-config file". :class:`Jobs` wraps every call in
:func:`~torchkube.cli.errors.translate`, so what reaches the user is one sentence.

Objects come back as plain dicts with the API's field names: the renderers and the tests then
see exactly what ``kubectl get -o json`` shows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api.trainingjob import GROUP, KIND, PLURAL, VERSION
from torchkube.cli.errors import ClientError, Target, parse_status, translate, yaml_problem

REQUEST_TIMEOUT = (10, 60)
"""(connect, read) seconds for every call but a followed log: a dead server fails in seconds."""

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass
class Connection:
    """An API client plus where it points (for messages) and the namespace commands use."""

    api: Any
    target: Target

    @property
    def namespace(self) -> str:
        return self.target.namespace


def kubeconfig_path(explicit: str | None) -> str:
    """``--kubeconfig``, else ``$KUBECONFIG`` (may list several files), else ``~/.kube/config``."""
    return explicit or os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())


def connect(
    kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None
) -> Connection:
    """Load credentials for one context and return a client; any problem is a ClientError."""
    from kubernetes import client, config

    configuration = client.Configuration()
    path = kubeconfig_path(kubeconfig)
    files = [Path(f).expanduser() for f in path.split(os.pathsep) if f]
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if not any(f.is_file() for f in files):
        if in_pod and not kubeconfig and not os.environ.get("KUBECONFIG") and not context:
            # Inside a pod with no kubeconfig: use its service account, as kubectl does.
            config.load_incluster_config(client_configuration=configuration)
            ns = namespace or _in_cluster_namespace()
            target = Target(configuration.host, "in-cluster", ns, "")
            return Connection(client.ApiClient(configuration), target)
        raise ClientError(
            f"kubeconfig {path} does not exist; pass --kubeconfig PATH or set KUBECONFIG "
            "(hack/dev-cluster up prints the path of a local test cluster's)"
        )
    contexts, current = _read_contexts([f for f in files if f.is_file()], path)
    names = [str(c.get("name")) for c in contexts]
    chosen = context or current
    if not chosen:
        raise ClientError(
            f"kubeconfig {path} has no current context; pass --context "
            f"(it has: {', '.join(names) or 'none'})"
        )
    if chosen not in names:
        raise ClientError(
            f'context "{chosen}" is not in kubeconfig {path}; it has: {", ".join(names) or "none"}'
        )
    try:
        config.load_kube_config(
            path, context=chosen, client_configuration=configuration, persist_config=False
        )
    except Exception as error:  # missing cluster/user entries, bad certificate data, ...
        raise ClientError(
            f'cannot use context "{chosen}" of kubeconfig {path}: {_first_line(error)}'
        ) from None
    entry = next(c for c in contexts if c.get("name") == chosen)
    ns = namespace or (entry.get("context") or {}).get("namespace") or "default"
    target = Target(configuration.host, chosen, ns, path)
    return Connection(client.ApiClient(configuration), target)


def _read_contexts(files: list[Path], path: str) -> tuple[list[dict[str, Any]], str | None]:
    """Contexts and current-context of the kubeconfig files, merged as kubectl does.

    Read here rather than through the client, which refuses a file without current-context
    even when ``--context`` names one; the first file to define a name wins.
    """
    import yaml

    contexts: dict[str, dict[str, Any]] = {}
    current: str | None = None
    for file in files:
        try:
            data = yaml.safe_load(file.read_text()) or {}
            if not isinstance(data, dict):
                raise ValueError("not a mapping")
            for entry in data.get("contexts") or []:
                contexts.setdefault(str(entry["name"]), entry)
        except yaml.YAMLError as error:
            problem = f"not valid YAML ({yaml_problem(error)})"
            raise ClientError(f"cannot read kubeconfig {file}: {problem}") from None
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ClientError(f"cannot read kubeconfig {file}: {_first_line(error)}") from None
        current = current or data.get("current-context") or None
    return list(contexts.values()), current


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def _in_cluster_namespace() -> str:
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


class JobExists(ClientError):
    """``submit`` of a name that is taken: say so, never update the running job behind its back.

    Most spec fields are immutable anyway, and a silent update of the rest (replicas, policies)
    would surprise whoever owns the running job.
    """

    def __init__(self, name: str, namespace: str) -> None:
        super().__init__(
            f'TrainingJob "{name}" already exists in namespace "{namespace}"; submit never '
            f"changes a job: delete it first (torchkube delete {name} -n {namespace}) or "
            "choose another metadata.name"
        )


class Jobs:
    """TrainingJobs and their pods and events in the connection's namespace."""

    def __init__(self, connection: Connection) -> None:
        from kubernetes import client

        self.connection = connection
        self.target = connection.target
        self.namespace = connection.namespace
        # Typed as Any: with _preload_content=False the calls return raw urllib3 responses,
        # which the client's annotations do not describe.
        self.custom: Any = client.CustomObjectsApi(connection.api)
        self.core: Any = client.CoreV1Api(connection.api)

    def _job_action(self, verb: str, name: str) -> str:
        return f'{verb} TrainingJob "{name}" in namespace "{self.namespace}"'

    # --- the job itself ------------------------------------------------------------------

    def create(self, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        name = body.get("metadata", {}).get("name") or body.get("metadata", {}).get(
            "generateName", ""
        )
        kwargs: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        from kubernetes.client.exceptions import ApiException

        with translate(self._job_action("create", name), self.target):
            try:
                created: dict[str, Any] = self.custom.create_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    body,
                    _request_timeout=REQUEST_TIMEOUT,
                    **kwargs,
                )
            except ApiException as error:
                if error.status == 409 and parse_status(error.body).get("reason") == (
                    "AlreadyExists"
                ):
                    raise JobExists(name, self.namespace) from None
                raise
        return created

    def get(self, name: str) -> dict[str, Any]:
        with translate(self._job_action("read", name), self.target):
            job: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT
            )
        return job

    def all(self, all_namespaces: bool = False) -> list[dict[str, Any]]:
        where = "in all namespaces" if all_namespaces else f'in namespace "{self.namespace}"'
        with translate(f"list TrainingJobs {where}", self.target):
            if all_namespaces:
                found = self.custom.list_cluster_custom_object(
                    GROUP, VERSION, PLURAL, _request_timeout=REQUEST_TIMEOUT
                )
            else:
                found = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, _request_timeout=REQUEST_TIMEOUT
                )
        items: list[dict[str, Any]] = list(found.get("items") or [])
        items.sort(key=lambda j: (j["metadata"].get("namespace", ""), j["metadata"]["name"]))
        return items

    def dispatched(self, jobs: list[dict[str, Any]]) -> dict[str, str]:
        """The worker cluster each of ``jobs`` that MultiKueue dispatches runs on, by job uid
        (its Workload's ``status.clusterName`` here on the manager); a job not yet sent, or
        Workloads one may not read, give none."""
        from kubernetes.client.exceptions import ApiException

        from torchkube.api.spec import MANAGED_BY_MULTIKUEUE
        from torchkube.operator.workloads import API_GROUP, API_VERSION, JOB_UID_LABEL, PLURAL

        by_namespace: dict[str, list[str]] = {}
        for job in jobs:
            if (job.get("spec") or {}).get("managedBy") == MANAGED_BY_MULTIKUEUE:
                metadata = job["metadata"]
                by_namespace.setdefault(metadata["namespace"], []).append(metadata["uid"])
        clusters: dict[str, str] = {}
        for namespace, uids in sorted(by_namespace.items()):
            try:
                found = self.custom.list_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, PLURAL,
                    label_selector=f"{JOB_UID_LABEL} in ({','.join(sorted(uids))})",
                    _request_timeout=REQUEST_TIMEOUT,
                )  # fmt: skip
            except ApiException as error:
                if error.status in (403, 404):
                    continue
                raise
            for workload in found.get("items") or []:
                cluster = (workload.get("status") or {}).get("clusterName")
                if cluster:
                    clusters[workload["metadata"]["labels"][JOB_UID_LABEL]] = str(cluster)
        return clusters

    def delete(self, name: str) -> None:
        with translate(self._job_action("delete", name), self.target):
            self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                propagation_policy="Background",
                _request_timeout=REQUEST_TIMEOUT,
            )

    def set_suspend(self, name: str, suspend: bool) -> dict[str, Any]:
        """Merge-patch ``spec.runPolicy.suspend``: the one switch Kueue and users both flip."""
        verb = "suspend" if suspend else "resume"
        with translate(self._job_action(verb, name), self.target):
            job: dict[str, Any] = self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                {"spec": {"runPolicy": {"suspend": suspend}}},
                _content_type="application/merge-patch+json",
                _request_timeout=REQUEST_TIMEOUT,
            )
        return job

    def scale(self, name: str, replicas: int) -> dict[str, Any]:
        """Through the scale subresource, so the CRD's CEL bounds decide, as for kubectl scale."""
        action = f'scale TrainingJob "{name}" in namespace "{self.namespace}" to {replicas}'
        with translate(action, self.target):
            scale: dict[str, Any] = self.custom.patch_namespaced_custom_object_scale(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                {"spec": {"replicas": replicas}},
                _content_type="application/merge-patch+json",
                _request_timeout=REQUEST_TIMEOUT,
            )
        return scale

    # --- what belongs to it --------------------------------------------------------------

    def pods(self, name: str) -> list[dict[str, Any]]:
        """Every pod of the job (workers and the rendezvous store), by the job-name label."""
        action = f'list the pods of TrainingJob "{name}" in namespace "{self.namespace}"'
        with translate(action, self.target, resource="pods"):
            response = self.core.list_namespaced_pod(
                self.namespace,
                label_selector=f"{lbl.JOB_NAME}={name}",
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
            items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
        return items

    def node_domains(self, level: str) -> dict[str, str] | None:
        """Each node's domain at topology ``level`` (the nodes that carry the label; one list
        request, whatever the job's size); None when nodes may not be read, as a user
        confined to a namespace often may not."""
        from kubernetes.client.exceptions import ApiException

        with translate(f"list the nodes labelled {level}", self.target, resource="nodes"):
            try:
                response = self.core.list_node(
                    label_selector=level, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
                )
            except ApiException as error:
                if error.status == 403:
                    return None
                raise
            nodes = json.loads(response.data).get("items") or []
        return {n["metadata"]["name"]: n["metadata"]["labels"][level] for n in nodes}

    def events(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Events whose involvedObject is this job (by uid: not a deleted namesake's)."""
        meta = job["metadata"]
        selector = f"involvedObject.kind={KIND},involvedObject.name={meta['name']}"
        if meta.get("uid"):
            selector += f",involvedObject.uid={meta['uid']}"
        action = f'list the events of TrainingJob "{meta["name"]}"'
        with translate(action, self.target, resource="events"):
            response = self.core.list_namespaced_event(
                self.namespace,
                field_selector=selector,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
            items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
        return items

    # --- logs ----------------------------------------------------------------------------

    def _trainer_log(self, pod: str, tail: int | None, **options: Any) -> Any:
        """The raw response of a log request for the trainer container (``container=trainer``:
        sidecars may exist)."""
        if tail is not None:
            options["tail_lines"] = tail
        return self.core.read_namespaced_pod_log(
            pod,
            self.namespace,
            container=lbl.TRAINER_CONTAINER,
            _preload_content=False,
            **options,
        )

    def log(self, pod: str, tail: int | None = None, timestamps: bool = False) -> str:
        """The trainer's log so far."""
        action = f'read the log of pod "{pod}" in namespace "{self.namespace}"'
        with translate(action, self.target, resource="pods"):
            response = self._trainer_log(
                pod, tail, timestamps=timestamps, _request_timeout=REQUEST_TIMEOUT
            )
            text: str = response.data.decode(errors="replace")
        return text

    def probe_logs(self, pods: list[str], tail: int) -> dict[str, str]:
        """The last ``tail`` timestamped lines of several pods at once; unreadable ones are ''.

        Used only to find rank 0, so a pod that cannot answer simply does not win.
        """

        def one(pod: str) -> str:
            try:
                return self.log(pod, tail=tail, timestamps=True)
            except ClientError:
                return ""

        with ThreadPoolExecutor(max_workers=min(16, max(1, len(pods)))) as pool:
            return dict(zip(pods, pool.map(one, pods), strict=True))

    def follow(self, pod: str, tail: int | None = None) -> Iterator[str]:
        """Lines of the trainer's log as they are written, until the container ends.

        No read timeout: a training run can be quiet for minutes between log lines.
        """
        action = f'follow the log of pod "{pod}" in namespace "{self.namespace}"'
        with translate(action, self.target, resource="pods"):
            response = self._trainer_log(pod, tail, follow=True)
        try:
            with translate(action, self.target, resource="pods"):
                pending = b""
                for chunk in response.stream(4096, decode_content=True):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        yield line.decode(errors="replace")
                if pending:
                    yield pending.decode(errors="replace")
        finally:
            response.release_conn()
