"""The operator's settings as read from its environment (the chart and flags set them)."""

import pytest
from pydantic import ValidationError

from torchkube.operator.config import OperatorSettings


def test_namespaces_are_read_as_a_comma_list_each_once() -> None:
    settings = OperatorSettings.from_env({"TORCHKUBE_NAMESPACES": "team-a,team-b,,team-a"})
    assert settings.namespaces == ["team-a", "team-b"]
    assert OperatorSettings.from_env({}).namespaces == [], "empty: the whole cluster"


@pytest.mark.parametrize("pattern", ["team-*", "!kube-system", "Team-A", "a" * 64])
def test_a_namespace_pattern_is_refused_with_the_reason(pattern: str) -> None:
    with pytest.raises(ValidationError, match="namespace names, not patterns"):
        OperatorSettings.from_env({"TORCHKUBE_NAMESPACES": f"team-a,{pattern}"})


def test_the_kueue_integration_is_on_unless_the_chart_turns_it_off() -> None:
    assert OperatorSettings.from_env({}).kueue_enabled is True
    assert OperatorSettings.from_env({"TORCHKUBE_KUEUE_ENABLED": "false"}).kueue_enabled is False
    with pytest.raises(ValidationError, match="kueue_enabled"):
        OperatorSettings.from_env({"TORCHKUBE_KUEUE_ENABLED": "maybe"})
