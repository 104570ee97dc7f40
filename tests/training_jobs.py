"""TrainingJobs for tests: the one builder of a manifest and of its validated model, so the
shape of a job (and a field the API starts to require) is written here once. Jobs created in
a real cluster add their KWOK placement on top (``kube_jobs.job_manifest``)."""

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from torchkube.api import API_VERSION, KIND, TrainingJob, TrainingJobStatus
from torchkube.api.times import format_time

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
"""The tests' clock: a job made by :func:`training_job` was created five minutes before."""


def manifest(
    name: str = "demo",
    spec: dict[str, Any] | None = None,
    *,
    namespace: str | None = None,
    uid: str | None = None,
    created: datetime | None = None,
    generation: int | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A TrainingJob manifest; metadata fields left out are left out of it too, as in a
    manifest a user applies."""
    given = {"namespace": namespace, "uid": uid, "generation": generation}
    metadata: dict[str, Any] = {"name": name, **{k: v for k, v in given.items() if v is not None}}
    if created is not None:
        metadata["creationTimestamp"] = format_time(created)
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": copy.deepcopy(spec or {}),
    }
    if status is not None:
        body["status"] = status
    return body


def training_job(
    status: TrainingJobStatus | dict[str, Any] | None = None,
    *,
    name: str = "demo",
    namespace: str = "ns",
    uid: str = "u1",
    created: datetime = NOW - timedelta(minutes=5),
    **spec: Any,
) -> TrainingJob:
    """A validated job as the operator gets it from the API server (namespace, uid, creation
    time, generation 1), with ``spec`` over the defaults and ``status`` as stored."""
    if isinstance(status, TrainingJobStatus):
        status = status.to_wire()
    body = manifest(
        name, spec, namespace=namespace, uid=uid, created=created, generation=1, status=status
    )
    return TrainingJob.model_validate(body)
