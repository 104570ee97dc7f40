"""Bad TrainingJobs, each rejected both by the pydantic models and by the apiserver's CRD schema.

Every case names a fragment of the field path and a fragment of what is allowed; both error
texts must contain both, so the two validation layers cannot drift apart silently.
"""

import copy
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BadSpec:
    id: str
    spec: dict[str, Any]
    field: str
    allowed: str
    name: str = "bad-job"
    extra: dict[str, Any] = field(default_factory=dict)


BAD_SPECS = [
    BadSpec("min-above-max", {"replicas": {"min": 3, "max": 2}}, "replicas", "less than or equal"),
    BadSpec(
        "desired-outside-bounds",
        {"replicas": {"min": 1, "max": 4, "desired": 8}},
        "replicas",
        "must lie between",
    ),
    BadSpec(
        "claim-and-size",
        {"checkpoint": {"claimName": "ckpt", "size": "10Gi"}},
        "checkpoint",
        "not both",
    ),
    BadSpec(
        "no-checkpoint-cadence",
        {"checkpoint": {"intervalSteps": 0}},
        "checkpoint",
        "intervalSeconds",
    ),
    BadSpec(
        "exit-code-both-lists",
        {"failurePolicy": {"permanentExitCodes": [3], "retryableExitCodes": [3, 137]}},
        "failurePolicy",
        "both permanent and retryable",
    ),
    BadSpec(
        "backoff-reversed",
        {"failurePolicy": {"backoff": {"initialSeconds": 60, "maxSeconds": 10}}},
        "backoff",
        "must not exceed",
    ),
    BadSpec(
        "port-clash",
        {"rendezvous": {"port": 9400}, "metrics": {"port": 9400}},
        "spec",
        "must differ",
    ),
    BadSpec("nproc-word", {"nprocPerNode": "many"}, "nprocPerNode", "auto, cpu, gpu"),
    BadSpec("nproc-zero", {"nprocPerNode": 0}, "nprocPerNode", "positive integer"),
    BadSpec("negative-gpus", {"resources": {"gpus": -1}}, "resources.gpus", "0"),
    BadSpec(
        "bad-quantity",
        {"checkpoint": {"size": "ten gigs"}},
        "checkpoint.size",
        "Kubernetes quantity",
    ),
    BadSpec(
        "unknown-clean-policy",
        {"runPolicy": {"cleanPodPolicy": "Sometimes"}},
        "runPolicy.cleanPodPolicy",
        "Running",
    ),
    BadSpec("relative-mount", {"checkpoint": {"mountPath": "ckpt"}}, "checkpoint.mountPath", "^/"),
    BadSpec("bad-env-name", {"env": [{"name": "1BAD", "value": "x"}]}, "env", "name"),
    BadSpec("unknown-field", {"replica": 3}, "replica", "unknown field"),
    BadSpec("rendezvous-port-low", {"rendezvous": {"port": 80}}, "rendezvous.port", "1024"),
    BadSpec("name-too-long", {}, "metadata.name", "at most 40 characters", name="a" + "b" * 45),
    BadSpec("keep-one-checkpoint", {"checkpoint": {"keep": 1}}, "checkpoint.keep", "2"),
    BadSpec(
        "spares-below-max",
        {"replicas": {"min": 1, "max": 4, "desired": 2, "spares": 1}},
        "replicas",
        "spares to 0 before scaling below max",
    ),
    BadSpec(
        "straggler-slowdown-one",
        {"failurePolicy": {"stragglerSlowdown": 1.0}},
        "failurePolicy.stragglerSlowdown",
        "1.1",
    ),
    BadSpec(
        "negative-hang-timeout",
        {"failurePolicy": {"hangTimeoutSeconds": -5}},
        "failurePolicy.hangTimeoutSeconds",
        "0",
    ),
]


def job(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A TrainingJob manifest with the given spec."""
    return {
        "apiVersion": "torchkube.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": copy.deepcopy(spec),
    }
