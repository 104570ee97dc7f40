"""Defaults and validation of the TrainingJob pydantic models."""

from pathlib import Path

import pytest
import yaml
from api_cases import BAD_SPECS, BadSpec
from pydantic import ValidationError
from training_jobs import manifest

from torchkube.api import TrainingJob
from torchkube.api.errors import describe
from torchkube.api.spec import BUILTIN_TRAINER_COMMAND, BackoffSpec, FailurePolicySpec
from torchkube.api.trainer import is_llama_family

ROOT = Path(__file__).resolve().parents[2]


def test_minimal_job_gets_documented_defaults() -> None:
    tj = TrainingJob.model_validate(manifest("demo", {}))
    spec = tj.spec
    assert spec.command == BUILTIN_TRAINER_COMMAND
    assert spec.nproc_per_node == "auto"
    assert (spec.replicas.min, spec.replicas.max, spec.replicas.target) == (1, 1, 1)
    assert spec.rendezvous.port == 29400
    assert spec.checkpoint.creates_claim and spec.checkpoint.mount_path == "/checkpoints"
    assert spec.failure_policy.permanent_exit_codes == [2, 3, 126, 127]
    assert spec.run_policy.clean_pod_policy == "Running"
    assert tj.status is None


def test_wire_form_is_camel_case_and_round_trips() -> None:
    body = manifest("demo", {"replicas": {"min": 2, "max": 4}, "nprocPerNode": 8})
    tj = TrainingJob.model_validate(body)
    wire = tj.to_wire()
    assert wire["spec"]["replicas"] == {"min": 2, "max": 4, "spares": 0}
    assert wire["spec"]["nprocPerNode"] == 8
    assert "failurePolicy" in wire["spec"] and "failure_policy" not in wire["spec"]
    assert TrainingJob.model_validate(wire) == tj


def test_desired_replicas_default_to_max() -> None:
    tj = TrainingJob.model_validate(manifest("demo", {"replicas": {"min": 2, "max": 8}}))
    assert tj.spec.replicas.target == 8
    tj = TrainingJob.model_validate(
        manifest("demo", {"replicas": {"min": 2, "max": 8, "desired": 3}})
    )
    assert tj.spec.replicas.target == 3


@pytest.mark.parametrize("case", BAD_SPECS, ids=lambda c: c.id)
def test_bad_spec_is_rejected_naming_field_and_rule(case: BadSpec) -> None:
    with pytest.raises(ValidationError) as raised:
        TrainingJob.model_validate(manifest(case.name, case.spec))
    text = describe(raised.value)
    assert case.field in text, text
    assert case.allowed in text, text


@pytest.mark.parametrize(
    ("codes", "retryable", "code", "permanent"),
    [
        ([2, 3], [], 3, True),
        ([2, 3], [], 1, False),
        ([2, 3], [], 137, False),
        ([], [137, 143], 1, True),
        ([], [137, 143], 143, False),
    ],
)
def test_exit_code_classification(
    codes: list[int], retryable: list[int], code: int, permanent: bool
) -> None:
    policy = FailurePolicySpec(permanent_exit_codes=codes, retryable_exit_codes=retryable)
    assert policy.is_permanent_exit(code) is permanent


def test_backoff_doubles_up_to_its_bound() -> None:
    backoff = BackoffSpec(initial_seconds=5, max_seconds=30)
    assert [backoff.delay(n) for n in range(5)] == [5, 10, 20, 30, 30]
    assert BackoffSpec().delay(7) == 0


def test_describe_names_the_yaml_path() -> None:
    with pytest.raises(ValidationError) as raised:
        TrainingJob.model_validate(manifest("demo", {"resources": {"gpus": -2}}))
    assert describe(raised.value).startswith("spec.resources.gpus: ")


def test_claim_name_may_be_any_valid_object_name_dots_included() -> None:
    job = TrainingJob.model_validate(
        {"metadata": {"name": "demo"}, "spec": {"checkpoint": {"claimName": "team.llm-ckpt.v2"}}}
    )
    assert job.spec.checkpoint.claim_name == "team.llm-ckpt.v2"
    with pytest.raises(ValidationError):
        TrainingJob.model_validate(
            {"metadata": {"name": "demo"}, "spec": {"checkpoint": {"claimName": "Team..x"}}}
        )


