"""Turn a pydantic ValidationError into lines a user can act on.

Pydantic's own rendering shows the model class and a documentation URL; a user editing YAML
needs the field path as written in the YAML and what is allowed there.
"""

from pydantic import ValidationError


def describe(error: ValidationError, prefix: str = "") -> str:
    """One line per problem: ``spec.replicas: replicas.min (3) must be ... (3)``."""
    lines = []
    for item in error.errors(include_url=False):
        path = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; fields are camelCase)"
        lines.append(f"{prefix}{path}: {message}" if path else f"{prefix}{message}")
    return "\n".join(lines)
