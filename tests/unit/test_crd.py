"""The generated CRD: structural, complete, and identical to the committed manifests."""

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from torchkube.api import TrainingJob
from torchkube.api.crd import crd, crd_yaml, openapi_schema
from torchkube.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
COMMITTED_COPIES = [
    ROOT / "manifests" / "crd.yaml",
    ROOT / "charts/torchkube/crds/trainingjobs.yaml",
]


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        found += walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += walk(node["additionalProperties"], f"{path}{{}}")
    return found


def test_schema_is_structural() -> None:
    """The apiserver's structural-schema rules, checked without an apiserver."""
    for path, node in walk(openapi_schema()):
        assert "$ref" not in node and "$defs" not in node, path
        assert "title" not in node and "const" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            continue
        assert "anyOf" not in node and "oneOf" not in node and "allOf" not in node, path
        assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, (
            path
        )
        if node["type"] == "object" and "properties" in node:
            assert "additionalProperties" not in node, path
        if node["type"] == "array":
            assert "items" in node, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_every_spec_field_is_described() -> None:
    spec = openapi_schema()["properties"]["spec"]
    missing = [
        path
        for path, node in walk(spec)
        if path and not path.endswith(("[]", "}")) and "description" not in node
    ]
    assert missing == []


def test_defaults_in_schema_match_the_models() -> None:
    """A default the apiserver applies must be the default pydantic applies."""
    spec = openapi_schema()["properties"]["spec"]
    wire = TrainingJob.model_validate({"metadata": {"name": "x"}}).spec.to_wire()
    assert spec["default"] == wire
    for name, node in spec["properties"].items():
        if "default" in node:
            assert wire[name] == node["default"], name


def test_subresources_and_columns() -> None:
    version = crd()["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas.desired"
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:5] == ["Phase", "Workers", "Restarts", "Step", "Remaining"]
    assert columns[-1] == "Age"
    remaining = version["additionalPrinterColumns"][4]
    assert remaining["jsonPath"] == ".status.progress.remaining"
    assert remaining["type"] == "string" and "priority" not in remaining
    assert crd()["spec"]["names"]["shortNames"] == ["tj"]


def test_cel_rules_are_present_for_cross_field_checks() -> None:
    rules = [
        rule["rule"]
        for _, node in walk(openapi_schema())
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert "self.min <= self.max" in rules
    assert any("oldSelf" in rule for rule in rules)
    assert any("metadata.name" in rule for rule in rules)


@pytest.mark.parametrize("copy", COMMITTED_COPIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_crd_is_not_stale(copy: Path) -> None:
    assert copy.read_text() == crd_yaml(), (
        f"{copy} is stale: regenerate it with `torchkube crd > {copy.relative_to(ROOT)}`"
    )


def test_cli_prints_the_crd() -> None:
    result = CliRunner().invoke(main, ["crd"])
    assert result.exit_code == 0
    assert result.output == crd_yaml()


def test_the_trainer_is_immutable_field_by_field_not_as_one_object() -> None:
    """``self == oldSelf`` on the whole trainer compared its fields one by one through the
    schema on every write of the job (status writes included): a rule per field, and one on
    which fields without a default are set, refuse the same changes for less."""
    trainer = openapi_schema()["properties"]["spec"]["properties"]["trainer"]
    own = [rule["rule"] for rule in trainer["x-kubernetes-validations"]]
    assert "self == oldSelf" not in own
    for name, field in trainer["properties"].items():
        rules = [(r["rule"], r["message"]) for r in field.get("x-kubernetes-validations", [])]
        assert any(
            rule == "self == oldSelf" and message.startswith("trainer is immutable")
            for rule, message in rules
        ), name
    optional = {name for name, field in trainer["properties"].items() if "default" not in field}
    assert optional, "the trainer has fields without a default"
    [presence] = [rule for rule in own if "oldSelf" in rule]
    assert presence == " && ".join(
        f"has(self.{name}) == has(oldSelf.{name})"
        for name in trainer["properties"]
        if name in optional
    )
    assert "x-torchkube" not in crd_yaml(), "the generator's marker never reaches the CRD"
