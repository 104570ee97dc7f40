"""Read and check TrainingJob YAML before anything is sent to a cluster.

The pydantic models are the API's source of truth (the CRD is generated from them), so a spec
they reject would be refused by the apiserver too -- but the apiserver says it one rule at a
time and silently drops unknown fields (CRD pruning), where the models name every problem at
once, typos included. What is sent is the user's document as written, not the models' dump:
defaults stay the cluster's to apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from torchkube.cli.errors import ClientError, yaml_problem

INVALID = 2
"""Exit code for input that is wrong before any cluster is involved (click's usage code)."""


@dataclass
class Manifest:
    """One TrainingJob document and where it came from, checked and ready to create."""

    body: dict[str, Any]
    source: str

    @property
    def name(self) -> str:
        meta = self.body["metadata"]
        return str(meta.get("name") or meta.get("generateName", ""))

    @property
    def namespace(self) -> str | None:
        value = self.body["metadata"].get("namespace")
        return str(value) if value else None


def load(text: str, source: str) -> list[Manifest]:
    """Every document of a YAML stream, each validated; raises ClientError (exit 2) if any fails.

    All documents are checked before any is created, so a typo in the third job of a file does
    not leave the first two running.
    """
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise ClientError(
            f"{source} is not valid YAML ({yaml_problem(error)})", exit_code=INVALID
        ) from None
    if not documents:
        raise ClientError(f"{source} holds no TrainingJob", exit_code=INVALID)
    problems: list[str] = []
    manifests = []
    for index, document in enumerate(documents):
        label = source if len(documents) == 1 else f"{source}[{index}]"
        found = check(document, label)
        problems += found
        if not found:
            body = dict(document)
            body.pop("status", None)  # status belongs to the operator
            manifests.append(Manifest(body, label))
    if problems:
        count = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
        raise ClientError(
            f"{source} is not a valid TrainingJob ({count} above); nothing was submitted",
            exit_code=INVALID,
            details=tuple(problems),
        )
    return manifests


def check(document: Any, label: str) -> list[str]:
    """The problems of one document, each ``LABEL: field.path: what is wrong``."""
    from pydantic import ValidationError

    from torchkube.api.errors import describe
    from torchkube.api.trainingjob import TrainingJob

    if not isinstance(document, dict):
        return [f"{label}: expected a TrainingJob (a mapping), got {type(document).__name__}"]
    problems = []
    try:
        TrainingJob.model_validate(document)
    except ValidationError as error:
        problems += describe(error, prefix=f"{label}: ").splitlines()
    meta = document.get("metadata")
    unnamed = isinstance(meta, dict) and not (meta.get("name") or meta.get("generateName"))
    if meta is None or unnamed:
        problems.append(f"{label}: metadata.name: required (it names the job, its pods and claim)")
    if "apiVersion" not in document or "kind" not in document:
        problems.append(
            f"{label}: apiVersion and kind are required (torchkube.io/v1alpha1, TrainingJob)"
        )
    return problems
