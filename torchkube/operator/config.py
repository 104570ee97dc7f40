"""Operator settings: one typed place, read from TORCHKUBE_* environment variables.

The Helm chart and ``torchkube operator`` flags set these; nothing else in the operator reads
the environment.
"""

import os
import re

from pydantic import Field, field_validator

from torchkube.api.base import ApiModel
from torchkube.api.types import DNS_LABEL

ENV_PREFIX = "TORCHKUBE_"


class OperatorSettings(ApiModel):
    """How the operator runs (not what a job wants: that is the TrainingJob spec)."""

    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to watch; empty means the whole cluster.",
    )
    workers: int = Field(default=8, ge=1, le=256, description="Jobs reconciled at the same time.")
    api_concurrency: int = Field(
        default=16,
        ge=1,
        le=512,
        description="Parallel API requests when creating or deleting many pods at once.",
    )
    """Sixteen send creates as fast as an API server answers them (bench.operator_cost: its
    pooled creates per second); every thread beyond that only waits for the GIL beside the
    others, and a pod's create costs the operator more CPU the more threads wait (the same
    record's CPU per create from 16 and from 32 threads) — CPU the scheduler and the nodes
    need while a large job starts."""
    resync_seconds: float = Field(
        default=30, gt=0, description="Every job is reconciled at least this often."
    )
    progress_url: str = Field(
        default="http://{pod_ip}:{port}/progress",
        description="Where the trainer's progress is read; {pod_ip}, {port}, {namespace} and "
        "{pod} are filled in. Empty turns progress polling off.",
    )
    progress_interval_seconds: float = Field(
        default=10, gt=0, description="How often a running job's progress is read."
    )
    metrics_port: int = Field(
        default=8080, ge=0, le=65535, description="Prometheus metrics port (0 = off)."
    )
    health_port: int = Field(
        default=8081, ge=0, le=65535, description="Liveness endpoint port (0 = off)."
    )
    leader_election: bool = Field(
        default=False,
        description="Run several replicas with exactly one acting: the holder of a Lease.",
    )
    leader_election_namespace: str = Field(
        default="",
        description="Namespace of the Lease; empty means the operator pod's own namespace.",
    )
    leader_election_name: str = Field(
        default="torchkube-operator", description="Name of the Lease."
    )
    kueue_enabled: bool = Field(
        default=True,
        description="Admit jobs labelled kueue.x-k8s.io/queue-name through Kueue Workloads "
        "(docs/queueing.md). Off, the operator neither watches nor reads Workloads (the chart "
        "then grants it none) and runs such a job at once, with a warning that its label is "
        "ignored.",
    )

    @field_validator("namespaces")
    @classmethod
    def _namespace_names(cls, names: list[str]) -> list[str]:
        """Names, each once: the pod watch and the chart's Roles are per namespace, so a
        pattern (``team-*``) would watch nothing and keep every job waiting."""
        bad = [name for name in names if not re.fullmatch(DNS_LABEL, name) or len(name) > 63]
        if bad:
            raise ValueError(f"namespaces must be namespace names, not patterns: {bad}")
        return list(dict.fromkeys(names))

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "OperatorSettings":
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name, info in cls.model_fields.items():
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None:
                continue
            if info.annotation == list[str]:
                values[name] = [part for part in raw.split(",") if part]
            else:
                values[name] = raw
        return cls.model_validate(values)
