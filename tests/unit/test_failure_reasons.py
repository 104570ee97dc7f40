"""The failure reasons are one list (torchkube/api/reasons.py), each reason written once in
the list of its kind: the status' enum, the metrics' label values and the failure policy's
free-by-default set all read it, so none can name a reason the others do not know."""

from typing import get_args

import pytest

from torchkube.api.reasons import (
    INFRASTRUCTURE_REASONS,
    CountedReason,
    FailureReason,
    InfrastructureReason,
)
from torchkube.api.spec import FailurePolicySpec
from torchkube.api.status import FailureRecord
from torchkube.operator.metrics import FAILURE_REASONS
from torchkube.policy.failures import Failure

REASONS = get_args(FailureReason)


def test_every_reason_is_of_exactly_one_kind() -> None:
    infrastructure, counted = set(get_args(InfrastructureReason)), set(get_args(CountedReason))
    assert len(REASONS) == len(set(REASONS))
    assert infrastructure.isdisjoint(counted)
    assert infrastructure | counted == set(REASONS)
    assert infrastructure == INFRASTRUCTURE_REASONS


def test_which_reasons_are_free_by_default() -> None:
    """A hang counts: a deadlock in the training code hangs too, and must not loop for ever."""
    assert {
        "NodeLost",
        "Preempted",
        "Evicted",
        "Deleted",
        "RendezvousStoreLost",
        "RendezvousFailed",
        "JoinTimeout",
        "Straggler",
    } == INFRASTRUCTURE_REASONS
    assert set(REASONS) - INFRASTRUCTURE_REASONS == {
        "ExitCode",
        "OOMKilled",
        "InPlaceRestart",
        "Hang",
        "Unknown",
    }


@pytest.mark.parametrize("reason", REASONS)
def test_a_failure_is_free_by_default_exactly_for_an_infrastructure_reason(
    reason: FailureReason,
) -> None:
    found = Failure(reason=reason, message="", pod="w-0")
    assert found.infrastructure == (reason in INFRASTRUCTURE_REASONS)
    assert found.counts(FailurePolicySpec()) == (reason not in INFRASTRUCTURE_REASONS)
    assert found.counts(FailurePolicySpec(count_infrastructure_failures=True))


def test_the_status_and_the_metrics_know_every_reason() -> None:
    schema = FailureRecord.model_json_schema()["properties"]["reason"]
    assert set(schema["enum"]) == set(REASONS)
    assert set(FAILURE_REASONS) == set(REASONS)
