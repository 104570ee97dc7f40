"""Small value types shared by the spec and status models.

Each carries the OpenAPI shape Kubernetes expects for it (int-or-string, free-form objects),
so the CRD generator never has to special-case a field by name.
"""

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PlainValidator, WithJsonSchema

from torchkube.api.base import ApiModel

_QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
QUANTITY_MESSAGE = "must be a Kubernetes quantity such as 500m, 2, 16Gi or 100G"


def _check_quantity(value: str | int) -> str | int:
    if isinstance(value, str) and not _QUANTITY.match(value):
        raise ValueError(f"{value!r} {QUANTITY_MESSAGE}")
    return value


Quantity = Annotated[
    str | int,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "maxLength": 64,
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == int || isQuantity(self)",
                    "message": QUANTITY_MESSAGE,
                }
            ],
        }
    ),
]
"""A Kubernetes resource quantity (``16Gi``, ``500m``, ``4``)."""

FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""A Kubernetes object we pass through untouched (affinity, a toleration, a pod spec patch).

The apiserver validates it again when the operator creates the pod, so repeating the full
upstream schema here would only add a second place to keep in sync.
"""

NPROC_MESSAGE = "nprocPerNode must be a positive integer or one of auto, cpu, gpu"


def _check_nproc(value: object) -> int | str:
    if isinstance(value, bool) or not (
        (isinstance(value, int) and value >= 1) or value in ("auto", "cpu", "gpu")
    ):
        raise ValueError(f"{NPROC_MESSAGE}; got {value!r}")
    return value


NprocPerNode = Annotated[
    int | str,
    PlainValidator(_check_nproc),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == int ? self >= 1 : self in ['auto', 'cpu', 'gpu']",
                    "message": NPROC_MESSAGE,
                }
            ],
        }
    ),
]

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A label key: an optional DNS-subdomain prefix and ``/``, then a name of at most 63 characters."""
"""An RFC 1123 subdomain: what Kubernetes allows as the name of most objects (claims too)."""
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class EnvVar(ApiModel):
    """One environment variable of the worker container, as in a Pod's ``env``."""

    name: str = Field(min_length=1, max_length=253, pattern=ENV_NAME, description="Variable name.")
    value: str | None = Field(
        default=None, max_length=32768, description="Literal value. Use either value or valueFrom."
    )
    value_from: FreeForm | None = Field(
        default=None,
        description="A core/v1 EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...).",
    )


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """A status condition in the shape of metav1.Condition, so kubectl and tools read it."""

    type: str = Field(max_length=316, description="Condition type, e.g. Running or Failed.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, description="One CamelCase word that explains the status.")
    message: str = Field(default="", max_length=32768, description="A sentence for humans.")
    last_transition_time: str = Field(
        description="When the status last changed (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The spec generation this condition describes."
    )
