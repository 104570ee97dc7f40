"""What a worker is started with: its launcher's command line and its contract environment,
the same for the operator's pods and ``torchkube run``'s workers."""

import json

import pytest
from training_jobs import training_job

from torchkube.api.contract import Env
from torchkube.api.worker_launch import torchrun_args, torchrun_max_restarts, trainer_env


def test_a_fixed_size_job_uses_a_plain_node_count_an_elastic_one_a_range() -> None:
    assert "--nnodes=3" in torchrun_args(training_job(replicas={"min": 3, "max": 3}))
    assert "--nnodes=2:4" in torchrun_args(training_job(replicas={"min": 2, "max": 4}))


def test_torchrun_gives_workers_the_pods_grace_for_their_emergency_checkpoint() -> None:
    """torchrun SIGKILLs its workers 30 s after SIGTERM by default, whatever the pod's grace."""
    job = training_job(checkpoint={"terminationGracePeriodSeconds": 300})
    assert "--shutdown-timeout=298" in torchrun_args(job)


def test_spares_raise_torchruns_restart_budget_for_their_membership_changes() -> None:
    plain = torchrun_max_restarts(training_job(replicas={"min": 2, "max": 4}))
    spared = torchrun_max_restarts(training_job(replicas={"min": 2, "max": 4, "spares": 2}))
    assert spared == plain + 4


def test_loopback_workers_get_the_pods_command_on_their_own_addresses() -> None:
    """``torchkube run`` changes where the store and the worker are, nothing else."""
    job = training_job(replicas={"min": 2, "max": 2})
    pod = torchrun_args(job, index=0)
    local = torchrun_args(job, endpoint="127.0.0.1:5000", local_addr="127.0.0.1", index=0)
    assert "--rdzv-endpoint=rendezvous.demo.ns.svc:29400" in pod
    assert "--local-addr=$(POD_IP)" in pod
    differ = {(a, b) for a, b in zip(pod, local, strict=True) if a != b}
    assert differ == {
        ("--rdzv-endpoint=rendezvous.demo.ns.svc:29400", "--rdzv-endpoint=127.0.0.1:5000"),
        ("--local-addr=$(POD_IP)", "--local-addr=127.0.0.1"),
    }


def test_a_live_recovery_worker_needs_its_slot_for_its_own_rendezvous() -> None:
    job = training_job(failurePolicy={"recovery": "live"})
    with pytest.raises(ValueError, match="slot index"):
        torchrun_args(job)
    assert "--rdzv-id=u1-group-3-x" in torchrun_args(job, index=3, incarnation="x")


def test_the_environment_carries_the_checkpoint_settings_and_the_trainer_spec() -> None:
    job = training_job(
        checkpoint={"intervalSteps": 50, "keep": 2},
        trainer={"steps": 700},
        failurePolicy={"recovery": "live"},
    )
    env = trainer_env(job, 3)
    assert env[Env.REPLICA_INDEX] == "3" and env[Env.JOB_NAMESPACE] == "ns"
    assert (env[Env.CHECKPOINT_INTERVAL_STEPS], env[Env.CHECKPOINT_KEEP]) == ("50", "2")
    assert json.loads(env[Env.TRAINER_CONFIG])["steps"] == 700
    assert env[Env.LIGHTHOUSE] == "http://demo-lighthouse.ns.svc:29401"
    assert Env.LIGHTHOUSE not in trainer_env(training_job(), 0)
