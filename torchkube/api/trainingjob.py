"""The TrainingJob resource as a whole: identity, spec and status."""

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from torchkube.api.base import ApiModel
from torchkube.api.spec import TrainingJobSpec
from torchkube.api.status import TrainingJobStatus

GROUP = "torchkube.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
SHORT_NAMES = ["tj"]
CATEGORIES = ["torchkube"]

MAX_NAME_LENGTH = 40
"""Pod, Service and hostname labels are derived from the job name and must stay ≤ 63 chars."""
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_RULE = (
    f"self.metadata.name.matches('{NAME_PATTERN}') && size(self.metadata.name) <= {MAX_NAME_LENGTH}"
)
NAME_MESSAGE = (
    f"metadata.name must be at most {MAX_NAME_LENGTH} characters of lower-case letters, digits "
    "and '-', starting with a letter (it names the job's Service and pod hostnames)"
)


class TrainingJob(ApiModel):
    """A distributed PyTorch training run that torchkube keeps alive until it finishes."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": NAME_RULE, "message": NAME_MESSAGE}]
        }
    )

    api_version: Literal["torchkube.io/v1alpha1"] = Field(
        default="torchkube.io/v1alpha1", description="torchkube.io/v1alpha1"
    )
    kind: Literal["TrainingJob"] = Field(default="TrainingJob", description="TrainingJob")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: TrainingJobSpec = Field(
        default_factory=TrainingJobSpec,
        description="What to train and how.",
    )
    status: TrainingJobStatus | None = Field(default=None, description="What the operator saw.")

    @field_validator("metadata")
    @classmethod
    def _name(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        name = metadata.get("name")
        if name is not None and (not re.match(NAME_PATTERN, name) or len(name) > MAX_NAME_LENGTH):
            raise ValueError(f"{NAME_MESSAGE}; got {name!r}")
        return metadata

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))

    @property
    def uid(self) -> str:
        return str(self.metadata.get("uid", ""))
