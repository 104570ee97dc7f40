"""The base every TrainingJob model derives from.

camelCase on the wire, snake_case in Python, through one alias generator; unknown
keys are errors so a typo in a spec fails at ``kubectl apply`` instead of being ignored.
"""

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """A spec model: camelCase aliases, field names accepted too, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        use_attribute_docstrings=False,
    )

    def to_wire(self) -> dict:
        """The object as Kubernetes stores it: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
