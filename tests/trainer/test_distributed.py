"""Process groups and the loop's own collectives, in one process (world size 1, gloo)."""

import pytest
import torch.distributed as dist

from torchkube.trainer.distributed import (
    DistInfo,
    StepAgreement,
    check_tensor_size,
    mean_across_ranks,
)
from torchkube.trainer.loader import ConfigError


def test_a_world_of_one_makes_no_collective_calls(
    info: DistInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-step agreement and the metric averages cost nothing when there is no peer."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a collective call in a world of one")

    monkeypatch.setattr(dist, "all_reduce", refuse)
    agreement = StepAgreement(info.control_group, stop_requested=lambda: False)
    agreement.start(save=True)
    assert agreement.result() == (False, True)
    assert mean_across_ranks([1.5, 2.0], info.control_group) == [1.5, 2.0]


def test_a_world_of_one_stops_after_the_step_the_signal_came_in(info: DistInfo) -> None:
    """With no peer to agree with, a stop requested during a step applies right after it."""
    requested = {"stop": False}
    agreement = StepAgreement(info.control_group, stop_requested=lambda: requested["stop"])
    agreement.start(save=False)
    requested["stop"] = True  # SIGTERM while the step computes
    assert agreement.result() == (True, False)


def test_a_tensor_group_must_fit_in_the_pods_processes() -> None:
    """What torchrun really started is checked too: admission only saw nprocPerNode."""
    check_tensor_size(4, 8)
    check_tensor_size(1, 3)
    with pytest.raises(ConfigError, match=r"parallelism\.tensor \(4\) must divide .* 6\)"):
        check_tensor_size(4, 6)
