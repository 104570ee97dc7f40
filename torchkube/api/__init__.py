"""The TrainingJob API (``torchkube.io/v1alpha1``): pydantic models, the single source of truth.

The CRD in ``manifests/crd.yaml`` is generated from these models by ``torchkube crd``.
"""

from torchkube.api.spec import (
    CheckpointSpec,
    FailurePolicySpec,
    ReplicasSpec,
    RunPolicySpec,
    SchedulingSpec,
    TrainingJobSpec,
)
from torchkube.api.status import TrainingJobStatus
from torchkube.api.trainingjob import API_VERSION, GROUP, KIND, PLURAL, VERSION, TrainingJob

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "CheckpointSpec",
    "FailurePolicySpec",
    "ReplicasSpec",
    "RunPolicySpec",
    "SchedulingSpec",
    "TrainingJob",
    "TrainingJobSpec",
    "TrainingJobStatus",
]