@pytest.mark.parametrize(
    ("nproc", "gpus", "tensor"),
    [(8, 8, 8), (8, 8, 2), ("auto", 8, 4), (4, 0, 2), (2, 0, 1), ("auto", 0, 1)],
)
def test_tensor_groups_that_fit_a_pod_are_accepted(
    nproc: int | str, gpus: int, tensor: int
) -> None:
    spec = {
        "nprocPerNode": nproc,
        "resources": {"gpus": gpus},
        "trainer": {"model": "llama-tiny", "strategy": "fsdp", "parallelism": {"tensor": tensor}},
    }
    trainer = TrainingJob.model_validate(manifest("tp", spec)).spec.trainer
    assert trainer.parallelism.tensor == tensor
    assert trainer.activation_checkpointing == "none" and trainer.weights_path is None


def test_hsdp_shard_sizes_are_checked_over_the_elastic_range() -> None:
    """hsdpShardSize 4 with 2 processes per pod: the data size is 2 per pod, so only an even
    number of pods divides; the error names the world sizes that fail."""
    spec = {
        "nprocPerNode": 2,
        "replicas": {"min": 1, "max": 4},
        "trainer": {"strategy": "hsdp", "hsdpShardSize": 4},
    }
    with pytest.raises(ValueError, match=r"fails at world size 2, 6 \(replicas 1, 3\)"):
        TrainingJob.model_validate(manifest("hsdp", spec))
    for accepted in (
        {"replicas": {"min": 2, "max": 2}},  # a fixed size it divides
        {"replicas": {"min": 1, "max": 4}, "trainer": {"strategy": "hsdp", "hsdpShardSize": 2}},
        {"nprocPerNode": "auto", "resources": {"gpus": 0}},  # torchrun decides: the trainer checks
        {"nprocPerNode": "cpu"},
    ):
        TrainingJob.model_validate(manifest("hsdp", {**spec, **accepted}))


def test_the_tensor_parallel_example_is_a_valid_job() -> None:
    body = yaml.safe_load((ROOT / "examples" / "llama-tensor-parallel.yaml").read_text())
    spec = TrainingJob.model_validate(body).spec
    assert spec.trainer.parallelism.tensor == spec.nproc_per_node == spec.resources.gpus == 8
    assert is_llama_family(spec.trainer.model) and spec.trainer.weights_path


def test_recovery_is_restart_unless_live_is_asked_for() -> None:
    assert (
        TrainingJob.model_validate(manifest("demo", {})).spec.failure_policy.recovery == "restart"
    )
    live = TrainingJob.model_validate(manifest("demo", {"failurePolicy": {"recovery": "live"}}))
    assert live.spec.failure_policy.recovery == "live"
    assert live.to_wire()["spec"]["failurePolicy"]["recovery"] == "live"


def test_chaos_hold_steps_travel_through_the_environment_as_written() -> None:
    from torchkube.api.contract import chaos_hold_steps, chaos_hold_steps_value

    assert chaos_hold_steps(chaos_hold_steps_value([70, 140])) == frozenset({70, 140})
    assert chaos_hold_steps("") == frozenset() and chaos_hold_steps(" 5 ,") == frozenset({5})


def test_live_progress_carries_torchfts_share_of_the_step_on_the_wire() -> None:
    """The isolated cost the live-recovery benchmark publishes: the quorum and the commit
    vote over the whole step; the all-reduce is summed apart (DDP has one too)."""
    from torchkube.api.contract import LiveProgress, LiveStepTime, ProgressReport

    timed = LiveStepTime().plus(0.1, 0.004, 0.02, 0.001).plus(0.1, 0.002, 0.02, 0.003)
    assert timed.steps == 2 and timed.torchft_seconds == pytest.approx(0.01)
    assert timed.torchft_share == pytest.approx(0.05)
    assert LiveStepTime().torchft_share is None
    live = LiveProgress(replica_groups=2, grad_accum_steps=1, step_time=timed)
    wire = ProgressReport(step=3, live=live).to_wire()["live"]
    assert wire["stepTime"] == {
        "steps": 2,
        "stepSeconds": 0.2,
        "quorumSeconds": 0.006,
        "allreduceSeconds": 0.04,
        "commitSeconds": 0.004,
    }
    assert ProgressReport.model_validate({"step": 3, "live": wire}).live == live
    older = {"replicaGroups": 2, "gradAccumSteps": 1}  # a trainer from before the field
    assert LiveProgress.model_validate(older).step_time == LiveStepTime()
